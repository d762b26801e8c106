"""Is the divisor of (sum + Z) / c public? The FEASGM / EASGM verdict for one data set size.

``docs/normalisation.md``, "FEASGM / EASGM with a data-dependent divisor": compare the
neighbours N - 1, N, N + 1.

* If the divisor c and the sampling rate q are the same for all three, the released vector
  is a public rescaling of SGM and the SGM guarantee (any standard accountant) holds exactly:
  "safe for this N".
* If c or q differs between two neighbours, no finite worst-case guarantee exists: the norm
  of the update reveals c (relative precision about 1 / sqrt(2d)), a change of q also changes
  the number of steps per epoch, and as d grows the two output distributions separate
  completely. The sound answer is epsilon = inf: "unsafe".

The fix is a public divisor: a user-given constant expected batch size and sample rate,
independent of len(dataset) (always safe).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from opacus_lastiterate.analysis._validation import (
    check_int,
)
from opacus_lastiterate.analysis.normalisation.opacus_arithmetic import (
    OpacusBatchArithmetic,
    opacus1x_batch_arithmetic,
)

__all__ = [
    "DivisorVerdict",
    "unsafe_dataset_sizes",
]

Verdict = Literal["safe", "unsafe"]


@dataclass(frozen=True)
class DivisorVerdict:
    """Divisors and sample rates of the neighbours N - 1, N, N + 1, and the verdict.

    Attributes:
        dataset_size: N.
        rule: how c and q are derived: ``"opacus-1.x"`` or ``"public"``.
        dataset_sizes: (N - 1, N, N + 1).
        divisors: the divisor c for each neighbour.
        sample_rates: the probability with which records are really sampled.
        accountant_rates: the sample rate the accountant is given (Opacus 1.x: 1 / s).
        steps_per_epoch: steps per epoch for each neighbour (``None`` under a public rule,
            where the user fixes the number of steps).
        verdict: ``"safe"`` (the SGM guarantee holds exactly) or ``"unsafe"`` (epsilon = inf).
        reason: one or more sentences saying why.
    """

    dataset_size: int
    rule: str
    dataset_sizes: tuple[int, int, int]
    divisors: tuple[float, float, float]
    sample_rates: tuple[float, float, float]
    accountant_rates: tuple[float, float, float]
    steps_per_epoch: tuple[int, int, int] | None
    verdict: Verdict
    reason: str

    @property
    def safe(self) -> bool:
        """True when the SGM guarantee holds exactly for this N."""
        return self.verdict == "safe"


def _fmt(values: Iterable[float]) -> str:
    return ", ".join(f"{v:.10g}" for v in values)


def _opacus_reason(n: int, rows: tuple[OpacusBatchArithmetic, ...]) -> tuple[Verdict, str]:
    sizes = tuple(r.dataset_size for r in rows)
    divisors = tuple(r.expected_batch_size for r in rows)
    rates = tuple(r.sampler_rate for r in rows)
    steps = tuple(r.steps_per_epoch for r in rows)
    problems = []
    if len(set(divisors)) > 1:
        problems.append(
            f"the divisor expected_batch_size = int(N / len(DPDataLoader)) changes between "
            f"neighbours (N = {_fmt(sizes)}: c = {_fmt(divisors)}); the norm of the update "
            f"reveals it to relative precision about 1/sqrt(2 d)"
        )
    if len(set(rates)) > 1:
        problems.append(
            f"the sampling rate 1/len(DataLoader) changes (q = {_fmt(rates)}), and with it "
            f"the number of steps per epoch ({_fmt(steps)}), which training by epochs reveals"
        )
    if 0 in divisors:
        problems.append(
            f"expected_batch_size is 0 for N = {sizes[divisors.index(0)]}: the update is "
            f"inf/NaN there"
        )
    if problems:
        return "unsafe", (
            f"unsafe for N = {n}: " + "; ".join(problems) + ". No finite worst-case guarantee "
            "exists (epsilon = inf); the SGM epsilon Opacus prints does not hold."
        )
    row = rows[1]
    notes = ""
    if row.accountant_rate != row.sampler_rate:
        notes += (
            f" The accountant's q = 1/{row.steps_per_epoch} is above the sampler's "
            f"q = 1/{row.loader_length} (float artefact of int(1/(1/k))): conservative."
        )
    if row.expected_batch_size > row.batch_size:
        notes += f" The divisor {row.expected_batch_size} exceeds the batch size {row.batch_size}."
    return "safe", (
        f"safe for N = {n}: c = {row.expected_batch_size} and q = {row.sampler_rate:.10g} are "
        f"the same for N - 1, N, N + 1, so the update is a public rescaling of SGM and the SGM "
        f"guarantee holds exactly." + notes
    )


def feasgm_verdict(
    dataset_size: int, batch_size: int, *, drop_last: bool = False
) -> DivisorVerdict:
    """Verdict for Opacus 1.x ``make_private`` with N = ``dataset_size`` records and DataLoader
    batch size L = ``batch_size``, comparing Opacus's exact (q, c) for N - 1, N, N + 1."""
    n = check_int("dataset_size", dataset_size, minimum=2)
    b = check_int("batch_size", batch_size, minimum=1)
    if drop_last and n - 1 < b:
        raise ValueError(
            f"`dataset_size` must be > `batch_size` with drop_last=True (the neighbour N - 1 "
            f"must fill one batch), got dataset_size={n}, batch_size={b}."
        )
    rows = tuple(opacus1x_batch_arithmetic(m, b, drop_last=drop_last) for m in (n - 1, n, n + 1))
    verdict, reason = _opacus_reason(n, rows)
    return DivisorVerdict(
        dataset_size=n,
        rule="opacus-1.x",
        dataset_sizes=(n - 1, n, n + 1),
        divisors=tuple(float(r.expected_batch_size) for r in rows),  # type: ignore[arg-type]
        sample_rates=tuple(r.sampler_rate for r in rows),  # type: ignore[arg-type]
        accountant_rates=tuple(r.accountant_rate for r in rows),  # type: ignore[arg-type]
        steps_per_epoch=tuple(r.steps_per_epoch for r in rows),  # type: ignore[arg-type]
        verdict=verdict,
        reason=reason,
    )


def unsafe_dataset_sizes(
    batch_size: int, *, start: int, stop: int, drop_last: bool = False
) -> list[int]:
    """All N in [``start``, ``stop``) for which :func:`feasgm_verdict` is unsafe."""
    b = check_int("batch_size", batch_size, minimum=1)
    lo = check_int("start", start, minimum=(b + 1) if drop_last else 2)
    hi = check_int("stop", stop, minimum=lo)
    rows = {m: opacus1x_batch_arithmetic(m, b, drop_last=drop_last) for m in range(lo - 1, hi + 1)}
    key = {m: (r.expected_batch_size, r.sampler_rate) for m, r in rows.items()}
    return [
        n for n in range(lo, hi) if key[n - 1] != key[n] or key[n] != key[n + 1] or key[n][0] == 0
    ]
