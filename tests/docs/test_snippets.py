"""Every code block of README.md and docs/ runs as shown (conventions: tests/docs/snippets.py
and docs/contributing_docs.md).

One test per page and kind: the page's Python blocks in order in one namespace, and its
shell commands (``opacus-lastiterate ...`` run through ``python -m opacus_lastiterate``, with
the output the page shows). Blocks marked ``slow-snippet`` run in a separate ``slow`` test.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path

import pytest

from tests.docs import snippets
from tests.docs.snippets import PROMPT_SHELL, PYTHON, SCRIPT_SHELL, Block

# Pages whose blocks do not run yet, with the reason; the test of such a page is a strict
# xfail, so it fails as soon as the page runs and the entry must then be removed.
# (Single-quoted keys: tests/test_docs_citations.py reads a double-quoted page name followed
# by a double-quoted string as the citation of a section.)
PENDING: dict[str, str] = {
}


PAGE = "example-page"  # the name of the Markdown texts of the tests below


def _blocks(page: str, languages: frozenset[str]) -> list[Block]:
    return [b for b in snippets.page_blocks(page) if b.language in languages]


def _params(languages: frozenset[str], *, slow: bool) -> list[object]:
    params = []
    for page in snippets.pages():
        blocks = _blocks(page, languages)
        if not blocks or (slow and not any(b.slow for b in blocks)):
            continue
        marks = [pytest.mark.slow] if slow else []
        if page in PENDING:
            marks.append(pytest.mark.xfail(reason=PENDING[page], strict=True))
        params.append(pytest.param(page, marks=marks, id=page))
    return params


def _run_python(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slow: bool) -> None:
    monkeypatch.chdir(tmp_path)  # files a snippet writes land here
    monkeypatch.setenv("MPLBACKEND", "Agg")
    namespace: dict[str, object] = {"__name__": "__main__"}
    ran = 0
    with warnings.catch_warnings():
        for block, output in snippets.python_blocks(snippets.page_blocks(page)):
            if block.skipped or (block.slow and not slow):
                continue
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                snippets.run_python(block, namespace)
            if output is not None:
                snippets.check_output(block, output, printed.getvalue())
            ran += 1
    try:
        import matplotlib.pyplot as plt

        plt.close("all")
    except ImportError:
        pass
    if ran == 0:
        pytest.skip(f"every Python block of {page} is marked")


@pytest.mark.parametrize("page", _params(PYTHON, slow=False))
def test_python_blocks_run(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _run_python(page, tmp_path, monkeypatch, slow=False)


@pytest.mark.parametrize("page", _params(PYTHON, slow=True))
def test_python_blocks_run_with_slow_ones(
    page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run_python(page, tmp_path, monkeypatch, slow=True)


def _run_shell(page: str, tmp_path: Path, slow: bool) -> None:
    failures = []
    targets = snippets.make_targets()
    for block in _blocks(page, PROMPT_SHELL | SCRIPT_SHELL):
        if block.skipped or (block.slow and not slow):
            continue
        for command in snippets.commands(block):
            kind, args = snippets.classify(command.argv)
            if kind == "cli":
                failures.append(snippets.run_cli(command, args, tmp_path))
            elif kind == "make":
                missing = [t for t in args if t not in targets] or ([] if args else ["(none)"])
                if missing:
                    failures.append(f"{command.where}: no Makefile target {missing}")
            elif kind == "script":
                if not (snippets.ROOT / args[0]).is_file():
                    failures.append(f"{command.where}: no file {args[0]}")
            elif kind == "unknown":
                failures.append(
                    f"{command.where}: `{command.text}` is neither an opacus-lastiterate "
                    "command, a make target, a script nor a set-up command; mark the block "
                    "<!-- skip-snippet: reason --> if it cannot run here"
                )
    failures = [f for f in failures if f]
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("page", _params(PROMPT_SHELL | SCRIPT_SHELL, slow=False))
def test_shell_commands_run(page: str, tmp_path: Path) -> None:
    _run_shell(page, tmp_path, slow=False)


@pytest.mark.parametrize("page", _params(PROMPT_SHELL | SCRIPT_SHELL, slow=True))
def test_shell_commands_run_with_slow_ones(page: str, tmp_path: Path) -> None:
    _run_shell(page, tmp_path, slow=True)


# --- the conventions themselves ------------------------------------------------------------


def test_markers_have_reasons_and_commands_are_in_shell_blocks() -> None:
    problems = []
    for page in snippets.pages():
        for block in snippets.page_blocks(page):  # raises on a marker without a block
            if block.marker in ("skip-snippet", "slow-snippet") and not block.reason:
                problems.append(f"{block.where}: {block.marker} needs a reason")
            if block.language in PYTHON | PROMPT_SHELL | SCRIPT_SHELL:
                continue
            for line in block.code.splitlines():
                if line.lstrip("$ ").startswith(("opacus-lastiterate ", "python -m opacus_")):
                    problems.append(
                        f"{block.where}: a command in a ```{block.language or '(no language)'}"
                        " block is never run; use ```console (with `$ `) or ```bash"
                    )
                    break
    assert not problems, "\n".join(problems)


def test_output_blocks_follow_python_blocks() -> None:
    for page in snippets.pages():
        snippets.python_blocks(snippets.page_blocks(page))  # raises on a misplaced one
    text = "```python\nprint(1 + 1)\n```\n<!-- snippet-output -->\n```text\n2\n```\n"
    ((block, output),) = snippets.python_blocks(snippets.parse_blocks(text, PAGE))
    assert output is not None and output.code == "2\n"
    snippets.check_output(block, output, "2\n")
    with pytest.raises(AssertionError, match="printed other output"):
        snippets.check_output(block, output, "3\n")
    with pytest.raises(ValueError, match="must follow a Python block"):
        snippets.python_blocks(snippets.parse_blocks(text.split("\n", 3)[3], PAGE))


def test_pending_pages_exist() -> None:
    assert set(PENDING) <= set(snippets.pages())


MARKDOWN = """\
Text.

