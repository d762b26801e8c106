"""Opacus 1.x's sample rate and divisor, reproduced to the last floating-point bit.

``make_private(poisson_sampling=True)`` (Opacus 1.0-1.6; ``docs/normalisation.md``,
"Opacus's divisor arithmetic"; 1.6.0 privacy_engine.py:440-441, data_loader.py:349,
utils/uniform_sampler.py:52-55) computes, from N = len(dataset) and the user's batch size L:

    k        = len(DataLoader(dataset, batch_size=L))   = ceil(N / L)   (N // L with drop_last)
    q_s      = 1 / k                                     DPDataLoader's sampling probability
    s        = int(1 / q_s)                              len(DPDataLoader): steps per epoch
    q_a      = 1 / s                                     make_private's sample_rate (accountant)
    c        = int(N * q_a)                              expected_batch_size: the divisor

all in IEEE double arithmetic. ``int(1 / (1 / k))`` is k - 1 for some k (93, 99, 105, ...),
so q_a can exceed q_s and c can exceed L (N = 9300, L = 100 gives c = 101), and
``int(N * (1 / k))`` can round down at exact multiples (N = 147, L = 3 gives c = 2; N = 49,
L = 1 gives c = 0 and a NaN model). The textbook floor(N / ceil(N / L)) is not what runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from opacus_lastiterate.analysis._validation import check_int

__all__ = []


@dataclass(frozen=True)
class OpacusBatchArithmetic:
    """What Opacus 1.x derives from (N, L); field names follow the formulas above.

    Attributes:
        dataset_size: N.
        batch_size: L, the user's DataLoader batch size.
        drop_last: the user's DataLoader ``drop_last``.
        loader_length: k = len(user DataLoader).
        sampler_rate: q_s = 1 / k, the probability with which records are really sampled.
        steps_per_epoch: s = int(1 / q_s) = len(DPDataLoader).
        accountant_rate: q_a = 1 / s, the sample rate handed to the accountant.
        expected_batch_size: c = int(N * q_a), the divisor of the noisy sum.
    """

    dataset_size: int
    batch_size: int
    drop_last: bool
    loader_length: int
    sampler_rate: float
    steps_per_epoch: int
    accountant_rate: float
    expected_batch_size: int


def opacus1x_batch_arithmetic(
    dataset_size: int, batch_size: int, *, drop_last: bool = False
) -> OpacusBatchArithmetic:
    """Reproduce ``make_private``'s (q_s, s, q_a, c) for N = ``dataset_size`` and L =
    ``batch_size`` exactly as Opacus 1.0-1.6 computes them (see the module docstring)."""
    n = check_int("dataset_size", dataset_size, minimum=1)
    b = check_int("batch_size", batch_size, minimum=1)
    if not isinstance(drop_last, bool):
        raise TypeError(f"`drop_last` must be a bool, got {drop_last!r}.")
    # torch.utils.data.BatchSampler.__len__ (integer arithmetic)
    k = n // b if drop_last else (n + b - 1) // b
    if k == 0:
        raise ValueError(
            f"`batch_size` must be <= `dataset_size` with drop_last=True (the DataLoader "
            f"is empty and Opacus divides by its length), got {b} > {n}."
        )
    sampler_rate = 1 / k  # DPDataLoader.from_data_loader: sample_rate=1 / len(data_loader)
    steps = int(1 / sampler_rate)  # UniformWithReplacementSampler.steps
    accountant_rate = 1 / steps  # make_private: sample_rate = 1 / len(data_loader)
    divisor = int(n * accountant_rate)  # expected_batch_size
    return OpacusBatchArithmetic(
        dataset_size=n,
        batch_size=b,
        drop_last=drop_last,
        loader_length=k,
        sampler_rate=sampler_rate,
        steps_per_epoch=steps,
        accountant_rate=accountant_rate,
        expected_batch_size=divisor,
    )
