"""Baselines printed beside the heuristic (``docs/last_iterate.md``, "Baselines").

* Standard composition (every intermediate model released): the Poisson-subsampled Gaussian
  mechanism composed over the history with Google's ``dp_accounting`` PLDs: what its
  ``PLDAccountant`` composes (add/remove neighbours, pessimistic connect-the-dots
  discretisation of the privacy loss with interval ``value_discretization_interval``), each
  segment's one-step PLD built by ``subsampled_gaussian_pld``. The result is an upper bound
  on the exact value.
* Full-batch DP-GD with the same expected step and noise variance: q = 1 and noise
  multiplier sigma / q for each step, i.e. mu-GDP with mu^2 = sum_t (q_t / sigma_t)^2,
  in closed form.
"""

from __future__ import annotations

import math

from scipy import special

from opacus_lastiterate.analysis._validation import (
    check_in_interval,
    check_positive,
)
from opacus_lastiterate.analysis.baselines.gaussian_mechanism import (
    gaussian_delta,
    gaussian_epsilon,
)
from opacus_lastiterate.analysis.privacy_model import PrivacyModel
from opacus_lastiterate.analysis.run import DPSGDRun, RunLike, as_run

__all__ = [
    "DEFAULT_DISCRETIZATION",
    "FullBatchGaussian",
    "StandardComposition",
    "full_batch_epsilon",
    "standard_epsilon",
]

DEFAULT_DISCRETIZATION = 1e-4
"""Default ``value_discretization_interval`` of the PLD accountant (dp_accounting's own)."""


def standard_epsilon(
    delta: float,
    *,
    steps: int,
    sample_rate: float,
    noise_multiplier: float,
    value_discretization_interval: float = DEFAULT_DISCRETIZATION,
) -> float:
    """Composition epsilon for T = ``steps`` steps at constant (q, sigma)."""
    sigma = check_positive("noise_multiplier", noise_multiplier)
    run = DPSGDRun.constant(steps=steps, sample_rate=sample_rate, noise_multiplier=sigma)
    return StandardComposition(
        run, value_discretization_interval=value_discretization_interval
    ).epsilon(delta)


def full_batch_epsilon(
    delta: float, *, steps: int, sample_rate: float, noise_multiplier: float
) -> float:
    """Full-batch baseline for T steps: mu = q sqrt(T) / sigma."""
    sigma = check_positive("noise_multiplier", noise_multiplier)
    run = DPSGDRun.constant(steps=steps, sample_rate=sample_rate, noise_multiplier=sigma)
    return FullBatchGaussian(run).epsilon(delta)


# -- privacy models ------------------------------------------------------------------------


class StandardComposition(PrivacyModel):
    """Every intermediate model released: the Poisson-subsampled Gaussian mechanism composed
    over the run with dp_accounting's PLD accountant (pessimistic, an upper bound). A step
    without noise releases its gradient sum exactly: epsilon = inf, delta = 1. Per-step
    weights do not matter here (each step is released)."""

    kind = "upper_bound"
    label = "standard composition (all iterates released): dp_accounting PLD, upper bound"

    def __init__(
        self, run: RunLike, *, value_discretization_interval: float = DEFAULT_DISCRETIZATION
    ) -> None:
        self.run = as_run(run)
        self.interval = check_positive(
            "value_discretization_interval", value_discretization_interval
        )
        self._pld = None

    def _composed(self):  # -> dp_accounting PrivacyLossDistribution (built once)
        """What dp_accounting's ``PLDAccountant`` composes for the run's events, with each
        segment's one-step PLD built by :func:`subsampled_gaussian_pld` (the same PLD, about
        eight times faster to build)."""
        if self._pld is None:
            from dp_accounting.pld.privacy_loss_distribution import identity

            from opacus_lastiterate.analysis.baselines.subsampled_gaussian_pld import (
                subsampled_gaussian_pld,
            )

            pld = identity(value_discretization_interval=self.interval)
            for s in self.run.segments:
                if s.steps > 0:
                    one = subsampled_gaussian_pld(s.noise_multiplier, s.sample_rate, self.interval)
                    pld = pld.compose(one.self_compose(s.steps))
            self._pld = pld
        return self._pld

    def _epsilon(self, delta: float) -> float:
        return float(self._composed().get_epsilon_for_delta(delta))

    def _delta(self, epsilon: float) -> float:
        return float(self._composed().get_delta_for_epsilon(epsilon))

    def __repr__(self) -> str:
        return f"StandardComposition(steps={self.run.num_steps}, interval={self.interval:g})"


class FullBatchGaussian(PrivacyModel):
    """Full-batch DP-GD with the same expected step and noise: mu-GDP with
    mu^2 = sum_t (q_t / sigma_t)^2, in closed form (exact for that mechanism)."""

    kind = "exact"
    label = "full-batch DP-GD with the same expected step and noise (closed form)"

    def __init__(self, run: RunLike) -> None:
        self.run = as_run(run)
        if self.run.has_zero_noise:
            self.mu = math.inf
        else:
            self.mu = math.sqrt(
                sum(s.steps * (s.sample_rate / s.noise_multiplier) ** 2 for s in self.run.segments)
            )

    def _epsilon(self, delta: float) -> float:
        """epsilon of mu-GDP at ``delta``."""
        return 0.0 if self.mu == 0.0 else gaussian_epsilon(delta, mu=self.mu)

    def _delta(self, epsilon: float) -> float:
        """delta(epsilon) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)."""
        return 0.0 if self.mu == 0.0 else gaussian_delta(epsilon, mu=self.mu)

    def beta(self, alpha: float) -> float:
        """Trade-off curve of mu-GDP: Phi(Phi^{-1}(1 - alpha) - mu)."""
        a = check_in_interval("alpha", alpha, 0.0, 1.0, low_open=False, high_open=False)
        if math.isinf(self.mu):
            return 0.0 if a > 0 else 1.0
        return float(special.ndtr(-special.ndtri(a) - self.mu)) if 0 < a < 1 else 1.0 - a

    def __repr__(self) -> str:
        return f"FullBatchGaussian(mu={self.mu:.6g})"