<!-- skip-snippet: needs a GPU -->

```python
import torch
```

~~~console
$ opacus-lastiterate epsilon --steps 3 \\
      --delta 1e-6   # comment
heuristic ...
$ make test
~~~

<!-- slow-snippet: trains for a minute -->
````bash
.venv/bin/opacus-lastiterate --help
TORCH_INDEX_URL=https://example.org make demo
python examples/train_digits.py --quick
pip install -e .
rm -rf runs
````
"""


def test_parser_reads_blocks_markers_and_commands() -> None:
    skip, console, bash = snippets.parse_blocks(MARKDOWN, PAGE)
    assert (skip.language, skip.line, skip.skipped, skip.reason) == (
        "python", 6, True, "needs a GPU",
    )
    assert skip.code == "import torch\n"
    assert console.marker is None and bash.slow and bash.reason == "trains for a minute"
    first, second = snippets.commands(console)
    assert first.line == console.line and first.expected == "heuristic ..."
    assert snippets.classify(first.argv) == (
        "cli", ["epsilon", "--steps", "3", "--delta", "1e-6"],
    )
    assert snippets.classify(second.argv) == ("make", ["test"]) and second.expected is None
    kinds = [snippets.classify(c.argv)[0] for c in snippets.commands(bash)]
    assert kinds == ["cli", "make", "script", "setup", "unknown"]


@pytest.mark.parametrize(
    "text",
    ["<!-- skip-snippet: x -->\nplain text\n```python\npass\n```\n", "<!-- slow-snippet: x -->\n"],
)
def test_a_marker_must_precede_a_block(text: str) -> None:
    with pytest.raises(ValueError, match="marker not followed by a code block"):
        snippets.parse_blocks(text, PAGE)


def test_console_output_is_compared(tmp_path: Path) -> None:
    text = "```console\n$ opacus-lastiterate --help\n...opacus-lastiterate...epsilon...\n```\n"
    (command,) = snippets.commands(snippets.parse_blocks(text, PAGE)[0])
    args = snippets.classify(command.argv)[1]
    assert snippets.run_cli(command, args, tmp_path) == ""
    wrong = snippets.Command(command.block, command.line, command.text, "...no such output...")
    assert "printed other output" in snippets.run_cli(wrong, args, tmp_path)
    failing = snippets.Command(command.block, command.line, "opacus-lastiterate nonsense", None)
    assert "exited with" in snippets.run_cli(failing, ["nonsense"], tmp_path)
