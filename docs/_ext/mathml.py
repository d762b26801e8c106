"""Maths as MathML, rendered by the browser: the site needs no network (issue 26).

Sphinx's default HTML maths loads MathJax from a CDN, so offline the pages showed raw LaTeX.
This extension registers the HTML maths renderer ``"mathml"`` (``html_math_renderer`` in
``conf.py``): every ``$...$`` and ``$$...$$`` of the Markdown pages (MyST ``dollarmath``) and
every ``:math:`` of the docstrings is converted at build time by ``latex2mathml`` (pure
Python, the ``docs`` extra) into MathML Core, which current browsers draw natively. A
formula ``latex2mathml`` cannot convert is a build warning (an error under ``make docs``),
never raw LaTeX on the page.
"""

from __future__ import annotations

import html
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)


def _mathml(latex: str, display: str, node: nodes.Node) -> str:
    from latex2mathml.converter import convert

    try:
        return convert(latex.strip(), display=display)
    except Exception as err:  # any failure of the converter is a warning
        logger.warning("cannot convert this formula to MathML (%s): %s", err, latex,
                       location=node)
        return f'<code class="math-source">{html.escape(latex)}</code>'


def visit_math(self: Any, node: nodes.Node) -> None:
    self.body.append(f'<span class="math">{_mathml(node.astext(), "inline", node)}</span>')
    raise nodes.SkipNode


def visit_displaymath(self: Any, node: nodes.Node) -> None:
    rendered = _mathml(node.astext(), "block", node)
    self.body.append(f'<div class="math-display">{rendered}</div>\n')
    raise nodes.SkipNode


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_html_math_renderer("mathml", (visit_math, None), (visit_displaymath, None))
    return {"parallel_read_safe": True, "parallel_write_safe": True}
