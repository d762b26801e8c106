"""The documentation site in a real browser at 1280 px: nothing clipped, screenshots kept.

    python scripts/check_docs_layout.py [--no-build] [--html docs/_build/html]
        [--screenshots docs/results/screenshots] [--chromium /usr/bin/chromium]

(``make docs-layout``.) Builds the site (``sphinx-build -W``), serves it on localhost, opens
every page in headless Chromium (Playwright driving the system's ``chromium``: Debian's
``apt-get install -y chromium``; the ``layout`` extra installs Playwright) with a 1280 x 900
window and fails when inline code in a table is broken inside a word (``heuristic_epsilo`` /
``n``; names break after an underscore, a dot or a slash), when a table, a table cell, a code block or a displayed formula is clipped:
its content is wider than its box (``scrollWidth > clientWidth``) and the box does not scroll
(``overflow-x`` neither ``auto`` nor ``scroll``; a table must wrap, even in the theme's
scrolling table box, whose scroll bar sits below the table's far end), or it reaches past
the right edge of the content column. It also fails when a page still loads maths from a CDN, shows raw LaTeX, or shows a
Markdown file name (a page's name ending in .md) as the text of a link.
Screenshots (viewport PNGs) of the index, the callbacks page and two gallery plots go to
``--screenshots``; look at them.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import shutil
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WIDTH, HEIGHT = 1280, 900
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"]
# (file name, page, CSS selector scrolled into view first, or None for the top of the page)
SCREENSHOTS = [
    ("index.png", "index.html", None),
    ("callbacks.png", "callbacks.html", None),
    ("callbacks-fields.png", "callbacks.html", "table.docutils"),
    ("gallery-figure1.png", "gallery.html", "img[src*='last-iterate-fig1']"),
    ("gallery-figure3.png", "gallery.html", "img[src*='last-iterate-fig3']"),
]

# Every box that must wrap or scroll: clipped when its content is wider than it and it does
# not scroll, or when it reaches past the content column.
CLIPPED_JS = """
() => {
  const column = document.querySelector('.wy-nav-content') || document.body;
  const right = column.getBoundingClientRect().right;
  const found = [];
  // a table in the theme's box is judged by its box (one line per table)
  const boxes = document.querySelectorAll(
    '.rst-content .wy-table-responsive, .rst-content table:not(.wy-table-responsive table), '
    + '.rst-content pre, .rst-content div.highlight, .rst-content div.math-display, '
    + '.rst-content img');
  for (const el of boxes) {
    if (el.closest('div.highlight, div.math-display') &&
        !el.matches('div.highlight, div.math-display')) {
      // inside a code or formula box that scrolls: only that box must stay in the column
      const box = el.closest('div.highlight, div.math-display');
      const style = getComputedStyle(box).overflowX;
      if (style === 'auto' || style === 'scroll') continue;
    }
    const style = getComputedStyle(el).overflowX;
    // code and formulas may scroll sideways; a table must wrap (the theme's scrolling table
    // box hides its right-hand columns, with the scroll bar at the table's far end)
    const isTable = el.matches('.wy-table-responsive, table, td, th');
    const scrolls = !isTable && (style === 'auto' || style === 'scroll');
    const rect = el.getBoundingClientRect();
    const tooWide = el.scrollWidth > el.clientWidth + 1 && !scrolls && el.tagName !== 'IMG';
    const pastColumn = rect.width > 0 && rect.right > right + 1;
    if (tooWide || pastColumn) {
      found.push({tag: el.tagName.toLowerCase(), cls: el.className,
                  text: (el.innerText || el.getAttribute('src') || '').slice(0, 70),
                  scrollWidth: el.scrollWidth, clientWidth: el.clientWidth,
                  right: Math.round(rect.right), column: Math.round(right),
                  why: tooWide ? (isTable ? 'table wider than its column (it must wrap)'
                                          : 'content wider than its box, which does not scroll')
                               : 'reaches past the content column'});
    }
  }
  return found;
}
"""
# Inline code in a table broken inside a word (``heuristic_epsilo`` / ``n``): a run of
# letters and digits of one text node whose characters lie on more than one line.
MID_WORD_JS = """
() => {
  const found = [];
  for (const code of document.querySelectorAll('.rst-content table code.literal')) {
    const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const m of node.data.matchAll(/[A-Za-z0-9]{2,}/g)) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const tops = new Set([...range.getClientRects()].filter(r => r.width > 0)
                             .map(r => Math.round(r.top)));
        if (tops.size > 1) found.push(code.innerText.slice(0, 70));
      }
    }
  }
  return [...new Set(found)];
}
"""
RAW_LATEX_JS = """
() => {
  const text = document.querySelector('.rst-content')?.innerText || '';
  const scripts = [...document.scripts].map(s => s.src).filter(s => /mathjax|cdn\\./i.test(s));
  const raw = (text.match(/\\\\(?:varepsilon|delta|frac|sum|mathcal|sigma)\\b/g) || []).length;
  const files = [...document.querySelectorAll('.rst-content a')]
    .map(a => a.innerText.trim()).filter(t => /^[\\w./-]+\\.md(#[\\w-]*)?$/.test(t));
  return {cdn: scripts, raw_latex: raw, file_links: files};
}
"""


def build(html: Path) -> bool:
    """``make docs``'s build; False (its warnings printed) when it fails."""
    done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going",
                           "-q", str(ROOT / "docs"), str(html)])
    return done.returncode == 0


