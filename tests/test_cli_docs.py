"""The command lines and install lines of README.md and docs/ hold as written: every
documented ``opacus-lastiterate`` command parses with the current options and uses no
deprecated spelling (``tests/docs/test_snippets.py`` runs them), no page tells to install
the package from an index it is not on, and the README's cadence claims are the monitor's
defaults."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from opacus_lastiterate.callbacks.cadence import DOUBLING_START, Cadences
from opacus_lastiterate.cli import main
from tests.docs import snippets

ROOT = Path(__file__).resolve().parent.parent
SHELL = snippets.PROMPT_SHELL | snippets.SCRIPT_SHELL


def _documented_commands() -> list[tuple[str, list[str]]]:
    found = []
    for page in snippets.pages():
        for block in snippets.page_blocks(page):
            if block.language not in SHELL or block.skipped:
                continue
            for command in snippets.commands(block):
                kind, args = snippets.classify(command.argv)
                if kind == "cli":
                    found.append((command.where, args))
    return found


COMMANDS = _documented_commands()


def test_the_pages_document_cli_commands() -> None:
    pages = {where.split(":")[0] for where, _ in COMMANDS}
    assert {"README.md", "docs/cli.md"} <= pages


@pytest.mark.parametrize(("where", "args"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_documented_commands_parse_without_deprecated_spellings(
    where: str, args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each documented command line is read by the current command-line interface (its
    options, choices and output paths, in an empty folder), without running the command,
    and takes no deprecated choice or option name."""
    leaves: list[click.Context] = []

    def record(self: click.Command, ctx: click.Context) -> None:
        if not isinstance(self, click.Group):
            leaves.append(ctx)

    monkeypatch.setattr(click.Command, "invoke", record)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs.jsonl").write_text("")  # the input of 'audit records' in docs/cli.md
    assert main(list(args)) == 0, (where, capsys.readouterr().err)
    if {"--version", "--help", "-h"} & set(args):  # printed and left before any command
        return
    (ctx,) = leaves
    params = ctx.params
    assert "robust" not in params.get("calibrate", ()), where
    assert params.get("accountant") != "robust", where
    assert params.get("deprecated_discretization") is None, where
    assert "deprecated" not in capsys.readouterr().err.lower(), where


def test_no_page_installs_the_package_from_an_index() -> None:
    """The package is not on PyPI: an install line names a clone (``.``, a path) or a wheel,
    never the bare distribution name."""
    bare = re.compile(r"pip3? install\b[^#\n]*?(?<![\w/.-])['\"]?opacus-lastiterate\b(?!-)")
    problems = []
    for page in snippets.pages():
        for block in snippets.page_blocks(page):
            problems += [f"{block.where}: {line}" for line in block.code.splitlines()
                         if bare.search(line)]
        text = (ROOT / page).read_text(encoding="utf-8")
        problems += [f"{page}: {m[0]}" for m in re.finditer(r"`[^`\n]*`", text)
                     if bare.search(m[0])]
    assert not problems, "\n".join(problems)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "pip install /path/to/clone" in readme and "python -m build" in readme


def test_the_readme_cadence_claims_are_the_monitors_defaults() -> None:
    """README: the heuristic every step; the robust and PLD values at steps 100, 200, 400, ...
    within the overhead budget; the demo's PLD column every 10 steps."""
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    defaults = Cadences()
    assert defaults.heuristic_every == 1
    assert defaults.robust_every == defaults.standard_every == "auto"
    first = DOUBLING_START
    assert (f"the robust heuristic and the tight (PLD) standard epsilon are computed at steps "
            f"{first}, {2 * first}, {4 * first}, ... where they fit the overhead budget") in readme
    assert "standard epsilon every step" not in readme
    demo = re.search(r"^demo:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert demo is not None and "--standard-every" not in demo[1]
    script = (ROOT / "examples" / "train_digits.py").read_text()
    default = re.search(r'"--standard-every",\s*type=int,\s*default=(\d+)', script)
    assert default is not None
    assert f"the tight (PLD) standard epsilon every {default[1]} steps" in readme
