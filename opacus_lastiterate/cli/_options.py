"""Option types, shared options and output helpers of the command-line interface.

Imports click and the standard library only: every command module imports this one, and the
pure-math commands must start fast (no numpy-heavy, torch or opacus import at start-up).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from opacus_lastiterate._json import json_safe
from opacus_lastiterate.figures._plotting import IMAGE_SUFFIXES

__all__ = [
    "DEFAULT_INTERVAL",
    "Interval",
    "deprecated_choice",
    "dp_sgd_options",
    "emit_json",
    "fmt_eps",
    "interval_option",
    "json_option",
    "json_safe",
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
    """``--value-discretization-interval`` (passed to the command as ``discretization``), with
    its deprecated name ``--discretization`` still accepted (a note on stderr)."""

    def decorate(f: F) -> F:
        @functools.wraps(f)
        def command(*args: Any, **kwargs: Any) -> Any:
            old = kwargs.pop("deprecated_discretization")
            if old is not None:
                source = click.get_current_context().get_parameter_source("discretization")
                if source is not click.core.ParameterSource.DEFAULT:
                    raise click.UsageError(
                        "--discretization is the deprecated name of "
                        "--value-discretization-interval: pass only the latter."
                    )
                click.echo(
                    "Note: --discretization is deprecated and will be removed in the next "
                    "release; use --value-discretization-interval.",
                    err=True,
                )
                kwargs["discretization"] = old
            return f(*args, **kwargs)

        command = click.option(
            "--discretization", "deprecated_discretization", type=POSITIVE, default=None,
            hidden=True,
        )(command)
        command = click.option(
            "--value-discretization-interval", "discretization", type=POSITIVE,
            default=DEFAULT_INTERVAL, show_default=True, help=help_text,
        )(command)
        return command  # type: ignore[return-value]

    return decorate


def deprecated_choice(value: str, old: str, new: str, option: str) -> str:
    """``new`` for the deprecated choice ``old`` of ``option`` (a note on stderr), else
    ``value``."""
    if value != old:
        return value
    click.echo(
        f"Note: {option} {old} is deprecated and will be removed in the next release; use "
        f"{option} {new}.",
        err=True,
    )
    return new


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
        return None if value is None else plot_path(value, default_name)

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
