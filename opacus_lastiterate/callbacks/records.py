"""What the privacy monitor produces: one :class:`EpsilonRecord` per optimizer step.

Each epsilon field is named after the privacy model that computed it and carries a label in
:data:`LABELS` saying what kind of number it is (heuristic, upper bound); a field that was not
computed at a step is ``None``. :class:`MonitorAudit` is what the monitor needs from an
in-training audit that reads the records as they are emitted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["FIELDS", "LABELS", "EpsilonRecord", "MonitorAudit", "Sink"]

LABELS: dict[str, str] = {
    "heuristic_epsilon": "last-iterate heuristic, final model only, not a DP guarantee",
    "robust_epsilon": "robust heuristic: certified max over the last t <= T steps",
    "standard_epsilon_rdp": "standard (all iterates), RDP upper bound (min over orders)",
    "standard_epsilon_pld": "standard (all iterates), dp_accounting PLD upper bound (tight)",
    "corrected_epsilon": "normalisation accountant (asgm/feasgm), docs/normalisation.md",
}
"""What each epsilon field of an :class:`EpsilonRecord` is."""


@dataclass(frozen=True)
class EpsilonRecord:
    """The privacy state after one optimizer step (``None``: not computed at this step)."""

    step: int
    delta: float
    heuristic_epsilon: float | None
    robust_epsilon: float | None
    standard_epsilon_rdp: float
    standard_epsilon_pld: float | None
    corrected_epsilon: float | None
    lr: float | None
    noise_multiplier: float
    sample_rate: float
    final: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The fields as a plain dict, in :data:`FIELDS` order."""
        return {f: getattr(self, f) for f in FIELDS}

    def epsilons(self) -> dict[str, float]:
        """The epsilon fields computed at this step."""
        return {k: v for k in LABELS if (v := getattr(self, k)) is not None}


FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(EpsilonRecord))
"""Field names of :class:`EpsilonRecord`, in order (the CSV header)."""

Sink = Callable[[EpsilonRecord], None]
"""Where records go: any callable taking an :class:`EpsilonRecord`."""


@runtime_checkable
class MonitorAudit(Protocol):
    """What the monitor needs from an in-training audit (``monitor.audit``): ``on_step``
    after every emitted record, ``finish`` once at ``PrivacyMonitor.finish``; what
    ``finish`` returns is kept in ``PrivacyMonitor.audit_result``."""

    def on_step(self, record: EpsilonRecord) -> None: ...

    def finish(self) -> Any: ...
