"""The code blocks of the Markdown pages (README.md, docs/) and how to run them.

The conventions are documented for authors in ``docs/contributing_docs.md``:

* ```` ```python ```` blocks of one page run in order in one namespace, in a temporary
  working directory; a block that starts with ``>>>`` is a doctest (its output is checked).
* ```` ```console ```` blocks: ``$ `` starts a command (``\\`` continues it), the lines up to
  the next ``$ `` are its output, compared with doctest's ``ELLIPSIS`` and
  ``NORMALIZE_WHITESPACE`` (``...`` stands for any text). ```` ```bash ```` / ```` ```sh ````
  blocks are commands without output.
* ``opacus-lastiterate ARGS`` (also ``.venv/bin/opacus-lastiterate`` and
  ``python -m opacus_lastiterate``) runs as ``python -m opacus_lastiterate ARGS``; ``make
  TARGET`` must name a target of the Makefile and ``python SCRIPT.py`` an existing file (both
  run in CI themselves); set-up commands (``pip``, ``cd``, ``source``, ``git``, ...) are not
  run. Anything else needs a marker.
* Markers, an HTML comment on the line(s) before the block:
  ``<!-- skip-snippet: reason -->`` (never run), ``<!-- slow-snippet: reason -->`` (run
  only by the ``slow`` test) and ``<!-- snippet-output -->`` (the block shows what the
  Python block before it prints; compared like console output).
"""

from __future__ import annotations

import doctest
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[2]

PYTHON = frozenset({"python", "py", "python3", "pycon"})
PROMPT_SHELL = frozenset({"console", "shell-session"})
SCRIPT_SHELL = frozenset({"bash", "sh", "shell", "zsh"})
SETUP_COMMANDS = frozenset({"cd", "source", ".", "export", "pip", "pip3", "git", "conda", "uv"})
MARKER = re.compile(r"^\s*<!--\s*(skip-snippet|slow-snippet|snippet-output)\s*:?(.*?)-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
OUTPUT_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
CLI_TIMEOUT = 300.0


def pages() -> list[str]:
    """README.md and every Markdown page under docs/ (repository-relative, sorted)."""
    found = ["README.md"] if (ROOT / "README.md").exists() else []
    for path in sorted((ROOT / "docs").rglob("*.md")):
        rel = path.relative_to(ROOT).as_posix()
        if not any(part.startswith("_") for part in PurePosixPath(rel).parts):
            found.append(rel)
    return found


@dataclass(frozen=True)
class Block:
    """One fenced code block."""

    path: str  # repository-relative
    line: int  # 1-based line of the first line of code
    language: str  # first word of the info string, lower case ("" if none)
    code: str
    marker: str | None = None  # "skip-snippet", "slow-snippet" or "snippet-output"
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def skipped(self) -> bool:
        return self.marker == "skip-snippet"

    @property
    def slow(self) -> bool:
        return self.marker == "slow-snippet"

    @property
    def is_output(self) -> bool:
        return self.marker == "snippet-output"


def parse_blocks(text: str, path: str = "<text>") -> list[Block]:
    """Fenced code blocks of a Markdown text, each with the marker of the line before it
    (blank lines in between are allowed). A marker before anything else is an error."""
    lines = text.splitlines()
    blocks: list[Block] = []
    pending: tuple[str, str, int] | None = None  # (marker, reason, line)
    i = 0
    while i < len(lines):
        line = lines[i]
        marker = MARKER.match(line)
        fence = FENCE.match(line)
        if marker:
            if pending is not None:
                raise ValueError(f"{path}:{pending[2]}: marker not followed by a code block")
            pending = (marker.group(1), marker.group(2).strip(), i + 1)
        elif fence:
            indent, mark = fence.group("indent"), fence.group("fence")
            info = fence.group("info").strip()
            body: list[str] = []
            j = i + 1
            while j < len(lines):
                closing = FENCE.match(lines[j])
                if (
                    closing
                    and closing.group("fence")[0] == mark[0]
                    and len(closing.group("fence")) >= len(mark)
                    and not closing.group("info").strip()
                ):
                    break
                body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
                j += 1
            language = info.split()[0].lower() if info else ""
            kind, reason = (pending[0], pending[1]) if pending else (None, "")
            blocks.append(Block(path, i + 2, language, "\n".join(body) + "\n", kind, reason))
            pending = None
            i = j
        elif pending is not None and line.strip():
            raise ValueError(f"{path}:{pending[2]}: marker not followed by a code block")
        i += 1
    if pending is not None:
        raise ValueError(f"{path}:{pending[2]}: marker not followed by a code block")
    return blocks


def page_blocks(path: str) -> list[Block]:
    return parse_blocks((ROOT / path).read_text(encoding="utf-8"), path)


# --- shell ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """One shell command of a block, with the output shown after it (console blocks)."""

    block: Block
    line: int
    text: str  # continuation lines joined
    expected: str | None  # None when the page shows no output

    @property
    def where(self) -> str:
        return f"{self.block.path}:{self.line}"

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.text, comments=True)


