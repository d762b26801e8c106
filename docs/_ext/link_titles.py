"""Links show titles, not file names (issue 26).

A Markdown link written as ``[sharp_edges.md](sharp_edges.md)`` (or with the text
``docs/sharp_edges.md``, as the README writes it for GitHub) shows the file name on the
site. After references are resolved, this extension gives every link whose whole text is the
file name of a page of the site that page's title: "Sharp edges: what the heuristic does not
promise". A link with text of its own is left alone.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx

FILE_NAME = re.compile(r"(?:\.{0,2}/)*(?:docs/)?(?P<path>[\w./-]+?)\.md(?:#[\w-]*)?")


def _retitle(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    titles = app.env.titles
    for ref in list(doctree.findall(nodes.reference)):
        match = FILE_NAME.fullmatch(ref.astext().strip())
        if match is None:
            continue
        path = match.group("path")
        here = posixpath.dirname(docname)
        for candidate in (posixpath.normpath(posixpath.join(here, path)), path):
            if candidate in titles:
                ref.children = [nodes.Text(titles[candidate].astext())]
                break


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("doctree-resolved", _retitle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
