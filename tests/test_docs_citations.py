"""The repository cites only what it ships.

Every reference to a Markdown file in a tracked text file must name a file of the repository
(resolved from the repository root, from ``docs/`` or from the citing file's folder), every
citation of a section of a ``docs/`` page (a page name followed by a quoted heading) must
name a heading of that page, and nothing may point into the notes and papers that live
outside the repository.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Built from parts so that this file does not contain the strings it forbids.
FORBIDDEN = tuple("shared" + "/" + part for part in ("reference", "papers"))

# A path-like token ending in ".md" (not part of a longer word such as ".mdx").
MD_REFERENCE = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]*\w\.md)\b(?![\w-])")
# A docs page (with or without "docs/", in double backquotes or not), a comma and a heading
# in double (or single) quotes, optionally preceded by the word "section".
SECTION_CITATION = re.compile(
    r"(?<![\w/.-])((?:docs/)?[\w-]+\.md)`{0,2}\)?,?\s*\(?(?:section\s+)?([\"'])([^\"'`\n]+(?:\n[^\"'`\n]+)?)\2"
)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


@lru_cache(maxsize=1)
def repository_files() -> tuple[str, ...]:
    """Tracked files and untracked files git does not ignore (what the checkout ships)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listed = _git("ls-files", "--cached", "--others", "--exclude-standard").splitlines()
    return tuple(sorted(p for p in set(listed) if (ROOT / p).is_file()))


@lru_cache(maxsize=1)
def text_files() -> dict[str, str]:
    out = {}
    for rel in repository_files():
        try:
            out[rel] = (ROOT / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files cite nothing
    return out


def _resolve(reference: str, citing: str) -> str | None:
    """The repository path a reference names, or None if it names no shipped file."""
    shipped = set(repository_files())
    folder = PurePosixPath(citing).parent
    for base in (PurePosixPath(), PurePosixPath("docs"), folder):
        parts: list[str] = []
        for part in (base / reference).parts:
            if part == "..":
                if not parts:
                    break
                parts.pop()
            elif part != ".":
                parts.append(part)
        else:
            candidate = "/".join(parts)
            if candidate in shipped:
                return candidate
    return None


def _headings(page: str) -> set[str]:
    text = text_files().get(page, "")
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)  # no code blocks
    return {" ".join(h.split()) for h in HEADING.findall(text)}


def _line(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def test_every_cited_markdown_file_is_shipped() -> None:
    missing = []
    for rel, text in text_files().items():
        for match in MD_REFERENCE.finditer(text):
            start = text.rfind(" ", 0, match.start()) + 1
            if "://" in text[start : match.end()]:
                continue  # a URL, not a file of this repository
            if _resolve(match.group(1), rel) is None:
                missing.append(f"{rel}:{_line(text, match.start())}: {match.group(1)}")
    assert not missing, "references to files the repository does not ship:\n" + "\n".join(
        missing
    )


def test_every_cited_docs_section_exists() -> None:
    missing = []
    cited = 0
    for rel, text in text_files().items():
        for match in SECTION_CITATION.finditer(text):
            page = _resolve(match.group(1), rel)
            if page is None or not page.startswith("docs/"):
                continue  # missing files are reported above; other pages have no sections
            heading = " ".join(match.group(3).split())
            cited += 1
            if heading not in _headings(page):
                missing.append(f'{rel}:{_line(text, match.start())}: {page}, "{heading}"')
    assert cited > 0  # the pattern still matches the package's citation style
    assert not missing, "citations of sections that do not exist:\n" + "\n".join(missing)


def test_nothing_points_outside_the_repository() -> None:
    found = [
        f"{rel}:{_line(text, text.find(bad))}: {bad}"
        for rel, text in text_files().items()
        for bad in FORBIDDEN
        if bad in text
    ]
    assert not found, "mentions of material outside the repository:\n" + "\n".join(found)


def test_docs_pages_named_by_the_package_exist() -> None:
    for page in ("last_iterate", "run_description", "normalisation", "auditing"):
        assert f"docs/{page}.md" in repository_files()
    assert "run_description" in text_files()["docs/index.md"]