def commands(block: Block) -> list[Command]:
    """The commands of a shell block (prompt style for console blocks, else one per line)."""
    prompt = block.language in PROMPT_SHELL
    out: list[Command] = []
    lines = block.code.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if prompt and not line.startswith("$ "):
            i += 1  # text before the first prompt
            continue
        text = line[2:] if prompt else line
        start = i
        while text.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text.rstrip()[:-1] + " " + lines[i].strip()
        i += 1
        expected = None
        if prompt:
            shown = []
            while i < len(lines) and not lines[i].startswith("$ "):
                shown.append(lines[i])
                i += 1
            expected = "\n".join(shown).strip("\n") or None
        if shlex.split(text, comments=True):
            out.append(Command(block, block.line + start, text.strip(), expected))
    return out


_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def classify(argv: list[str]) -> tuple[str, list[str]]:
    """What a command is: ``("cli", args)``, ``("make", targets)``, ``("script", [path])``,
    ``("setup", [])`` or ``("unknown", argv)``."""
    words = list(argv)
    while words and _ASSIGNMENT.match(words[0]):
        words.pop(0)  # VAR=value prefixes
    if not words:
        return "unknown", argv
    program = PurePosixPath(words[0]).name
    if program == "opacus-lastiterate":
        return "cli", words[1:]
    if program.startswith("python"):
        if words[1:3] == ["-m", "opacus_lastiterate"]:
            return "cli", words[3:]
        if len(words) > 2 and words[1] == "-m" and words[2] in {"pip", "venv"}:
            return "setup", []
        if len(words) > 1 and words[1].endswith(".py"):
            return "script", [words[1]]
        return "unknown", argv
    if program == "make":
        return "make", [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    if program in SETUP_COMMANDS:
        return "setup", []
    return "unknown", argv


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return {m.group(1) for m in re.finditer(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.MULTILINE)}


def cli_environment() -> dict[str, str]:
    """The environment of a documented command: this checkout first on the path, no colour,
    no terminal width inherited from the caller, no interactive plotting."""
    env = {k: v for k, v in os.environ.items() if k not in {"COLUMNS", "LINES", "FORCE_COLOR"}}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.update(NO_COLOR="1", TERM="dumb", MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
    return env


def run_cli(command: Command, args: list[str], cwd: Path) -> str:
    """Run one documented command; return a failure message, or "" when it ran as shown."""
    result = subprocess.run(
        [sys.executable, "-m", "opacus_lastiterate", *args],
        cwd=cwd,
        env=cli_environment(),
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
    )
    if result.returncode != 0:
        return (
            f"{command.where}: `{command.text}` exited with {result.returncode}\n"
            f"{result.stdout}{result.stderr}"
        )
    if command.expected is not None:
        checker = doctest.OutputChecker()
        if not checker.check_output(command.expected + "\n", result.stdout, OUTPUT_FLAGS):
            example = doctest.Example(command.text, command.expected + "\n")
            diff = checker.output_difference(example, result.stdout, OUTPUT_FLAGS)
            return f"{command.where}: `{command.text}` printed other output\n{diff}"
    return ""


# --- python --------------------------------------------------------------------------------


def python_blocks(blocks: list[Block]) -> list[tuple[Block, Block | None]]:
    """The Python blocks of a page, each with the ``snippet-output`` block that follows it
    (None if there is none). An output block after anything else is an error."""
    out: list[tuple[Block, Block | None]] = []
    previous: Block | None = None
    for block in blocks:
        if block.is_output:
            if previous is None or previous.language not in PYTHON or (out and out[-1][1]):
                raise ValueError(f"{block.where}: snippet-output must follow a Python block")
            out[-1] = (out[-1][0], block)
        elif block.language in PYTHON:
            out.append((block, None))
        previous = block
    return out


def check_output(block: Block, expected: Block, printed: str) -> None:
    """Raise AssertionError unless ``printed`` matches the output block (as console output)."""
    checker = doctest.OutputChecker()
    if not checker.check_output(expected.code, printed, OUTPUT_FLAGS):
        example = doctest.Example(block.where, expected.code)
        diff = checker.output_difference(example, printed, OUTPUT_FLAGS)
        raise AssertionError(f"{block.where} printed other output than {expected.where}\n{diff}")


def run_python(block: Block, namespace: dict[str, object]) -> None:
    """Execute one Python block in ``namespace``; tracebacks name the page and its lines."""
    filename = str(ROOT / block.path)
    if block.code.lstrip().startswith(">>>"):
        parser = doctest.DocTestParser()
        test = parser.get_doctest(block.code, namespace, block.where, filename, block.line - 1)
        runner = doctest.DocTestRunner(optionflags=OUTPUT_FLAGS)
        report: list[str] = []
        runner.run(test, out=report.append, clear_globs=False)
        if runner.failures:
            raise AssertionError("".join(report))
        return
    code = "\n" * (block.line - 1) + block.code  # line numbers of the page
    exec(compile(code, filename, "exec"), namespace)
