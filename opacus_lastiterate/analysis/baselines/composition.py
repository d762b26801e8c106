"""Baselines printed beside the heuristic (``docs/last_iterate.md``, "Baselines").

* Standard composition (every intermediate model released): the Poisson-subsampled Gaussian
  mechanism composed over the history with Google's ``dp_accounting`` PLDs: what its
  ``PLDAccountant`` composes (add/remove neighbours, pessimistic connect-the-dots
  discretisation of the privacy loss with interval ``value_discretization_interval``), each
  segment's one-step PLD built by ``subsampled_gaussian_pld``. The result is an upper bound
  on the exact value. Consecutive steps whose noise multipliers differ by at most
  ``noise_grouping`` (relative; default :data:`DEFAULT_NOISE_GROUPING`, 0.1%) are composed
  at the smallest of them (:func:`~.pld_composition.group_noise`): still an upper bound,
  with one one-step PLD per group instead of per step. Compositions are kept per process, so that the value of a run that
  extends one computed before costs only the new steps
  (:func:`~.pld_composition.incremental_pld`; the same float as from scratch).
* Standard composition through Renyi DP (:class:`RDPComposition`, registry name
  ``"standard_rdp"``): the same mechanism composed as dp_accounting's ``RdpAccountant``
  composes it at its default orders (the one-step RDP of each distinct (q, sigma) computed
  once, vectorised: :mod:`.subsampled_gaussian_rdp`) and converted to (epsilon, delta) by
  dp_accounting's conversion (Canonne, Kamath, Steinke, arXiv 2004.00010, Proposition 12).
  An upper bound, looser than the PLD one; it has no discretisation. The privacy monitor's
  ``opacus_rdp_epsilon`` is another number: Opacus's RDP accountant (its orders, and its
  evaluation of fractional orders, which dp_accounting bounds from above), so this one can
  be larger.
* Full-batch DP-GD with the same expected step and noise variance: q = 1 and noise
  multiplier sigma / q for each step, i.e. mu-GDP with mu^2 = sum_t (q_t / sigma_t)^2,
  in closed form.

The PLD value discretisation interval (``value_discretization_interval``, dp_accounting's
name) defaults to :data:`DEFAULT_DISCRETIZATION` = 1e-4 here; the defaults of every model are
listed once in :mod:`opacus_lastiterate.analysis.privacy_models`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from scipy import special

from opacus_lastiterate.analysis._validation import (
    check_in_interval,
    check_int,
    check_positive,
)
from opacus_lastiterate.analysis.baselines.gaussian_mechanism import (
    gaussian_delta,
    gaussian_epsilon,
)
from opacus_lastiterate.analysis.privacy_model import PrivacyModel, poisson_run
from opacus_lastiterate.analysis.run import DPSGDRun, RunLike, as_run

__all__ = [
    "DEFAULT_NOISE_GROUPING",
    "FullBatchGaussian",
    "RDPComposition",
    "StandardComposition",
    "full_batch_delta",
    "full_batch_epsilon",
    "standard_delta",
    "standard_epsilon",
    "standard_rdp_delta",
    "standard_rdp_epsilon",
]

DEFAULT_NOISE_GROUPING = 1e-3
"""Default ``noise_grouping`` of :class:`StandardComposition`: consecutive steps whose noise
multipliers differ by at most 0.1% are composed at the smallest of them (a noise scheduler
that changes the noise a little at every step then costs one PLD per 0.1% of change, for
about 0.1% on epsilon); a run whose noise stays put, or changes by more than 0.1% at a time,
is composed exactly as dp_accounting composes it."""

DEFAULT_MAX_GROUPS = 128
"""Default ``max_groups`` of :class:`StandardComposition`: at most 128 one-step PLDs, so a
noise or rate schedule that changes at every step costs a bounded composition (under a second
on a 2-core machine at 2,000 steps) for a value within a stated factor of the exact one (``docs/last_iterate.md``, "Noise or rate changing every step")."""

DEFAULT_DISCRETIZATION = 1e-4
"""Default ``value_discretization_interval`` of :class:`StandardComposition` (dp_accounting's
own), and of the CLI's ``--value-discretization-interval``."""


def _constant(steps: int, sample_rate: float, noise_multiplier: float) -> DPSGDRun:
    sigma = check_positive("noise_multiplier", noise_multiplier)
    return DPSGDRun.constant(steps=steps, sample_rate=sample_rate, noise_multiplier=sigma)


def standard_epsilon(
    delta: float,
    *,
    steps: int,
    sample_rate: float,
    noise_multiplier: float,
    value_discretization_interval: float = DEFAULT_DISCRETIZATION,
) -> float:
    """Composition epsilon for T = ``steps`` steps at constant (q, sigma > 0): the one-line
    form of ``StandardComposition(DPSGDRun.constant(...)).epsilon(delta)``."""
    run = _constant(steps, sample_rate, noise_multiplier)
    return StandardComposition(
        run, value_discretization_interval=value_discretization_interval
    ).epsilon(delta)


