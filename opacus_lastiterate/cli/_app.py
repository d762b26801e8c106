"""The ``opacus-lastiterate`` command group and :func:`main` (errors and warnings)."""

from __future__ import annotations

import gc
import sys
import warnings
from collections.abc import Sequence

import click

from opacus_lastiterate.cli._audit import audit
from opacus_lastiterate.cli._counterexample import counterexample
from opacus_lastiterate.cli._epsilon import epsilon
from opacus_lastiterate.cli._normalisation import normalisation
from opacus_lastiterate.cli._plan import plan
from opacus_lastiterate.cli._reproduce import reproduce
from opacus_lastiterate.cli._versions import compare_versions

__all__ = ["cli", "main"]

PROG = "opacus-lastiterate"


def _version() -> str:
    from importlib import metadata

    from opacus_lastiterate import __version__

    try:
        opacus = f"opacus {metadata.version('opacus')} installed"
    except metadata.PackageNotFoundError:
        opacus = "opacus not installed"
    return f"{PROG} {__version__} ({opacus}; Python {sys.version.split()[0]})"


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(_version())
        ctx.exit()


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=_print_version, help="Show the version and exit.")
def cli() -> None:
    """Last-iterate (final-model) privacy accounting and auditing for DP-SGD.

    Every number is labelled: the last-iterate heuristic describes the final model only and
    is exact for linear losses but not a proven bound for deep networks; the standard epsilon
    is the proven bound when every iterate is released; audit numbers are lower bounds.
    Add --json to any command for machine-readable output.
    """


for _command in (epsilon, plan, normalisation, compare_versions, counterexample, audit,
                 reproduce):
    cli.add_command(_command)


def _show_warnings(command: str, caught: list[warnings.WarningMessage]) -> None:
    """Each warning once, as one line that starts with the command the user ran."""
    for message in dict.fromkeys(str(w.message) for w in caught):
        click.echo(f"{PROG} {command}: warning: {message}", err=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); return the exit status.

    Usage errors and invalid values exit with status 2 and a message naming the option;
    warnings are printed to stderr, one line each, after the output.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    command = " ".join(a for a in args[:2] if not a.startswith("-"))
    try:
        return _run(command, args)
    finally:
        if argv is None:  # the console script: the process exits next
            # Spare the interpreter's last garbage collection over the objects numpy, scipy
            # and dp_accounting created on import (about 0.1 s of a 1 s command).
            gc.freeze()


def _run(command: str, args: list[str]) -> int:
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            status = cli.main(args=args, prog_name=PROG, standalone_mode=False)
    except click.exceptions.Exit as stop:
        return int(stop.exit_code)
    except click.ClickException as err:
        _show_warnings(command, caught)
        err.show()
        raise SystemExit(err.exit_code) from None
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        raise SystemExit(130) from None
    except (ValueError, TypeError, ImportError, OSError) as err:
        _show_warnings(command, caught)
        click.echo(f"{PROG} {command}: error: {err}", err=True)
        raise SystemExit(2) from None
    _show_warnings(command, caught)
    return int(status or 0)
