"""Sphinx configuration: ``make docs`` (``sphinx-build -W --keep-going docs docs/_build/html``).

Needs the ``docs`` extra and the package's own dependencies (the API reference imports every
public module, the Lightning and Hugging Face adapters included): ``make docs`` uses the
development environment. ``docs/_ext/public_api.py`` generates the API reference from the
package's ``__all__`` lists.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent))  # document this checkout, whatever is installed

project = "opacus-lastiterate"
author = "opacus-lastiterate developers"
extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "mathml",  # docs/_ext/mathml.py: maths as MathML at build time, no CDN (works offline)
    "link_titles",  # docs/_ext/link_titles.py: a link whose text is a file name shows the title
    "public_api",
    "identifier_breaks",  # docs/_ext/identifier_breaks.py: names in tables break between words
]
html_math_renderer = "mathml"
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3

autodoc_typehints = "description"
autodoc_member_order = "bysource"
autodoc_preserve_defaults = True
add_module_names = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "sphinx_rtd_theme"
html_title = "opacus-lastiterate"
html_static_path = ["_static"]
html_css_files = ["custom.css"]  # tables and code wrap or scroll inside their column
napoleon_use_ivar = True  # "Attributes:" as fields, not objects that duplicate properties