def standard_delta(
    epsilon: float,
    *,
    steps: int,
    sample_rate: float,
    noise_multiplier: float,
    value_discretization_interval: float = DEFAULT_DISCRETIZATION,
) -> float:
    """Composition delta(epsilon) for T steps at constant (q, sigma > 0) (the twin of
    :func:`standard_epsilon`)."""
    run = _constant(steps, sample_rate, noise_multiplier)
    return StandardComposition(
        run, value_discretization_interval=value_discretization_interval
    ).delta(epsilon)


def standard_rdp_epsilon(
    delta: float, *, steps: int, sample_rate: float, noise_multiplier: float
) -> float:
    """RDP composition epsilon for T steps at constant (q, sigma > 0) (:class:`RDPComposition`)."""
    return RDPComposition(_constant(steps, sample_rate, noise_multiplier)).epsilon(delta)


def standard_rdp_delta(
    epsilon: float, *, steps: int, sample_rate: float, noise_multiplier: float
) -> float:
    """RDP composition delta(epsilon) for T steps at constant (q, sigma > 0)."""
    return RDPComposition(_constant(steps, sample_rate, noise_multiplier)).delta(epsilon)


def full_batch_epsilon(
    delta: float, *, steps: int, sample_rate: float, noise_multiplier: float
) -> float:
    """Full-batch baseline for T steps: mu = q sqrt(T) / sigma."""
    return FullBatchGaussian(_constant(steps, sample_rate, noise_multiplier)).epsilon(delta)


def full_batch_delta(
    epsilon: float, *, steps: int, sample_rate: float, noise_multiplier: float
) -> float:
    """Full-batch delta(epsilon) for T steps (the twin of :func:`full_batch_epsilon`)."""
    return FullBatchGaussian(_constant(steps, sample_rate, noise_multiplier)).delta(epsilon)


# -- privacy models ------------------------------------------------------------------------


class StandardComposition(PrivacyModel):
    """Every intermediate model released: the Poisson-subsampled Gaussian mechanism composed
    over the run with dp_accounting's PLD accountant (pessimistic, an upper bound). A step
    without noise releases its gradient sum exactly: epsilon = inf, delta = 1. Per-step
    weights do not matter here (each step is released).

    Args:
        run: the run.
        value_discretization_interval: the PLD grid step of the privacy loss (nats).
        noise_grouping: consecutive steps with the same sample rate whose noise multipliers
            lie within a factor ``1 + noise_grouping`` of each other are composed at the
            smallest of them (an upper bound on the exact composition, in [0, 1); 0: only
            equal noise multipliers, dp_accounting's composition). A schedule that changes
            the noise at every step then costs one PLD per group instead of one per step;
            each noise multiplier is lowered by at most that factor.
        max_groups: the most one-step PLDs the composition builds (None: no bound). A run
            whose grouping at ``noise_grouping`` leaves more groups (a noise or rate
            schedule that changes at every step of a long run) is grouped more coarsely
            and discretised on a wider grid (``pld_composition.bounded_groups``): each
            noise multiplier lowered and each sample rate raised by at most the factor
            :attr:`settings` reports, so the value stays an upper bound and its work stays
            bounded whatever the number of segments. A run with at most 16 groups, or at
            most ``max_groups`` groups on grids of at most 2^20 points in all, is composed
            as without the bound.
    """

    kind = "upper_bound"
    label = "standard composition (all iterates released): dp_accounting PLD, upper bound"

    def __init__(
        self, run: RunLike, *, value_discretization_interval: float = DEFAULT_DISCRETIZATION,
        noise_grouping: float = DEFAULT_NOISE_GROUPING,
        max_groups: int | None = DEFAULT_MAX_GROUPS,
    ) -> None:
        self.run = poisson_run(run, model="StandardComposition", name="standard")
        self.interval = check_positive(
            "value_discretization_interval", value_discretization_interval
        )
        self.noise_grouping = check_in_interval(
            "noise_grouping", noise_grouping, 0.0, 1.0, low_open=False
        )
        self.max_groups = None if max_groups is None else check_int(
            "max_groups", max_groups, minimum=1
        )
        self._pld = None

    @property
    def settings(self) -> tuple[float, float, int]:
        """(interval, noise grouping, number of one-step PLDs) that the composition of this
        run uses: the requested interval and grouping, or the coarser ones that
        ``max_groups`` imposes on a run with more groups."""
        from opacus_lastiterate.analysis.baselines.pld_composition import (
            bounded_groups,
            group_noise,
        )

        history = self.run.as_history()
        if self.max_groups is None:
            return self.interval, self.noise_grouping, len(group_noise(history, self.noise_grouping))
        groups, interval, grouping = bounded_groups(
            history, self.interval, self.noise_grouping, self.max_groups
        )
        return interval, grouping, len(groups)

    def _composed(self):  # -> dp_accounting PrivacyLossDistribution (built once)
        """What dp_accounting's ``PLDAccountant`` composes for the run's events, on arrays
        (:func:`~.pld_composition.compose_subsampled_gaussian`: each segment's one-step PLD
        as :func:`subsampled_gaussian_pld` builds it, self-composed and composed with
        dp_accounting's truncations, the one after a single step skipped), after grouping
        the noise (``noise_grouping``), continued from a kept composition of a prefix of
        the run where there is one (:func:`~.pld_composition.incremental_pld`)."""
        if self._pld is None:
            from opacus_lastiterate.analysis.baselines.pld_composition import incremental_pld

            self._pld = incremental_pld(
                self.run.as_history(), self.interval, self.noise_grouping, self.max_groups
            )
        return self._pld

    def _epsilon(self, delta: float) -> float:
        return float(self._composed().get_epsilon_for_delta(delta))

    def _delta(self, epsilon: float) -> float:
        return float(self._composed().get_delta_for_epsilon(epsilon))

    def __repr__(self) -> str:
        grouping = f", noise_grouping={self.noise_grouping:g}" if self.noise_grouping else ""
        bound = f", max_groups={self.max_groups}" if self.max_groups is not None else ""
        return (
            f"StandardComposition(steps={self.run.num_steps}, interval={self.interval:g}"
            f"{grouping}{bound})"
        )


