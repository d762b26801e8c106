"""The Poisson models refuse a run whose batches are drawn otherwise, so a number computed for
Poisson sampling is never printed for (and labelled as a bound of) a shuffled, deterministic
or balls-in-bins run; the registry gives the number for the run's scheme."""

from __future__ import annotations

import math

import pytest
from scipy import optimize, stats

from opacus_lastiterate.accountants import FEASGMAccountant
from opacus_lastiterate.analysis import (
    DPSGDRun,
    LastIterateHeuristic,
    RDPComposition,
    RobustLastIterateHeuristic,
    StandardComposition,
)
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.sampling import (
    BallsInBins,
    DeterministicBatches,
    PoissonSampling,
    ShuffledBatches,
    UnknownSampling,
)

DELTA = 1e-5
N, B, SIGMA, STEPS = 1000, 100, 1.0, 30  # 3 epochs of 10 steps

_SCHEMES = [
    ShuffledBatches(N, B),
    DeterministicBatches(N, B),
    BallsInBins(N // B),
    UnknownSampling("MySampler", ShuffledBatches(N, B)),
]
_POISSON_MODELS = [
    (LastIterateHeuristic, "heuristic"),
    (RobustLastIterateHeuristic, "robust_heuristic"),
    (StandardComposition, "standard"),
    (RDPComposition, "standard_rdp"),
]


def _run(scheme: object) -> DPSGDRun:
    return DPSGDRun.from_history([(SIGMA, B / N, STEPS)], sampling=scheme)  # type: ignore[arg-type]


def _epsilon_of_gaussian(mu: float, delta: float) -> float:
    """epsilon of mu-GDP at delta from the closed form delta(eps) (Balle and Wang), by root
    finding: independent of the package."""

    def excess(eps: float) -> float:
        return float(
            stats.norm.cdf(-eps / mu + mu / 2)
            - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
            - delta
        )

    return float(optimize.brentq(excess, 0.0, 100.0, xtol=1e-12))


@pytest.mark.parametrize("scheme", _SCHEMES, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize(("cls", "name"), _POISSON_MODELS, ids=lambda x: getattr(x, "__name__", x))
def test_a_poisson_model_refuses_a_run_of_another_scheme(cls, name, scheme) -> None:
    with pytest.raises(ValueError, match=rf"`run`.*privacy_model\('{name}', run\)"):
        cls(_run(scheme))


@pytest.mark.parametrize("scheme", [None, PoissonSampling(B / N)], ids=["none", "poisson"])
@pytest.mark.parametrize(("cls", "name"), _POISSON_MODELS, ids=lambda x: getattr(x, "__name__", x))
def test_a_poisson_model_answers_a_poisson_run_as_the_registry(cls, name, scheme) -> None:
    run = _run(scheme)
    assert cls(run).epsilon(DELTA) == privacy_model(name, run).epsilon(DELTA)


def test_the_registry_gives_the_shuffled_runs_bound_not_the_poisson_value() -> None:
    """Without amplification, each of the 3 epochs is one Gaussian mechanism of sensitivity
    1 and noise sigma: mu = sqrt(3) / sigma; the Poisson value is far smaller."""
    run = _run(ShuffledBatches(N, B))
    shuffled = privacy_model("standard", run)
    poisson = privacy_model("standard", DPSGDRun.from_history([(SIGMA, B / N, STEPS)]))
    expected = _epsilon_of_gaussian(math.sqrt(STEPS * B / N) / SIGMA, DELTA)
    assert shuffled.kind == "upper_bound" and "shuffled" in shuffled.label
    assert shuffled.epsilon(DELTA) == pytest.approx(expected, rel=1e-6)
    assert poisson.epsilon(DELTA) < 0.8 * expected


def test_the_feasgm_accountant_standard_is_the_schemes_bound() -> None:
    """A corrected accountant whose run declares shuffled batches answers with the scheme's
    bound (through the registry), not with the Poisson value. N = 1050, L = 100: 11 steps per
    epoch for N - 1, N and N + 1, so the public divisor's verdict is safe; 3 epochs."""
    n, steps = 1050, 33
    acc = FEASGMAccountant().configure(dataset_size=n, batch_size=B, public_divisor=B)
    acc.history = [(SIGMA, 1 / 11, steps)]
    poisson = acc.get_epsilon(DELTA)
    acc.declare_sampling(ShuffledBatches(n, B))
    expected = _epsilon_of_gaussian(math.sqrt(3) / SIGMA, DELTA)
    assert acc.get_epsilon(DELTA) == pytest.approx(expected, rel=1e-6)
    assert poisson < 0.8 * expected