def serve(html: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_QuietHandler, directory=str(html))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def _shrink(path: Path) -> None:
    """A palette PNG (256 colours, a third of the size; text stays sharp) when Pillow is
    there, as the screenshots are committed."""
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--html", type=Path, default=ROOT / "docs" / "_build" / "html")
    parser.add_argument("--no-build", action="store_true", help="check the site already built")
    parser.add_argument("--screenshots", type=Path,
                        default=ROOT / "docs" / "results" / "screenshots")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium",
                        help="the browser executable (Debian: apt-get install -y chromium)")
    args = parser.parse_args(argv)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("check_docs_layout: needs Playwright: pip install 'opacus-lastiterate[layout]' "
              "(and Chromium: apt-get install -y chromium)", file=sys.stderr)
        return 2
    if not Path(args.chromium).exists():
        print(f"check_docs_layout: no Chromium at {args.chromium} "
              "(apt-get install -y chromium, or pass --chromium)", file=sys.stderr)
        return 2
    if not args.no_build and not build(args.html):
        print("check_docs_layout: the site does not build (warnings above)", file=sys.stderr)
        return 1
    pages = sorted(p.relative_to(args.html).as_posix() for p in args.html.glob("*.html")
                   if p.name not in ("genindex.html", "search.html", "py-modindex.html"))
    pages += sorted(p.relative_to(args.html).as_posix()
                    for p in (args.html / "api").glob("*.html"))
    args.screenshots.mkdir(parents=True, exist_ok=True)
    server, base = serve(args.html)
    problems: list[str] = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=args.chromium, args=CHROMIUM_FLAGS)
            page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
            for name in pages:
                page.goto(base + name, wait_until="load")
                for box in page.evaluate(CLIPPED_JS):
                    problems.append(f"{name}: <{box['tag']} class='{box['cls']}'> {box['why']} "
                                    f"(scrollWidth {box['scrollWidth']} > clientWidth "
                                    f"{box['clientWidth']}, right {box['right']} / column "
                                    f"{box['column']}): {box['text']!r}")
                for text in page.evaluate(MID_WORD_JS):
                    problems.append(f"{name}: inline code in a table broken inside a word: "
                                    f"{text!r}")
                maths = page.evaluate(RAW_LATEX_JS)
                if maths["cdn"]:
                    problems.append(f"{name}: loads scripts from a CDN: {maths['cdn']}")
                if maths["raw_latex"]:
                    problems.append(f"{name}: {maths['raw_latex']} raw LaTeX commands shown")
                if maths["file_links"]:
                    problems.append(f"{name}: links show file names, not titles: "
                                    f"{maths['file_links'][:5]}")
            for file_name, name, selector in SCREENSHOTS:
                page.goto(base + name, wait_until="load")
                if selector is not None:
                    target = page.locator(selector).first
                    target.scroll_into_view_if_needed()
                    page.evaluate("(y) => window.scrollBy(0, y)", -60)
                page.screenshot(path=str(args.screenshots / file_name))
                _shrink(args.screenshots / file_name)
            browser.close()
    finally:
        server.shutdown()
    print(f"check_docs_layout: {len(pages)} pages at {WIDTH} px, screenshots in "
          f"{args.screenshots}")
    for line in problems:
        print("  " + line)
    if problems:
        print(f"check_docs_layout: FAILED, {len(problems)} problems")
        return 1
    print("check_docs_layout: OK (no clipped table, cell, code block or formula; no name "
          "broken inside a word; no CDN; no raw LaTeX; no file name as a link text)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