class RDPComposition(PrivacyModel):
    """Every intermediate model released, through Renyi DP: the Poisson-subsampled Gaussian
    mechanism composed over the run as dp_accounting's ``RdpAccountant`` composes it
    (add/remove neighbours; each distinct (q, sigma) evaluated once, vectorised over orders)
    and converted with dp_accounting's ``compute_epsilon``/``compute_delta`` (an upper bound,
    looser than :class:`StandardComposition`; no discretisation). Per-step weights
    do not matter (each step is released).

    Args:
        run: the run.
        orders: the Renyi orders (each > 1), or ``None`` for dp_accounting's default orders.
    """

    kind = "upper_bound"
    label = "standard composition (all iterates released): dp_accounting RDP, upper bound"

    def __init__(self, run: RunLike, *, orders: Sequence[float] | None = None) -> None:
        self.run = poisson_run(run, model="RDPComposition", name="standard_rdp")
        self.orders = None if orders is None else _check_orders(orders)
        self._rdp: tuple[list[float], list[float]] | None = None

    def _composed(self) -> tuple[list[float], list[float]]:
        """(orders, RDP vector) of the run: what dp_accounting's ``RdpAccountant`` composes
        for the run's ``PoissonSampledDpEvent(q, GaussianDpEvent(sigma))`` events, with the
        one-step RDP of each distinct (q, sigma) computed once, vectorised over orders
        (:func:`~.subsampled_gaussian_rdp.composed_rdp`, the same series)."""
        if self._rdp is None:
            from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS

            from opacus_lastiterate.analysis.baselines.subsampled_gaussian_rdp import (
                composed_rdp,
            )

            orders = list(DEFAULT_RDP_ORDERS if self.orders is None else self.orders)
            rdp = composed_rdp(self.run.as_history(), orders, series="dp_accounting")
            self._rdp = (orders, rdp.tolist())
        return self._rdp

    def _epsilon(self, delta: float) -> float:
        from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

        orders, rdp = self._composed()
        # dp_accounting's compute_delta bounds delta by sqrt(1 - exp(-r)) at every epsilon
        # (the KL bound of each order); its compute_epsilon answers 0 only strictly above
        # that value, so at the value itself (what compute_delta returns) it would give a
        # positive epsilon. Answer 0 there too: epsilon(delta(e)) <= e, and the bound is
        # valid at epsilon = 0.
        kl = [math.exp(0.5 * math.log1p(-math.exp(-r))) for r in rdp if r > 0]
        if kl and delta >= min(kl):
            return 0.0
        return float(compute_epsilon(orders, rdp, delta)[0])

    def _delta(self, epsilon: float) -> float:
        from dp_accounting.rdp.rdp_privacy_accountant import compute_delta

        orders, rdp = self._composed()
        return min(1.0, float(compute_delta(orders, rdp, epsilon)[0]))

    def __repr__(self) -> str:
        return f"RDPComposition(steps={self.run.num_steps})"


def _check_orders(orders: object) -> tuple[float, ...]:
    if isinstance(orders, (str, bytes)) or not isinstance(orders, Iterable):
        raise TypeError(f"`orders` must be a sequence of real numbers > 1, got {orders!r}.")
    out = tuple(
        check_in_interval(f"orders[{i}]", a, 1.0, math.inf) for i, a in enumerate(orders)
    )
    if not out:
        raise ValueError("`orders` must not be empty.")
    return out


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
        return gaussian_epsilon(mu=self.mu, delta=delta)

    def _delta(self, epsilon: float) -> float:
        """delta(epsilon) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)."""
        return gaussian_delta(mu=self.mu, epsilon=epsilon)

    def beta(self, alpha: float) -> float:
        """Trade-off curve of mu-GDP: Phi(Phi^{-1}(1 - alpha) - mu)."""
        a = check_in_interval("alpha", alpha, 0.0, 1.0, low_open=False, high_open=False)
        if math.isinf(self.mu):
            return 0.0 if a > 0 else 1.0
        return float(special.ndtr(-special.ndtri(a) - self.mu)) if 0 < a < 1 else 1.0 - a

    def __repr__(self) -> str:
        return f"FullBatchGaussian(mu={self.mu:.6g})"
