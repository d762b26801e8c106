"""Option types, shared options and output helpers of the command-line interface.

Imports click and the standard library only: every command module imports this one, and the
pure-math commands must start fast (no numpy-heavy, torch or opacus import at start-up).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from opacus_lastiterate._json import json_safe
from opacus_lastiterate.figures._plotting import IMAGE_SUFFIXES

__all__ = [
    "DEFAULT_INTERVAL",
    "Interval",
    "OutputPath",
    "check_batch_size",
    "check_output_path",
    "dp_sgd_options",
    "emit_json",
    "fmt_eps",
    "interval_option",
    "json_option",
    "plot_option",
    "plot_path",
]

F = TypeVar("F", bound=Callable[..., Any])


class Interval(click.ParamType):
    """A real number in an interval (NaN refused); errors say the range and the value."""

    name = "number"

    def __init__(
        self, low: float, high: float, *, low_open: bool = True, high_open: bool = True
    ) -> None:
        self.low, self.high = low, high
        self.low_open, self.high_open = low_open, high_open

    def describe(self) -> str:
        lo = "-inf" if self.low == -math.inf else f"{self.low:g}"
        hi = "inf" if self.high == math.inf else f"{self.high:g}"
        return f"{'(' if self.low_open else '['}{lo}, {hi}{')' if self.high_open else ']'}"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            x = float(value)
        except (TypeError, ValueError):
            self.fail(f"must be a number in {self.describe()}, got {value!r}.", param, ctx)
        ok_low = x > self.low if self.low_open else x >= self.low
        ok_high = x < self.high if self.high_open else x <= self.high
        if math.isnan(x) or not (ok_low and ok_high):
            self.fail(f"must be in {self.describe()}, got {value}.", param, ctx)
        return x

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "FLOAT"


PROBABILITY = Interval(0.0, 1.0)  # delta
SAMPLE_RATE = Interval(0.0, 1.0, high_open=False)
POSITIVE = Interval(0.0, math.inf)
NON_NEGATIVE = Interval(0.0, math.inf, low_open=False)
UNIT = Interval(0.0, 1.0, low_open=False, high_open=False)
STEPS = click.IntRange(min=0)
COUNT = click.IntRange(min=1)


def dp_sgd_options(*, noise_required: bool = True, delta_required: bool = True) -> Callable[[F], F]:
    """--steps, --sample-rate, --noise-multiplier, --delta: one DP-SGD configuration."""

    def decorate(f: F) -> F:
        for option in reversed(
            [
                click.option("--steps", type=STEPS, required=True, help="Number of steps T."),
                click.option(
                    "--sample-rate", type=SAMPLE_RATE, required=True,
                    help="Poisson sampling rate q in (0, 1] (expected batch size / N).",
                ),
                click.option(
                    "--noise-multiplier", type=POSITIVE, required=noise_required,
                    help="Noise multiplier sigma > 0 (noise std / clipping norm).",
                ),
                click.option(
                    "--delta", type=PROBABILITY, required=delta_required,
                    help="Target delta in (0, 1).",
                ),
            ]
        ):
            f = option(f)
        return f

    return decorate


DEFAULT_INTERVAL = 1e-4
"""Default of ``--value-discretization-interval``: the standard model's default
(``analysis.baselines.composition.DEFAULT_DISCRETIZATION``; a literal here, so that the
CLI starts without importing the mathematics)."""


def interval_option(help_text: str) -> Callable[[F], F]:
    """``--value-discretization-interval`` (passed to the command as ``discretization``)."""
    return click.option(
        "--value-discretization-interval", "discretization", type=POSITIVE,
        default=DEFAULT_INTERVAL, show_default=True, help=help_text,
    )


def json_option(f: F) -> F:
    """--json: print one JSON object (non-finite numbers as strings) instead of a table."""
    return click.option(
        "--json", "as_json", is_flag=True,
        help='Print one JSON object instead of the table (infinity as "inf").',
    )(f)


def plot_option(what: str, default_name: str) -> Callable[[F], F]:
    """--plot FILE: save a picture of ``what``; the value reaches the command as the resolved
    :class:`~pathlib.Path` (:func:`plot_path`), checked before anything is computed."""

    def resolve(ctx: click.Context, param: click.Parameter, value: str | None) -> Path | None:
        if value is None:
            return None
        return check_output_path(plot_path(value, default_name), "--plot")

    return click.option(
        "--plot", "plot", type=click.Path(path_type=str), default=None, metavar="FILE",
        callback=resolve,
        help=f"Save a plot of {what} to FILE (.png, .pdf or .svg; a folder gets "
        f"{default_name} inside). Needs matplotlib.",
    )


def emit_json(payload: Any) -> None:
    click.echo(json.dumps(json_safe(payload), allow_nan=False))


def fmt_eps(value: float, width: int = 10) -> str:
    """A number in a fixed-width column (4 decimals), "inf" when infinite."""
    return f"{value:{width}.4f}" if math.isfinite(value) else f"{'inf':>{width}}"


def plot_path(text: str | Path, default_name: str) -> Path:
    """Where ``--plot PATH`` saves: PATH itself if it names an image file; PATH/default_name
    if it is an existing folder or ends with a separator. Anything else is a usage error."""
    text = str(text) if isinstance(text, Path) else text
    path = Path(text)
    if path.is_dir() or text.endswith(("/", "\\")):
        return path / default_name
    if path.suffix.lower() not in IMAGE_SUFFIXES:
        raise click.BadParameter(
            f"must name an image file ending in {', '.join(IMAGE_SUFFIXES)} or an existing "
            f"folder, got {text!r}.",
            param_hint="'--plot'",
        )
    return path


def _exists(path: Path) -> bool:
    try:
        return path.exists() or path.is_symlink()
    except OSError:  # e.g. a component is not a folder, or a folder cannot be searched
        return False


def _output_problem(path: Path, folder: bool) -> str | None:
    """Why nothing can be written at ``path`` (a file, or a ``folder``), or None."""
    if _exists(path):
        if folder and not path.is_dir():
            return f"{str(path)!r} exists and is not a folder"
        if not folder and path.is_dir():
            return f"{str(path)!r} is an existing folder, not a file"
        if not os.access(path, os.W_OK | (os.X_OK if folder else 0)):
            return f"{str(path)!r} is not writable"
        return None
    ancestor = path.parent
    while not _exists(ancestor) and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if ancestor.is_file():
        return f"{str(ancestor)!r} is a file, so {str(path)!r} cannot be created under it"
    if not ancestor.is_dir():
        return f"{str(ancestor)!r} is not a folder"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"the folder {str(ancestor)!r} is not writable"
    return None


def check_output_path(path: Path, option: str, *, folder: bool = False) -> Path:
    """``path`` if a file (or a ``folder``) can be written there, else a usage error naming
    ``option``: the path must not be a folder (a file), its nearest existing ancestor must be
    a writable folder (missing folders in between are created later, by the writer). Creates
    nothing; called while the command line is parsed, before anything is computed."""
    problem = _output_problem(Path(path), folder)
    if problem is not None:
        raise click.BadParameter(f"cannot write there: {problem}.", param_hint=f"'{option}'")
    return Path(path)


class OutputPath(click.Path):
    """A file (or a ``folder``) the command will write: checked by :func:`check_output_path`
    when the command line is parsed, given to the command as a :class:`~pathlib.Path`."""

    def __init__(self, *, folder: bool = False) -> None:
        super().__init__(file_okay=not folder, dir_okay=folder, path_type=Path)
        self.folder = folder

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        option = param.opts[0] if param is not None and param.opts else "PATH"
        return check_output_path(Path(value), option, folder=self.folder)


def check_batch_size(batch_size: int, dataset_size: int, *, option: str = "--batch-size",
                     drop_last: bool = False) -> None:
    """A usage error naming ``option``, ``--dataset-size`` and the valid range unless the
    batch size is in [1, N] (N = the data set size), or [1, N - 1] with ``drop_last`` (the
    neighbouring data set of N - 1 records must still fill a batch)."""
    if drop_last:
        high, bound = dataset_size - 1, "--dataset-size - 1"
        why = " with --drop-last (the neighbour data set of N - 1 records must fill a batch)"
    else:
        high, bound, why = dataset_size, "--dataset-size", ""
    if not 1 <= batch_size <= high:
        raise click.BadParameter(
            f"must be in [1, {bound}] = [1, {high}]{why}, got {batch_size}.",
            param_hint=f"'{option}'",
        )
