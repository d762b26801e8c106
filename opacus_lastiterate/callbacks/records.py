"""What the privacy monitor produces: one :class:`EpsilonRecord` per optimizer step.

Each epsilon field is named after the privacy model that computed it, ``<model>_epsilon``
with the model's registry name (:mod:`opacus_lastiterate.analysis.privacy_models`:
``heuristic``, ``robust_heuristic``, ``standard``; ``corrected`` is the normalisation
accountant's, ``asgm`` or ``feasgm``). ``opacus_rdp`` is Opacus's RDP accountant composed
step by step (:class:`~opacus_lastiterate.accountants.IncrementalRDP`: Opacus's orders,
per-step RDP and conversion, its ``get_epsilon`` to the last bit), not the registry's
``"standard_rdp"`` (dp_accounting's orders and fractional-order bound, which can be larger);
on a run whose batches come in epochs it holds that scheme's no-amplification bound (the
registry's ``"standard_rdp"`` for it). Each field carries a label in :data:`LABELS`
saying what kind of number it is (heuristic, upper bound); a field that was not computed at a
step is ``None``. The labels depend on the run: its sampling scheme (``sampling``); for an
adaptive optimizer (Adam, AdamW, ...), the optimizer whose frozen-second-moment weights the
heuristic uses (``optimizer``: the heuristic is then labelled
:data:`~opacus_lastiterate.analysis.last_iterate.adaptive_weights.ADAPTIVE_HEURISTIC_LABEL`,
``docs/adaptive_optimizers.md``); and what the numbers protect, ``privacy_unit``
(``"record"``, ``"user(k)"``, ``"group(k)"``: the accountant's unit, ``docs/privacy_units.md``):
for a unit of more than one record the heuristic and standard fields are that unit's, the
robust heuristic is not computed (no model) and the fields of Opacus's and the normalisation
accountants stay one record's, each so labelled. :meth:`EpsilonRecord.labels` derives the
labels from the record (:func:`labels_for`). :class:`MonitorAudit` is what the monitor needs
from an in-training audit that reads the records as they are emitted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from opacus_lastiterate.analysis.last_iterate.adaptive_weights import (
    ADAPTIVE_HEURISTIC_LABEL,
    ADAPTIVE_WEIGHT_OPTIMIZERS,
)
from opacus_lastiterate.analysis.privacy_unit import PrivacyUnit

__all__ = [
    "LABELS",
    "EpsilonRecord",
    "MonitorAudit",
]

SAMPLING_LABELS: dict[str, str] = {
    "opacus_rdp_epsilon": "standard (all iterates), upper bound without amplification for "
    "this run's batches",
    "standard_epsilon": "standard (all iterates), upper bound without amplification for "
    "this run's batches",
    "poisson_assumed_epsilon": "assumes Poisson sampling: not a guarantee for this run "
    "(Opacus's number for it)",
    "corrected_epsilon": "normalisation accountant (asgm/feasgm): its divisor model assumes "
    "Poisson sampling, not a guarantee for this run",
}
"""The labels that differ from :data:`LABELS` when the run's batches are not Poisson
(shuffled, deterministic, balls-in-bins: the record's ``sampling``)."""

LABELS: dict[str, str] = {
    "heuristic_epsilon": "last-iterate heuristic, final model only, not a DP guarantee",
    "robust_heuristic_epsilon": "robust heuristic: certified max over the last t <= T steps",
    "opacus_rdp_epsilon": "standard (all iterates), Opacus's RDP accountant (its orders), "
    "upper bound",
    "standard_epsilon": "standard (all iterates), dp_accounting PLD upper bound (tight)",
    "poisson_assumed_epsilon": "assumes Poisson sampling: not a guarantee for this run",
    "corrected_epsilon": "normalisation accountant (asgm/feasgm), docs/normalisation.md",
}
"""What each epsilon field of an :class:`EpsilonRecord` is."""


@dataclass(frozen=True)
class EpsilonRecord:
    """The privacy state after one optimizer step (``None``: not computed at this step)."""

    step: int
    delta: float
    heuristic_epsilon: float | None
    robust_heuristic_epsilon: float | None
    opacus_rdp_epsilon: float
    standard_epsilon: float | None
    corrected_epsilon: float | None
    lr: float | None
    noise_multiplier: float
    sample_rate: float
    final: bool = False
    physical_steps: int | None = None
    """``optimizer.step()`` calls up to this step: with virtual steps
    (``BatchMemoryManager``) several per logical (noisy) step; ``step`` counts logical
    steps. None when the monitor counted none for this step."""
    sampling: str = "poisson"
    poisson_assumed_epsilon: float | None = None
    optimizer: str | None = None
    """The adaptive optimizer whose frozen-second-moment weights ``heuristic_epsilon`` uses
    (torch's lower-case class name, as the command line's ``--optimizer``: ``"adam"``,
    ``"adamw"``, ...; :data:`ADAPTIVE_WEIGHT_OPTIMIZERS`), which :meth:`labels` turns into the
    label "heuristic; adaptive second moment treated as fixed"; None when the heuristic is
    SGD's (the constant-rate formula, or SGD's schedule and momentum weights)."""
    privacy_unit: str = "record"
    """What the numbers protect: ``"record"``, ``"user(k)"`` or ``"group(k)"``
    (:meth:`~opacus_lastiterate.analysis.privacy_unit.PrivacyUnit.code`)."""

    def __post_init__(self) -> None:
        if self.optimizer is not None and self.optimizer not in ADAPTIVE_WEIGHT_OPTIMIZERS:
            raise ValueError(
                f"`optimizer` must be None or one of {', '.join(ADAPTIVE_WEIGHT_OPTIMIZERS)}, "
                f"got {self.optimizer!r}."
            )
        PrivacyUnit.parse(self.privacy_unit, "privacy_unit")

    def labels(self) -> dict[str, str]:
        """What each epsilon field of this record is, for its run's sampling scheme
        (``sampling``: ``"poisson"``, ``"shuffled"``, ``"deterministic"``, ``"balls_in_bins"``,
        or ``"unknown (assumes <scheme>)"``), adaptive optimizer (``optimizer``) and privacy
        unit (``privacy_unit``)."""
        return labels_for(self.sampling, self.optimizer, self.privacy_unit)

    def as_dict(self) -> dict[str, Any]:
        """The fields as a plain dict, in :data:`FIELDS` order."""
        return {f: getattr(self, f) for f in FIELDS}

    def epsilons(self) -> dict[str, float]:
        """The epsilon fields computed at this step."""
        return {k: v for k in LABELS if (v := getattr(self, k)) is not None}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> EpsilonRecord:
        """The record of :meth:`as_dict`.

        Raises:
            ValueError: unless the keys are exactly the fields (:data:`FIELDS`), with an
                ``optimizer`` that is None or an adaptive optimizer's name and a
                ``privacy_unit`` that is a unit's short form.
        """
        if set(values) != set(FIELDS):
            raise ValueError(f"a record must have the keys {FIELDS}, got {sorted(values)}.")
        return cls(**values)


def sampling_field(scheme: object) -> str:
    """The record's ``sampling`` value of a scheme (``None``: ``"poisson"``)."""
    name = getattr(scheme, "name", None)
    if scheme is None or name is None:
        return "poisson"
    if name == "unknown":
        assumed = getattr(scheme, "assumed", None)
        return f"unknown (assumes {getattr(assumed, 'name', 'poisson')})"
    return str(name)


def labels_for(
    sampling: str, optimizer: str | None = None, privacy_unit: str = "record"
) -> dict[str, str]:
    """The labels of the epsilon fields of a run whose scheme is called ``sampling``: the
    heuristics are always for that scheme; the standard fields are the Poisson composition
    for Poisson runs and the bound without amplification otherwise (:data:`SAMPLING_LABELS`);
    an unknown sampler's labels say which scheme they assume. With an adaptive ``optimizer``
    (:attr:`EpsilonRecord.optimizer`) the heuristic is labelled "heuristic; adaptive second
    moment treated as fixed", and the robust heuristic as the constant-rate formula's (it
    does not read the optimizer's weights). For a ``privacy_unit`` other than ``"record"``
    each label says what its number protects (module docstring)."""
    out = dict(LABELS)
    if optimizer is not None:
        out["heuristic_epsilon"] = (
            f"last-iterate {ADAPTIVE_HEURISTIC_LABEL} ({optimizer} weights; an approximation "
            "on top of a heuristic), final model only, not a DP guarantee"
        )
        out["robust_heuristic_epsilon"] = (
            f"{LABELS['robust_heuristic_epsilon']}, of the constant-rate formula (not the "
            f"{optimizer} weights)"
        )
    if sampling == "poisson" or sampling.endswith("(assumes poisson)"):
        del out["poisson_assumed_epsilon"]  # the standard fields are Poisson's already
    else:
        out.update(SAMPLING_LABELS)
        if sampling.startswith("balls_in_bins") or sampling.endswith("(assumes balls_in_bins)"):
            out["standard_epsilon"] = (
                "standard (all iterates), random-allocation upper bound (pld-accounting; "
                "the bound without amplification when that extra is not installed)"
            )
    if sampling != "poisson":
        out = {k: f"{v} [batches: {sampling}]" for k, v in out.items()}
    unit = PrivacyUnit.parse(privacy_unit, "privacy_unit")
    if not unit.is_record:
        out = {k: f"{v} [{_UNIT_NOTES.get(k, 'protects ' + unit.describe())}]"
               for k, v in out.items()}
        if not unit.single_record:
            out["robust_heuristic_epsilon"] = f"not computed: no robust heuristic for {unit.code()}"
    return out


_UNIT_NOTES = {
    "opacus_rdp_epsilon": "protects one record only, not the run's unit",
    "corrected_epsilon": "protects one record only, not the run's unit",
    "poisson_assumed_epsilon": "protects one record only, not the run's unit",
}
"""The fields that stay one record's for a run of another unit (:func:`labels_for`)."""


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
