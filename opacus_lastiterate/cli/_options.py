"""Option types, shared options and output helpers of the command-line interface.

Imports click and the standard library only: every command module imports this one, and the
pure-math commands must start fast (no numpy-heavy, torch or opacus import at start-up).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator
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
    "check_plot_path",
    "dp_sgd_options",
    "emit_json",
    "fmt_eps",
    "interval_option",
    "json_option",
    "ordered",
    "plot_option",
    "plot_path",
    "writing",
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
    :class:`~pathlib.Path` (:func:`check_plot_path`), checked before anything is computed."""

    def resolve(ctx: click.Context, param: click.Parameter, value: str | None) -> Path | None:
        if value is None:
            return None
        return check_plot_path(value, default_name)

    return click.option(
        "--plot", "plot", type=click.Path(path_type=str), default=None, metavar="FILE",
        callback=resolve,
        help=f"Save a plot of {what} to FILE (.png, .pdf or .svg; a folder gets "
        f"{default_name} inside). Its folder must exist. Needs matplotlib.",
    )


def emit_json(payload: Any) -> None:
    click.echo(json.dumps(json_safe(payload), allow_nan=False))


def fmt_eps(value: float, width: int = 10) -> str:
    """A number in a fixed-width column (4 decimals), "inf" when infinite."""
    return f"{value:{width}.4f}" if math.isfinite(value) else f"{'inf':>{width}}"


def ordered(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with the robust heuristic raised to the heuristic where it came out below:
    the robust value is a maximum over t <= T that includes t = T, so it is never below the
    heuristic; two separately computed upper bounds can still land in the wrong order by a
    rounding (``docs/cli.md``, "epsilon")."""
    robust, plain = values.get("robust_heuristic"), values.get("heuristic")
    if isinstance(robust, float) and isinstance(plain, float) and robust < plain:
        return {**values, "robust_heuristic": plain}
    return values


def plot_path(text: str | Path, default_name: str) -> Path:
    """Where ``--plot PATH`` saves: PATH itself if it names an image file; PATH/default_name
    if it is an existing folder or ends with a separator. Anything else is a usage error."""
    text = str(text) if isinstance(text, Path) else text
    path = Path(text)
    if _names_folder(text):
        return path / default_name
    if path.suffix.lower() not in IMAGE_SUFFIXES:
        raise click.BadParameter(
            f"must name an image file ending in {', '.join(IMAGE_SUFFIXES)} or an existing "
            f"folder, got {text!r}.",
            param_hint="'--plot'",
        )
    return path


def _names_folder(text: str) -> bool:
    return text.endswith(("/", "\\")) or _is_dir(Path(text))


def check_plot_path(text: str | Path, default_name: str, option: str = "--plot") -> Path:
    """:func:`plot_path` of ``text``, checked by :func:`check_output_path`: a folder the user
    names (``DIR/``) may be missing if its parent exists (the writer creates DIR only)."""
    target = plot_path(text, default_name)
    if _names_folder(str(text)):
        check_output_path(target.parent, option, folder=True)
        if not _exists(target.parent):
            return target
    return check_output_path(target, option)


def _exists(path: Path) -> bool:
    try:
        return path.exists() or path.is_symlink()
    except OSError:  # e.g. a component is not a folder, or a folder cannot be searched
        return False


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:
        return False


def _accepts_files(folder: Path) -> str | None:
    """None if a file can be created in the existing ``folder`` (a file is created and removed
    at once: permission bits do not say it, e.g. for root or under /proc), else why not."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".opacus-lastiterate-", suffix=".probe", dir=folder)
    except OSError as err:
        return (f"the folder {str(folder)!r} is not writable (creating a file there failed: "
                f"{err.strerror or err})")
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return None


def _output_problem(path: Path, folder: bool) -> str | None:
    """Why nothing can be written at ``path`` (a file, or a ``folder``), or None. A missing
    ``path`` needs an existing, writable parent folder: no folder above it is created."""
    if _exists(path):
        if folder and not _is_dir(path):
            return f"{str(path)!r} exists and is not a folder"
        if not folder and _is_dir(path):
            return f"{str(path)!r} is an existing folder, not a file"
        if folder:
            return _accepts_files(path)
        problem = _file_problem(path)
        return problem if problem is not None else _accepts_files(path.parent)
    parent = path.parent
    if not _is_dir(parent):
        ancestor = parent
        while not _exists(ancestor) and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if _exists(parent):
            kind = "a file" if parent.is_file() else "something else"
            return f"{str(parent)!r} is {kind}, not a folder"
        why = f" ({str(ancestor)!r} is a file)" if not _is_dir(ancestor) else ""
        return f"the directory {str(parent)!r} does not exist{why}"
    return _accepts_files(parent)


def _file_problem(path: Path) -> str | None:
    """Why the existing file ``path`` cannot be overwritten, or None (a regular file is opened
    for appending and closed unchanged; anything else is asked of its permission bits)."""
    if not path.is_file():
        return None if os.access(path, os.W_OK) else f"{str(path)!r} is not writable"
    try:
        with open(path, "ab"):
            pass
    except OSError as err:
        return f"{str(path)!r} is not writable ({err.strerror or err})"
    return None


def check_output_path(path: Path, option: str, *, folder: bool = False) -> Path:
    """``path`` if a file (or a ``folder``) can be written there, else a usage error naming
    ``option`` and the path: the path must not be a folder (a file), and its parent must be an
    existing folder in which a file can be created (tried). Creates nothing that stays;
    called while the command line is parsed, before anything is computed."""
    problem = _output_problem(Path(path), folder)
    if problem is not None:
        raise click.BadParameter(f"cannot write {str(path)!r}: {problem}.",
                                 param_hint=f"'{option}'")
    return Path(path)


@contextlib.contextmanager
def writing(path: Path, option: str) -> Iterator[None]:
    """Turns an :class:`OSError` raised while writing ``path`` (checked before the computation,
    but a disk can fill or a folder vanish since) into an error naming ``option`` and the
    path the user gave, not a temporary file beside it."""
    try:
        yield
    except OSError as err:
        folder = Path(path).absolute().parent
        if err.filename is not None and Path(str(err.filename)).absolute().parent != folder:
            raise
        raise click.ClickException(
            f"{option} {str(path)!r}: could not write the file: {err.strerror or err}."
        ) from None


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
