"""``opacus-lastiterate reproduce FIGURE``: the papers' figures and tables, recomputed
(:mod:`opacus_lastiterate.figures`; ``docs/cli.md``, "reproduce")."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from opacus_lastiterate.cli._options import (
    COUNT,
    POSITIVE,
    OutputPath,
    check_plot_path,
    emit_json,
    json_option,
    writing,
)
from opacus_lastiterate.figures import FIGURES

__all__ = ["reproduce"]

_SIMULATED = ("last-iterate-fig3", "cebere-fig4", "normalisation-fig2")
_EXTRA: dict[str, list[Callable[[Any], Any]]] = {
    "last-iterate-fig3": [
        click.option("--target-epsilon", type=POSITIVE, default=4.0, show_default=True,
                     help="Standard epsilon every (q, T) is calibrated to."),
    ],
    "normalisation-fig2": [
        click.option("--noise-multiplier", type=POSITIVE, default=1.0, show_default=True,
                     help="Noise multiplier sigma of both mechanisms."),
    ],
}


def _size(quick: bool, full: bool) -> str:
    if quick and full:
        raise click.UsageError("Pass at most one of --quick and --full.")
    return "quick" if quick else ("full" if full else "default")


def _run(name: str, size: str, plot: Path | None, no_plot: bool, **kwargs: Any) -> dict[str, Any]:
    """Compute figure ``name``, save its plot; return the result and where it went."""
    from opacus_lastiterate.figures import load

    if no_plot and plot is not None:
        raise click.UsageError("Pass at most one of --plot and --no-plot.")
    saved = note = None
    if not no_plot:
        if plot is None and importlib.util.find_spec("matplotlib") is None:
            note = ("plot skipped: matplotlib is not installed "
                    "(pip install 'opacus-lastiterate[plot]', or pass --no-plot)")
        elif plot is None:  # checked before the (possibly long) computation
            saved = check_plot_path(f"{name}.png", f"{name}.png")
        else:  # checked when the command line was parsed
            saved = Path(plot)
    start = time.perf_counter()
    result = load(name).compute(size, **kwargs)
    if saved is not None:
        with writing(saved, "--plot"):
            result.plot(result, saved)
    return {"result": result, "plot": saved, "note": note,
            "elapsed": time.perf_counter() - start}


def _report(run: dict[str, Any], as_json: bool) -> None:
    if as_json:
        payload = run["result"].as_dict()
        payload["plot"] = None if run["plot"] is None else str(run["plot"])
        payload["elapsed_seconds"] = round(run["elapsed"], 3)
        emit_json(payload)
        return
    click.echo(run["result"].table())
    if run["plot"] is not None:
        click.echo(f"saved plot: {run['plot']}")
    if run["note"] is not None:
        click.echo(run["note"])
    click.echo(f"({run['elapsed']:.1f} s)")


def _common(f: Any, name: str, simulated: bool) -> Any:
    def resolve(ctx: click.Context, param: click.Parameter, value: str | None) -> Path | None:
        if value is None:
            return None
        return check_plot_path(value, f"{name}.png")

    options = [
        click.option("--quick", is_flag=True,
                     help="A few seconds: fewer points (and trials), coarser grids."),
        click.option("--full", is_flag=True,
                     help="The papers' settings where known (slow for simulated figures)."),
        click.option("--plot", type=click.Path(path_type=str), default=None, metavar="FILE",
                     callback=resolve,
                     help="Where to save the picture (.png, .pdf or .svg; a folder gets "
                     "NAME.png inside) [default: ./NAME.png]."),
        click.option("--no-plot", is_flag=True, help="Print the numbers only."),
    ]
    if simulated:
        options += [
            click.option("--trials", type=COUNT, default=None,
                         help="Simulated runs per side (or per N) [default: by size]."),
            click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
                         help="Seed of the simulation."),
        ]
    for option in reversed([*options, json_option]):
        f = option(f)
    return f


def _figure_command(name: str, module: str, description: str) -> click.Command:
    def callback(quick: bool, full: bool, plot: Path | None, no_plot: bool, as_json: bool,
                 **kwargs: Any) -> None:
        _report(_run(name, _size(quick, full), plot, no_plot, **kwargs), as_json)

    summary = f"{description[0].upper()}{description[1:]}"
    callback.__doc__ = (
        f"{summary}.\n\n"
        f"Computed by opacus_lastiterate.figures.{module}; see its docstring for the paper, "
        "the settings and what each number is."
    )
    for option in reversed(_EXTRA.get(name, [])):
        callback = option(callback)
    command = click.command(name, short_help=summary)(_common(callback, name, name in _SIMULATED))
    return command


@click.group(short_help="The papers' figures and tables: numbers and a PNG.")
def reproduce() -> None:
    """Recompute a figure or table of the papers: the numbers, and a PNG.

    Each FIGURE runs in seconds to about a minute; --quick takes a few seconds and --full
    uses the papers' settings where they are known. The picture goes to ./FIGURE.png
    unless --plot or --no-plot says otherwise.
    """


for _name, (_module, _description) in FIGURES.items():
    reproduce.add_command(_figure_command(_name, _module, _description))


@reproduce.command("all", short_help="Every figure and table, pictures in one folder.")
@click.option("--quick", is_flag=True, help="Every figure in its quick size.")
@click.option("--full", is_flag=True, help="Every figure at the papers' settings (slow).")
@click.option("--out", type=OutputPath(folder=True), default=Path("."),
              show_default=True, help="Folder for the pictures (NAME.png each).")
@click.option("--no-plot", is_flag=True, help="Print the numbers only.")
@json_option
def reproduce_all(quick: bool, full: bool, out: Path, no_plot: bool, as_json: bool) -> None:
    """Every figure and table, pictures saved as OUT/NAME.png."""
    size = _size(quick, full)
    runs = []
    for name in FIGURES:
        if not no_plot:
            with writing(out / f"{name}.png", "--out"):
                out.mkdir(exist_ok=True)  # its parent was checked: only OUT is created
        run = _run(name, size, None if no_plot else out / f"{name}.png", no_plot)
        if as_json:
            runs.append(run)
        else:
            _report(run, False)
            click.echo("")
    if as_json:
        emit_json([
            {**r["result"].as_dict(), "plot": None if r["plot"] is None else str(r["plot"])}
            for r in runs
        ])
