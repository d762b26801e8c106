"""Identifiers in tables break between their words, never inside one.

A table cell holding ``heuristic_epsilon`` or ``opacus_lastiterate.analysis.run`` is narrow at
1280 px. Browsers find no line-break opportunity after an underscore or a dot, so the only
ways to fit such a name were to let it break anywhere (``heuristic_epsilo`` / ``n``) or to
widen the table past its column. This extension adds a ``<wbr>`` (a break opportunity that
adds no character when copied) after each underscore, dot and slash that sits between two
word characters of inline code inside a table; ``docs/_static/custom.css`` then lets inline
code in tables wrap only at such opportunities.
"""

from __future__ import annotations

import re
from typing import Any

from sphinx.application import Sphinx

TABLE = re.compile(r"<table\b.*?</table>", re.DOTALL)
CODE = re.compile(r'(<code class="[^"]*\bliteral\b[^"]*">)(.*?)(</code>)', re.DOTALL)
TAG = re.compile(r"(<[^>]+>)")
BREAK_AFTER = re.compile(r"(?<=\w)([_./])(?=\w)")


def _break_text(html: str) -> str:
    """``html`` with ``<wbr>`` after each separator of its text (not inside its tags)."""
    parts = TAG.split(html)
    return "".join(
        part if part.startswith("<") else BREAK_AFTER.sub(r"\1<wbr>", part) for part in parts
    )


def _break_code(table: re.Match[str]) -> str:
    return CODE.sub(lambda m: m.group(1) + _break_text(m.group(2)) + m.group(3), table.group(0))


def break_identifiers(body: str) -> str:
    """``body`` (a page's HTML) with break opportunities in the inline code of its tables."""
    return TABLE.sub(_break_code, body)


def _page_context(
    app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any
) -> None:
    if "body" in context:
        context["body"] = break_identifiers(context["body"])


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("html-page-context", _page_context)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
