"""The human-readable summary of a :class:`~opacus_lastiterate.accountants.LastIterateAccountant`
(its ``describe()``): what its number is now and what it is not.

Read from the accountant's public state only: its steps and segments, its privacy unit
(``docs/privacy_units.md``), which heuristic answers (the constant-rate formula, the
schedule/momentum-weighted one, an adaptive optimizer's), and the caveat every heuristic
number carries (:data:`CAVEAT`).
"""

from __future__ import annotations

from typing import Any

from opacus_lastiterate.analysis._validation import check_delta
from opacus_lastiterate.analysis.last_iterate.adaptive_weights import ADAPTIVE_HEURISTIC_LABEL

__all__ = []

CAVEAT = (
    "last-iterate heuristic (Steinke et al., ICLR 2025) for the final model only; "
    "exact for linear losses, not a proven DP bound for deep networks"
)
"""What the accountant's heuristic is and is not (its summary and ``repr`` end with it)."""


def summary(accountant: Any, delta: float | None = None) -> str:
    """The lines of ``accountant.describe(delta)`` (a ``LastIterateAccountant``, read through
    its public properties): its steps and unit, the formula that
    answers, and with ``delta`` the heuristic epsilon (and the robust one, where it has a
    model: constant-rate steps, one record)."""
    unit = accountant.unit
    lines = [
        f"LastIterateAccountant: {accountant.num_steps} steps in {len(accountant)} "
        f"segment(s); privacy unit: {unit.describe()}."
    ]
    accuracy = f"rounded up to within {accountant.weight_accuracy:g} relative"
    if accountant.uses_weights and accountant.heuristic_label == ADAPTIVE_HEURISTIC_LABEL:
        optimizer = accountant.adaptive_optimizer
        lines.append(
            f"Adaptive optimizer ({optimizer}) recorded from the optimizer: weighted heuristic "
            f"({ADAPTIVE_HEURISTIC_LABEL}), {accuracy}."
        )
    elif accountant.uses_weights:
        lines.append(
            "Learning-rate schedule / momentum / weight decay recorded from the optimizer: "
            f"weighted heuristic, {accuracy}."
        )
    else:
        unusable = "; the optimizer's settings could not be used" if (
            accountant.settings_unusable
        ) else ""
        lines.append(f"Constant-rate formula (plain SGD at a constant learning rate{unusable}).")
    if delta is not None:
        d = check_delta(delta)
        eps = accountant.get_epsilon(d)
        of_unit = "" if unit.is_record else f" ({unit.label()})"
        lines.append(f"Heuristic epsilon{of_unit} at delta={d:g}: {eps:.4f}.")
        if not accountant.uses_weights and accountant.num_steps and unit.single_record:
            robust = accountant.get_epsilon(d, robust=True)
            above = " (above the plain value: report it)." if robust > eps * (1 + 1e-9) else "."
            lines.append(
                f"Robust heuristic epsilon (max over the last t <= T steps): {robust:.4f}{above}"
            )
    lines.append(f"This is the {CAVEAT}.")
    return "\n".join(lines)
