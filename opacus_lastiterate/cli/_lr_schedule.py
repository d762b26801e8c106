"""The learning rates of the command line's ``--lr-schedule``: a built-in schedule by name, or a
text file with one rate per step (errors name the option, the file, the line and the
column)."""

from __future__ import annotations

import math
import re
from typing import Any

import click

__all__ = ["learning_rates", "read_rates"]


def learning_rates(lr_schedule: str | None, steps: int, step_size: int | None, gamma: float) -> Any:
    """The per-step learning rates of ``--lr-schedule`` (unit base rate: only ratios matter)."""
    from opacus_lastiterate.analysis.last_iterate.optimizer_weights import (
        BUILTIN_SCHEDULES,
        builtin_schedule,
    )

    name = lr_schedule or "constant"
    if name in BUILTIN_SCHEDULES:
        options: dict[str, Any] = {}
        if name == "step":
            size = step_size if step_size is not None else max(1, steps // 3)
            options = {"step_size": size, "gamma": gamma}
        return builtin_schedule(name, 1.0, steps, **options)
    rates = read_rates(name, BUILTIN_SCHEDULES)
    if rates.size != steps:
        raise click.BadParameter(
            f"the file {name!r} must hold --steps = {steps} rates, got {rates.size}.",
            param_hint="'--lr-schedule'",
        )
    return rates


def read_rates(name: str, builtin: Any) -> Any:
    """The learning rates of the text file ``name``: numbers separated by white space or
    commas, in reading order; ``#`` starts a comment (a header line must be one). A value that
    is not a finite number >= 0 is a usage error naming --lr-schedule, the file, and the line
    (1-based, every line of the file counted) and column (1-based field) where it stands."""
    import numpy as np

    try:
        with open(name, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else err
        raise click.BadParameter(
            f"must be one of {', '.join(builtin)} or a readable text file with one learning "
            f"rate per step, got {name!r} ({why}).",
            param_hint="'--lr-schedule'",
        ) from None
    rates: list[float] = []
    for line_number, line in enumerate(lines, start=1):
        fields = re.split(r"[\s,]+", line.split("#", 1)[0].strip())
        for column, field in enumerate(filter(None, fields), start=1):
            try:
                rate = float(field)
            except ValueError:
                rate = None
            if rate is None or not math.isfinite(rate) or rate < 0:
                what = "not a number" if rate is None else "not a finite number >= 0"
                hint = " (a header line must start with #)" if rate is None else ""
                raise click.BadParameter(
                    f"{name!r}, line {line_number}, column {column}: {field!r} is {what}"
                    f"{hint}.",
                    param_hint="'--lr-schedule'",
                )
            rates.append(rate)
    return np.asarray(rates, dtype=float)
