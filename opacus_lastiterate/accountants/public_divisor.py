"""The fix for FEASGM: make an Opacus 1.x ``DPOptimizer`` divide by a public constant.

``docs/normalisation.md``, "FEASGM / EASGM with a data-dependent divisor": Opacus 1.0-1.6
``make_private`` sets ``optimizer.expected_batch_size = int(len(dataset) * sample_rate)``
with ``sample_rate = 1 / len(data_loader)``, and ``DPOptimizer.scale_grad`` then computes
(identically in 1.5.4 and 1.6.0, ``loss_reduction="mean"`` only)::

    p.grad /= optimizer.expected_batch_size * optimizer.accumulated_iterations

so the divisor is a function of the private N. One line replaces it by a constant the user
chooses, independent of len(dataset)::

    model, optimizer, loader = engine.make_private(...)
    use_public_divisor(optimizer, expected_batch_size=256)

Every later step releases (sum + Z) / (256 * accumulated_iterations): a public rescaling of
the subsampled Gaussian mechanism (EASGM with a public c), so the SGM guarantee holds as far
as the divisor is concerned. ``accumulated_iterations`` is 1 with Poisson sampling (Opacus
forbids gradient accumulation there). The *sample rate* 1 / len(data_loader) is still derived
from N; it is the same for N - 1, N, N + 1 unless ceil(N / L) changes between them, which the
``"feasgm"`` accountant checks (:class:`~opacus_lastiterate.accountants.FEASGMAccountant`).
With ``distributed=True`` the value is per worker, as Opacus's own ``expected_batch_size``.
"""

from __future__ import annotations

from collections.abc import Sequence

from opacus.optimizers import DPOptimizer

from opacus_lastiterate.analysis._validation import check_positive
from opacus_lastiterate.analysis.normalisation.divisor_verdict import DivisorVerdict

__all__ = [
    "public_divisor_of",
    "use_public_divisor",
]

PUBLIC_DIVISOR_ATTRIBUTE = "_opacus_lastiterate_public_divisor"
"""Attribute set on the optimizer by :func:`use_public_divisor` (read by the accountants)."""


def _check_optimizer(optimizer: object) -> DPOptimizer:
    if not isinstance(optimizer, DPOptimizer):
        raise TypeError(
            f"`optimizer` must be an opacus.optimizers.DPOptimizer (the optimizer returned by "
            f"PrivacyEngine.make_private), got {type(optimizer).__name__}."
        )
    return optimizer


def use_public_divisor(optimizer: DPOptimizer, *, expected_batch_size: float) -> DPOptimizer:
    """Make ``optimizer`` divide the noisy gradient sum by the public constant
    ``expected_batch_size`` instead of Opacus's int(len(dataset) * sample_rate)
    (``docs/normalisation.md``, "The fix: a public divisor").

    Args:
        optimizer: the ``DPOptimizer`` returned by ``make_private`` (any subclass).
        expected_batch_size: the divisor, a real number in (0, inf) chosen without looking at
            the data (for example the DataLoader batch size); per worker when distributed.

    Returns:
        The same optimizer, changed in place (so the call can wrap ``make_private``'s result).

    Raises:
        TypeError, ValueError: if ``optimizer`` is not a DPOptimizer, if it uses
            ``loss_reduction="sum"`` (there is no divisor to fix: the SGM guarantee already
            applies to the sum), or if ``expected_batch_size`` is not in (0, inf). Nothing is
            changed then.
    """
    opt = _check_optimizer(optimizer)
    value = check_positive("expected_batch_size", expected_batch_size)
    if getattr(opt, "loss_reduction", "mean") != "mean":
        raise ValueError(
            f"`optimizer.loss_reduction` must be 'mean' for a divisor to matter, got "
            f"{opt.loss_reduction!r}: with 'sum' Opacus releases the noisy sum itself, which "
            "the SGM guarantee already covers."
        )
    divisor: float | int = int(value) if float(value).is_integer() else value
    opt.expected_batch_size = divisor
    setattr(opt, PUBLIC_DIVISOR_ATTRIBUTE, divisor)
    return opt


def public_divisor_of(optimizer: DPOptimizer) -> float | None:
    """The public divisor set by :func:`use_public_divisor`, or None if none is set or
    ``optimizer.expected_batch_size`` was changed afterwards (then it is not known to be
    public)."""
    opt = _check_optimizer(optimizer)
    marked = getattr(opt, PUBLIC_DIVISOR_ATTRIBUTE, None)
    if marked is None or opt.expected_batch_size != marked:
        return None
    return float(marked)


def _fmt(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.10g}" for v in values)


def public_divisor_verdict_at_opacus_rate(
    opacus: DivisorVerdict, divisor: float, *, summed: bool
) -> DivisorVerdict:
    """The verdict when the divisor is public but the sample rate is still Opacus's 1/k
    (``opacus``: Opacus 1.x's verdict for the same N and L; ``summed``: the noisy sum itself
    is released, ``loss_reduction="sum"``)."""
    n = opacus.dataset_size
    source = (
        "loss_reduction='sum': the noisy sum itself is released"
        if summed
        else f"the divisor {divisor:g} is a public constant (use_public_divisor / configure)"
    )
    same_rate = len(set(opacus.sample_rates)) == 1 and len(set(opacus.accountant_rates)) == 1
    if same_rate:
        verdict, reason = (
            "safe",
            (
                f"safe for N = {n}: {source}, and the sampling rate 1/len(DataLoader) = "
                f"{opacus.sample_rates[1]:.10g} is the same for N - 1, N, N + 1, so the update is a "
                "public rescaling of SGM and the SGM guarantee holds exactly."
            ),
        )
    else:
        verdict, reason = (
            "unsafe",
            (
                f"unsafe for N = {n}: {source}, but the sampling rate 1/len(DataLoader) changes "
                f"between neighbours (N = {_fmt(opacus.dataset_sizes)}: q = "
                f"{_fmt(opacus.sample_rates)}), and with it the number of steps per epoch "
                f"({_fmt(opacus.steps_per_epoch or ())}). No finite worst-case guarantee exists "
                "(epsilon = inf); pick a batch size with the same ceil(N/L) for N - 1, N, N + 1, "
                "or fix the sample rate and the number of steps."
            ),
        )
    return DivisorVerdict(
        dataset_size=n,
        rule="public divisor, opacus-1.x sample rate",
        dataset_sizes=opacus.dataset_sizes,
        divisors=(divisor, divisor, divisor),
        sample_rates=opacus.sample_rates,
        accountant_rates=opacus.accountant_rates,
        steps_per_epoch=opacus.steps_per_epoch,
        verdict=verdict,  # type: ignore[arg-type]
        reason=reason,
    )
