"""Sphinx configuration: ``sphinx-build docs docs/_build`` (needs the ``docs`` extra)."""

project = "opacus-lastiterate"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
master_doc = "index"
exclude_patterns = ["_build"]
autodoc_typehints = "description"
html_theme = "sphinx_rtd_theme"
