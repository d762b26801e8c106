"""Batch sizes with equal heuristic epsilon (``docs/cli.md``, "plan").

The last-iterate paper (Steinke et al., "The Last Iterate Advantage", arXiv 2410.06186,
Table 1) trains CIFAR-10 models at several batch sizes whose *heuristic* epsilon is about the
same, and finds about the same accuracy and audited epsilon while the standard epsilon differs
widely. :func:`plan_batch_sizes` computes such a table before training: for each expected
batch size B of a data set of N records, the Poisson rate q = B / N, the number of steps
(given, or ``round(epochs * N / B)``), the noise multiplier that meets the target epsilon
(:func:`~.calibration.calibrate_noise_multiplier`) and every epsilon of that configuration.

The column ``noise_per_example`` is sigma / B, the standard deviation of the noise in the
averaged clipped gradient in units of the clipping norm: at equal steps and learning rate, a
smaller value means less noisy updates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from opacus_lastiterate.analysis._validation import (
    check_delta,
    check_int,
    check_positive,
)
from opacus_lastiterate.analysis.baselines.composition import DEFAULT_DISCRETIZATION
from opacus_lastiterate.analysis.calibration import (
    Accountant,
    calibrate_noise_multiplier,
    canonical_accountant,
)
from opacus_lastiterate.analysis.comparison import compared_models
from opacus_lastiterate.analysis.run import DPSGDRun

__all__ = ["BatchSizePlan", "plan_batch_sizes"]


@dataclass(frozen=True)
class BatchSizePlan:
    """One row of :func:`plan_batch_sizes`: a configuration and its epsilons at ``delta``."""

    batch_size: int
    sample_rate: float
    steps: int
    epochs: float
    noise_multiplier: float
    noise_per_example: float
    heuristic: float
    robust_heuristic: float
    standard: float
    full_batch: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def _steps(batch_size: int, dataset_size: int, epochs: float | None, steps: int | None) -> int:
    if steps is not None:
        return steps
    assert epochs is not None
    return max(1, round(epochs * dataset_size / batch_size))


def plan_batch_sizes(
    target_epsilon: float,
    delta: float,
    *,
    dataset_size: int,
    batch_sizes: Sequence[int],
    epochs: float | None = None,
    steps: int | None = None,
    accountant: Accountant = "heuristic",
    value_discretization_interval: float = DEFAULT_DISCRETIZATION,
    rtol: float = 1e-4,
) -> list[BatchSizePlan]:
    """One :class:`BatchSizePlan` per batch size, each calibrated to ``target_epsilon``.

    Args:
        target_epsilon: the epsilon every row meets, > 0.
        delta: delta in (0, 1).
        dataset_size: N >= 1.
        batch_sizes: expected batch sizes B, each in [1, N].
        epochs: number of passes over the data (T = round(epochs * N / B)); or
        steps: the same number of steps T for every batch size (exactly one of the two).
        accountant: what is calibrated (``"heuristic"`` by default, as in the paper's Table 1;
            see :data:`~.calibration.CALIBRATED_ACCOUNTANTS`).
        value_discretization_interval: PLD interval of the standard epsilon.
        rtol: relative accuracy of each noise multiplier.
    """
    n = check_int("dataset_size", dataset_size, minimum=1)
    d = check_delta(delta)
    if (epochs is None) == (steps is None):
        raise ValueError("Pass exactly one of `epochs` and `steps`.")
    e = None if epochs is None else check_positive("epochs", epochs)
    t = None if steps is None else check_int("steps", steps, minimum=1)
    if isinstance(batch_sizes, (str, bytes)) or not isinstance(batch_sizes, Sequence):
        raise TypeError(f"`batch_sizes` must be a sequence of integers, got {batch_sizes!r}.")
    if not batch_sizes:
        raise ValueError("`batch_sizes` must not be empty.")
    sizes = [check_int("batch_sizes", b, minimum=1) for b in batch_sizes]
    for b in sizes:
        if b > n:
            raise ValueError(f"`batch_sizes` must be at most `dataset_size` ({n}), got {b}.")
    name = canonical_accountant(accountant)
    rows = []
    for b in sizes:
        q, steps_b = b / n, _steps(b, n, e, t)
        sigma = calibrate_noise_multiplier(
            target_epsilon,
            d,
            steps=steps_b,
            sample_rate=q,
            accountant=name,  # type: ignore[arg-type]
            value_discretization_interval=value_discretization_interval,
            rtol=rtol,
        )
        run = DPSGDRun.constant(steps=steps_b, sample_rate=q, noise_multiplier=sigma)
        models = compared_models(run, value_discretization_interval=value_discretization_interval)
        rows.append(
            BatchSizePlan(
                batch_size=b,
                sample_rate=q,
                steps=steps_b,
                epochs=steps_b * b / n,
                noise_multiplier=sigma,
                noise_per_example=sigma / b,
                **{k: m.epsilon(d) for k, m in models.items()},  # type: ignore[arg-type]
            )
        )
    return rows
