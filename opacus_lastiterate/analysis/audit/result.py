"""The immutable result of an audit: a number, what it is, and how it was obtained."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from opacus_lastiterate.analysis._validation import check_in_interval, check_int

__all__ = [
    "AuditResult",
]

#: ``"bound"``: valid lower bound at the stated confidence, no assumption on the mechanism;
#: ``"estimate"``: valid only under a stated assumption (a Gaussian trade-off curve);
#: ``"invalid"``: the statistical argument does not hold (threshold maximised on the same
#: scores without correction, one-run canaries not included by fair coins): neither a
#: bound nor a calibrated estimate. Only ``"bound"`` may be read as a lower bound.
AuditKind = Literal["bound", "estimate", "invalid"]
AUDIT_KINDS: tuple[AuditKind, ...] = ("bound", "estimate", "invalid")


def result_kind(base: AuditKind, statistically_valid: bool) -> AuditKind:
    """``base`` if the procedure was valid, ``"invalid"`` otherwise (package-internal)."""
    return base if statistically_valid else "invalid"


@dataclass(frozen=True)
class MultiRunCounts:
    """Error counts of one threshold test (``docs/auditing.md``, "Pipeline (multi-run)", step 4).

    Attributes:
        num_in: runs (or samples) with the canary included.
        num_out: runs without it.
        false_positives: out-runs the test called "in".
        false_negatives: in-runs the test called "out".
    """

    num_in: int
    num_out: int
    false_positives: int
    false_negatives: int

    def __post_init__(self) -> None:
        check_int("num_in", self.num_in, minimum=1)
        check_int("num_out", self.num_out, minimum=1)
        fp = check_int("false_positives", self.false_positives)
        fn = check_int("false_negatives", self.false_negatives)
        if fp > self.num_out:
            raise ValueError(f"`false_positives` must be in [0, {self.num_out}], got {fp}.")
        if fn > self.num_in:
            raise ValueError(f"`false_negatives` must be in [0, {self.num_in}], got {fn}.")

    def __str__(self) -> str:
        return f"FP {self.false_positives}/{self.num_out}, FN {self.false_negatives}/{self.num_in}"


@dataclass(frozen=True)
class OneRunCounts:
    """Counts of a one-run audit (``docs/auditing.md``, "One run").

    Attributes:
        num_canaries: m, canaries each included by an independent fair coin.
        num_guesses: r, canaries on which the auditor did not abstain.
        num_correct: v, correct guesses.
    """

    num_canaries: int
    num_guesses: int
    num_correct: int

    def __post_init__(self) -> None:
        m = check_int("num_canaries", self.num_canaries, minimum=1)
        r = check_int("num_guesses", self.num_guesses)
        v = check_int("num_correct", self.num_correct)
        if r > m:
            raise ValueError(f"`num_guesses` must be in [0, {m}], got {r}.")
        if v > r:
            raise ValueError(f"`num_correct` must be in [0, {r}], got {v}.")

    def __str__(self) -> str:
        return (
            f"{self.num_correct}/{self.num_guesses} guesses correct, {self.num_canaries} canaries"
        )


AuditCounts = MultiRunCounts | OneRunCounts


@runtime_checkable
class DescribedStrategy(Protocol):
    """What a result keeps of the strategy that selected its threshold: an object that says
    in words what it did. Every
    :class:`~opacus_lastiterate.analysis.audit.threshold_strategies.ThresholdStrategy` is one
    (this module does not import the strategies, which build results)."""

    def describe(self) -> str: ...

AUDIT_RESULT_FIELDS: tuple[str, ...] = (
    "epsilon",
    "delta",
    "confidence",
    "method",
    "kind",
    "statistically_valid",
    "counts",
    "threshold",
    "selection",
    "mu",
    "notes",
    "summary",
)
"""The keys of :meth:`AuditResult.as_dict` by default, in order: the attributes, ``counts``
as a dict, ``selection`` (the strategy's description when the audit stated none) and
``summary`` (``str(result)``)."""

_COUNT_FIELDS: tuple[str, ...] = (
    "num_in",
    "num_out",
    "false_positives",
    "false_negatives",
    "num_canaries",
    "num_guesses",
    "num_correct",
)


@dataclass(frozen=True)
class AuditResult:
    """An audit's epsilon and everything needed to read it honestly.

    Attributes:
        epsilon: the epsilon lower bound (``kind == "bound"``) or estimate.
        delta: the delta at which epsilon is stated.
        confidence: overall confidence level of the procedure (1 - significance).
        method: how counts became epsilon, e.g. ``"clopper-pearson"``,
            ``"gaussian-dp"``, ``"one-run"``.
        kind: ``"bound"`` (assumption-free lower bound), ``"estimate"`` (relies on an
            assumption, e.g. a Gaussian trade-off curve) or ``"invalid"`` (the procedure's
            confidence is not honest); see :data:`AuditKind`.
        counts: the counts at the selected threshold.
        threshold_strategy: the strategy object that selected the threshold.
        threshold: the selected threshold (None when the audit was given counts).
        selection: what the strategy did on these scores, in words.
        mu: the Gaussian-DP mu lower bound (GDP audits only).
        statistically_valid: False when the confidence level is not honest (naive
            maximum over thresholds, non-randomised one-run canaries); exactly when
            ``kind == "invalid"``.
        notes: further caveats, one sentence each.
    """

    epsilon: float
    delta: float
    confidence: float
    method: str
    kind: AuditKind
    counts: AuditCounts
    threshold_strategy: DescribedStrategy | None = None
    threshold: float | None = None
    selection: str = ""
    mu: float | None = None
    statistically_valid: bool = True
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not (self.epsilon >= 0.0):
            raise ValueError(f"`epsilon` must be >= 0, got {self.epsilon!r}.")
        check_in_interval("delta", self.delta, 0.0, 1.0, low_open=False)
        check_in_interval("confidence", self.confidence, 0.0, 1.0)
        if self.kind not in AUDIT_KINDS:
            raise ValueError(f"`kind` must be one of {AUDIT_KINDS}, got {self.kind!r}.")
        if (self.kind == "invalid") == bool(self.statistically_valid):
            raise ValueError(
                "`kind` must be 'invalid' exactly when `statistically_valid` is False, got "
                f"kind={self.kind!r}, statistically_valid={self.statistically_valid!r}."
            )
        object.__setattr__(self, "notes", tuple(self.notes))

    def as_dict(self, fields: Sequence[str] = AUDIT_RESULT_FIELDS) -> dict[str, Any]:
        """A JSON-friendly dict of the result (non-finite floats stay floats).

        Args:
            fields: the keys, in order: any of :data:`AUDIT_RESULT_FIELDS`, or the name of a
                field of either counts type (``num_in``, ``num_out``, ``false_positives``,
                ``false_negatives``, ``num_canaries``, ``num_guesses``, ``num_correct``): that
                field of :attr:`counts`, None when the counts have no such field.
        """
        if isinstance(fields, str) or not isinstance(fields, Sequence):
            raise TypeError(f"`fields` must be a sequence of field names, got {fields!r}.")
        values: dict[str, Any] = {}
        for name in fields:
            if name == "counts":
                values[name] = asdict(self.counts)
            elif name == "selection":
                strategy = self.threshold_strategy
                values[name] = self.selection or (strategy.describe() if strategy else "")
            elif name == "notes":
                values[name] = list(self.notes)
            elif name == "summary":
                values[name] = str(self)
            elif name in AUDIT_RESULT_FIELDS:
                values[name] = getattr(self, name)
            elif name in _COUNT_FIELDS:
                values[name] = getattr(self.counts, name, None)
            else:
                raise ValueError(
                    f"`fields` must name fields of {AUDIT_RESULT_FIELDS + _COUNT_FIELDS}, "
                    f"got {name!r}."
                )
        return values

    @property
    def is_bound(self) -> bool:
        """True for an assumption-free, statistically valid lower bound."""
        return self.kind == "bound"

    def __str__(self) -> str:
        eps = "inf" if math.isinf(self.epsilon) else f"{self.epsilon:.4g}"
        conf = f"{100 * self.confidence:.4g}%"
        if self.kind == "bound":
            head = f"epsilon >= {eps} at delta = {self.delta:g} ({conf} confidence)"
            label = "lower bound"
        elif self.kind == "estimate":
            head = (
                f"NOT A VALID BOUND (estimate, assumes a Gaussian trade-off): epsilon ~ {eps} "
                f"at delta = {self.delta:g}"
            )
            label = "ESTIMATE"
            if self.mu is not None:
                label += f"; mu >= {self.mu:.4g} at {conf} confidence (valid against mu-GDP)"
        else:
            head = (
                f"NOT A VALID BOUND (statistically invalid procedure): epsilon ~ {eps} at "
                f"delta = {self.delta:g}"
            )
            label = f"nominal {conf} confidence not honest"
        parts = [label, f"method: {self.method}", str(self.counts)]
        if self.selection:
            parts.append(self.selection)
        elif self.threshold_strategy is not None:
            parts.append(self.threshold_strategy.describe())
        if self.threshold is not None:
            parts.append(f"threshold {self.threshold:.6g}")
        text = f"{head} [{'; '.join(parts)}]"
        for note in self.notes:
            text += f"\n  note: {note}"
        return text
