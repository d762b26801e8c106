"""User-level and group privacy: the privacy unit, the heuristic and the standard numbers,
against independent computations (enumeration of every sampling outcome written here, the
closed-form hockey-stick of tests/analysis/_reference.py, dp_accounting's accountant)."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.pld.privacy_loss_distribution import from_mixture_gaussian_mechanism
from dp_accounting.privacy_accountant import NeighboringRelation
from scipy import stats

from opacus_lastiterate.analysis.baselines.composition import (
    RDPComposition,
    StandardComposition,
)
from opacus_lastiterate.analysis.last_iterate.heuristic import LastIterateHeuristic
from opacus_lastiterate.analysis.privacy_unit import PrivacyUnit
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.analysis.sampling import (
    BallsInBins,
    DeterministicBatches,
    ShuffledBatches,
)
from opacus_lastiterate.analysis.sampling_heuristic import SamplingHeuristic
from opacus_lastiterate.analysis.user_level import (
    UserLevelHeuristic,
    UserLevelSamplingHeuristic,
)
from opacus_lastiterate.analysis.user_level_standard import (
    GroupPrivacyConversion,
    UserLevelComposition,
    UserLevelNoAmplificationBound,
    mixture_of_gaussians_step_pld,
)
from tests.analysis._reference import (
    ClosedFormMixture,
    gaussian_mechanism_epsilon,
    torch_sgd_weights,
)

DELTA = 1e-5


def _cosine_momentum(steps: int) -> np.ndarray:
    """Weights of torch's SGD (momentum 0.9, cosine rates): the reference needs torch, so
    the light install (no torch) skips the weighted cases."""
    pytest.importorskip("torch")
    lrs = 0.5 * (1 + np.cos(np.pi * np.arange(steps) / steps)) + 0.05
    return torch_sgd_weights(lrs, momentum=0.9)


def _exact_epsilon(law: dict[float, float], s: float) -> float:
    shifts = np.array(list(law))
    probs = np.array([law[x] for x in shifts])
    return ClosedFormMixture(shifts, probs, s).epsilon(DELTA)


def _product(laws: list[dict[float, float]]) -> dict[float, float]:
    total: dict[float, float] = {0.0: 1.0}
    for law in laws:
        new: dict[float, float] = defaultdict(float)
        for a, pa in total.items():
            for b, pb in law.items():
                new[round(a + b, 12)] += pa * pb
        total = new
    return total


# -- the unit -------------------------------------------------------------------------------


def test_unit_round_trips_and_is_carried_by_the_run() -> None:
    for unit in (PrivacyUnit.record(), PrivacyUnit.user(max_records=4), PrivacyUnit.group(3)):
        assert PrivacyUnit.from_dict(unit.as_dict()) == unit
    run = DPSGDRun.constant(
        steps=10, sample_rate=0.1, noise_multiplier=1.0, unit=PrivacyUnit.user(max_records=4)
    )
    assert run.unit == PrivacyUnit("user", 4)
    assert run.suffix(3).unit == run.unit
    assert DPSGDRun.from_history([(1.0, 0.1, 3)]).unit == PrivacyUnit.record()
    assert PrivacyUnit.group(4).label() == "group of 4 records"
    assert PrivacyUnit.user(4).label() == "user-level, 4 records"


@pytest.mark.parametrize(
    ("make", "error", "name"),
    [
        (lambda: PrivacyUnit("person"), ValueError, "kind"),
        (lambda: PrivacyUnit(3), TypeError, "kind"),  # type: ignore[arg-type]
        (lambda: PrivacyUnit("record", 2), ValueError, "max_records"),
        (lambda: PrivacyUnit.user(0), ValueError, "max_records"),
        (lambda: PrivacyUnit.user(2.0), TypeError, "max_records"),  # type: ignore[arg-type]
        (lambda: PrivacyUnit.group(0), ValueError, "size"),
        (lambda: PrivacyUnit.from_dict({"kind": "user", "records": 3}), ValueError, "records"),
        (lambda: PrivacyUnit.from_dict({"max_records": 3}), ValueError, "kind"),
        (lambda: DPSGDRun.from_history([(1.0, 0.1, 3)], unit="user"), TypeError, "unit"),  # type: ignore[arg-type]
    ],
)
def test_bad_units_are_named(make, error, name) -> None:
    with pytest.raises(error, match=name):
        make()


# -- Poisson heuristic ------------------------------------------------------------------------


def _poisson_law(weights: np.ndarray, q: float, k: int) -> dict[float, float]:
    """Every outcome of k records x T steps (2^(kT) patterns)."""
    law: dict[float, float] = defaultdict(float)
    for bits in itertools.product([0, 1], repeat=k * weights.size):
        counts = np.array(bits).reshape(k, weights.size).sum(axis=0)
        p = q ** sum(bits) * (1 - q) ** (len(bits) - sum(bits))
        law[round(float(counts @ weights), 12)] += p
    return law


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("k", [2, 3])
def test_poisson_user_heuristic_matches_enumeration(weighted: bool, k: int) -> None:
    steps, q, sigma = 4, 0.3, 0.7
    w = _cosine_momentum(steps) if weighted else np.ones(steps)
    w = w / w.max()
    exact = _exact_epsilon(_poisson_law(w, q, k), sigma * math.sqrt(float(np.sum(w * w))))
    run = DPSGDRun.from_history(
        [(sigma, q, steps)], weights=w if weighted else None, unit=PrivacyUnit.user(k)
    )
    value = UserLevelHeuristic(run, accuracy=1e-3).epsilon(DELTA)
    assert value >= exact * (1 - 1e-9)
    assert value <= exact * (1 + (1e-3 if weighted else 1e-8))
    # a group of k records is the same computation
    group = DPSGDRun.from_history(
        [(sigma, q, steps)], weights=w if weighted else None, unit=PrivacyUnit.group(k)
    )
    assert UserLevelHeuristic(group, accuracy=1e-3).epsilon(DELTA) == value


@pytest.mark.parametrize("weighted", [False, True])
def test_poisson_user_heuristic_with_one_record_is_the_record_heuristic(weighted: bool) -> None:
    steps = 40
    w = _cosine_momentum(steps) if weighted else None
    run = DPSGDRun.from_history([(0.9, 0.05, steps)], weights=w, unit=PrivacyUnit.user(1))
    assert UserLevelHeuristic(run).epsilon(DELTA) == LastIterateHeuristic(run).epsilon(DELTA)
    assert UserLevelHeuristic(run).delta(2.0) == LastIterateHeuristic(run).delta(2.0)


def test_poisson_user_heuristic_grows_with_k_and_is_labelled() -> None:
    values = [
        UserLevelHeuristic(
            DPSGDRun.constant(steps=50, sample_rate=0.05, noise_multiplier=1.0,
                              unit=PrivacyUnit.user(k))
        )
        for k in (1, 2, 4)
    ]
    eps = [m.epsilon(DELTA) for m in values]
    assert eps[0] < eps[1] < eps[2]
    assert "user-level, 4 records" in values[2].label
    assert values[2].kind == "heuristic"


def test_poisson_user_heuristic_rejects_other_schemes_and_bad_accuracy() -> None:
    run = DPSGDRun.constant(
        steps=10, sample_rate=0.1, noise_multiplier=1.0, sampling=ShuffledBatches(100, 10)
    )
    with pytest.raises(ValueError, match="Poisson"):
        UserLevelHeuristic(run)
    with pytest.raises(ValueError, match="accuracy"):
        UserLevelHeuristic(DPSGDRun.constant(steps=3, sample_rate=0.1, noise_multiplier=1.0),
                           accuracy=0.0)


# -- epoch schemes ---------------------------------------------------------------------------


def _shuffled_epoch_law(n: int, b: int, drop_last: bool, k: int, step_weight: dict[int, float]):
    """One epoch by every permutation of n records; the user's records are 0..k-1."""
    law: dict[float, float] = defaultdict(float)
    perms = list(itertools.permutations(range(n)))
    for perm in perms:
        x = 0.0
        for slot, record in enumerate(perm):
            if record < k:
                batch = slot // b
                if drop_last and batch >= n // b:
                    continue
                x += step_weight.get(batch, 0.0)
        law[round(x, 12)] += 1.0 / len(perms)
    return law


def _balls_epoch_law(b: int, k: int, step_weight: dict[int, float]):
    law: dict[float, float] = defaultdict(float)
    for steps in itertools.product(range(b), repeat=k):
        law[round(sum(step_weight.get(j, 0.0) for j in steps), 12)] += b ** (-k)
    return law


def _epochs(weights: np.ndarray, per_epoch: int) -> list[dict[int, float]]:
    return [
        {j: float(weights[e * per_epoch + j]) for j in range(per_epoch) if e * per_epoch + j < weights.size}
        for e in range(-(-weights.size // per_epoch))
    ]


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize(
    ("n", "b", "drop_last", "steps"), [(6, 2, False, 6), (7, 2, True, 5), (6, 2, False, 4)]
)
def test_shuffled_user_heuristic_matches_permutations(weighted, n, b, drop_last, steps) -> None:
    k, sigma = 2, 0.6
    scheme = ShuffledBatches(n, b, drop_last)
    w = _cosine_momentum(steps) if weighted else np.ones(steps)
    w = w / w.max()
    laws = [
        _shuffled_epoch_law(n, b, drop_last, k, e)
        for e in _epochs(w, scheme.steps_per_epoch)
    ]
    exact = _exact_epsilon(_product(laws), sigma * math.sqrt(float(np.sum(w * w))))
    run = DPSGDRun.from_history(
        [(sigma, 1 / scheme.steps_per_epoch, steps)], weights=w if weighted else None,
        sampling=scheme, unit=PrivacyUnit.user(k),
    )
    value = UserLevelSamplingHeuristic(run, accuracy=1e-3).epsilon(DELTA)
    assert value >= exact * (1 - 1e-8)
    assert value <= exact * (1 + (1e-3 if weighted else 1e-8))


@pytest.mark.parametrize("weighted", [False, True])
def test_balls_in_bins_user_heuristic_matches_enumeration(weighted: bool) -> None:
    k, b, steps, sigma = 2, 3, 5, 0.6
    w = _cosine_momentum(steps) if weighted else np.ones(steps)
    w = w / w.max()
    laws = [_balls_epoch_law(b, k, e) for e in _epochs(w, b)]
    exact = _exact_epsilon(_product(laws), sigma * math.sqrt(float(np.sum(w * w))))
    run = DPSGDRun.from_history(
        [(sigma, 1 / b, steps)], weights=w if weighted else None,
        sampling=BallsInBins(b), unit=PrivacyUnit.user(k),
    )
    value = UserLevelSamplingHeuristic(run, accuracy=1e-3).epsilon(DELTA)
    assert value >= exact * (1 - 1e-8)
    assert value <= exact * (1 + (1e-3 if weighted else 1e-8))


def test_deterministic_user_heuristic_is_the_worst_placement() -> None:
    k, n, b, steps, sigma = 3, 6, 2, 6, 0.8
    w = _cosine_momentum(steps)
    scheme = DeterministicBatches(n, b)
    worst = max(  # every placement of k distinct slots in the fixed order
        sum(w[e * 3 + slot // b] for slot in slots for e in range(2))
        for slots in itertools.combinations(range(n), k)
    )
    s = sigma * math.sqrt(float(np.sum(w * w)))
    run = DPSGDRun.from_history([(sigma, 1 / 3, steps)], weights=w, sampling=scheme,
                                unit=PrivacyUnit.user(k))
    value = UserLevelSamplingHeuristic(run).epsilon(DELTA)
    assert value == pytest.approx(gaussian_mechanism_epsilon(worst / s, DELTA), rel=1e-8)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize(
    "scheme", [ShuffledBatches(1000, 100), ShuffledBatches(1050, 100, True), BallsInBins(10)]
)
def test_epoch_user_heuristic_with_one_record_is_the_record_heuristic(scheme, weighted) -> None:
    steps = 25
    w = _cosine_momentum(steps) if weighted else None
    run = DPSGDRun.from_history([(1.0, scheme.sample_rate, steps)], weights=w, sampling=scheme)
    ours = UserLevelSamplingHeuristic(run).epsilon(DELTA)
    theirs = SamplingHeuristic(run).epsilon(DELTA)
    assert ours == pytest.approx(theirs, rel=2e-3 if weighted else 1e-9)


def test_epoch_user_heuristic_rejects_a_unit_larger_than_the_dataset() -> None:
    run = DPSGDRun.constant(steps=3, sample_rate=0.5, noise_multiplier=1.0,
                            sampling=ShuffledBatches(4, 2), unit=PrivacyUnit.user(5))
    with pytest.raises(ValueError, match="max_records"):
        UserLevelSamplingHeuristic(run)


# -- standard numbers ------------------------------------------------------------------------


def test_poisson_user_standard_matches_dp_accountings_accountant() -> None:
    k, q, sigma, steps, interval = 3, 0.1, 1.2, 20, 1e-2
    run = DPSGDRun.constant(steps=steps, sample_rate=q, noise_multiplier=sigma,
                            unit=PrivacyUnit.user(k))
    ours = UserLevelComposition(run, value_discretization_interval=interval)
    accountant = pld_privacy_accountant.PLDAccountant(
        NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=interval
    )
    counts = np.arange(k + 1)
    event = dp_event.MixtureOfGaussiansDpEvent(
        sigma, counts.astype(float).tolist(), stats.binom.pmf(counts, k, q).tolist()
    )
    accountant.compose(dp_event.SelfComposedDpEvent(event, steps))
    assert ours.epsilon(DELTA) == pytest.approx(accountant.get_epsilon(DELTA), rel=1e-6)
    assert ours.delta(3.0) == pytest.approx(accountant.get_delta(3.0), rel=1e-6)
    assert "user-level, 3 records" in ours.label and ours.kind == "upper_bound"


def test_poisson_user_standard_step_is_an_upper_bound_on_the_exact_mixture() -> None:
    k, q, sigma = 4, 0.2, 1.0
    run = DPSGDRun.constant(steps=1, sample_rate=q, noise_multiplier=sigma,
                            unit=PrivacyUnit.user(k))
    exact = ClosedFormMixture(np.arange(k + 1), stats.binom.pmf(np.arange(k + 1), k, q), sigma)
    value = UserLevelComposition(run).epsilon(DELTA)
    assert exact.epsilon(DELTA) <= value <= exact.epsilon(DELTA) + 2e-3
    # dp_accounting's own construction of the same one-step PLD
    theirs = from_mixture_gaussian_mechanism(
        sigma, list(map(float, range(k + 1))), list(stats.binom.pmf(np.arange(k + 1), k, q)),
        value_discretization_interval=1e-2,
    )
    ours = mixture_of_gaussians_step_pld(sigma, q, k, 1e-2)
    assert ours.get_epsilon_for_delta(DELTA) == pytest.approx(
        theirs.get_epsilon_for_delta(DELTA), rel=1e-8
    )


def test_poisson_user_standard_with_one_record_is_the_record_standard() -> None:
    run = DPSGDRun.from_history([(1.0, 0.05, 60), (0.8, 0.02, 40)])
    ours = UserLevelComposition(run).epsilon(DELTA)
    assert ours == pytest.approx(StandardComposition(run).epsilon(DELTA), rel=1e-6)


@pytest.mark.parametrize("scheme", [ShuffledBatches(100, 10), BallsInBins(10)])
def test_epoch_user_standard_is_the_k_fold_gaussian(scheme) -> None:
    k, sigma, steps = 4, 2.0, 30  # three epochs
    run = DPSGDRun.constant(steps=steps, sample_rate=0.1, noise_multiplier=sigma,
                            sampling=scheme, unit=PrivacyUnit.user(k))
    model = UserLevelNoAmplificationBound(run)
    assert model.epsilon(DELTA) == pytest.approx(
        gaussian_mechanism_epsilon(k * math.sqrt(3) / sigma, DELTA), rel=1e-8
    )
    assert ("add/remove" if isinstance(scheme, BallsInBins) else "zero-out") in model.label
    # valid bound: never below the unit's heuristic of the same run
    assert model.epsilon(DELTA) >= UserLevelSamplingHeuristic(run).epsilon(DELTA)


def test_group_conversion_satisfies_its_inequality_and_is_looser_than_direct() -> None:
    k = 3
    run = DPSGDRun.constant(steps=100, sample_rate=0.02, noise_multiplier=1.5)
    record = RDPComposition(run)
    group = GroupPrivacyConversion(record, k)
    e = group.epsilon(DELTA)
    assert math.isfinite(e)
    converted = record.delta(e / k) * math.expm1(e) / math.expm1(e / k)
    assert converted <= DELTA
    user_run = DPSGDRun.constant(steps=100, sample_rate=0.02, noise_multiplier=1.5,
                                 unit=PrivacyUnit.group(k))
    assert UserLevelComposition(user_run).epsilon(DELTA) < e
    assert GroupPrivacyConversion(record, 1).epsilon(DELTA) == record.epsilon(DELTA)
    with pytest.raises(ValueError, match="size"):
        GroupPrivacyConversion(record, 0)
    with pytest.raises(TypeError, match="model"):
        GroupPrivacyConversion("standard", 2)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("make", "rel"),
    [
        (lambda u: UserLevelHeuristic(
            DPSGDRun.constant(steps=40, sample_rate=0.05, noise_multiplier=1.0, unit=u)), 1e-8),
        (lambda u: UserLevelSamplingHeuristic(DPSGDRun.from_history(
            [(1.0, 0.25, 12)], weights=_cosine_momentum(12), sampling=ShuffledBatches(20, 5),
            unit=u)), 2e-3),  # each value certified to accuracy 1e-3 on its own grid
        (lambda u: UserLevelComposition(DPSGDRun.constant(
            steps=40, sample_rate=0.05, noise_multiplier=1.0, unit=u),
            value_discretization_interval=1e-3), 1e-8),
        (lambda u: UserLevelNoAmplificationBound(DPSGDRun.constant(
            steps=30, sample_rate=0.1, noise_multiplier=2.0, sampling=BallsInBins(10),
            unit=u)), 1e-8),
    ],
)
def test_epsilon_and_delta_are_inverse_and_grow_with_k(make, rel) -> None:
    small, large = make(PrivacyUnit.user(2)), make(PrivacyUnit.user(3))
    for e in (1.0, 3.0):
        d = small.delta(e)
        assert small.epsilon(d) <= e * (1 + rel) + 1e-9
        assert small.epsilon(d * (1 - 1e-6)) >= e * (1 - rel) - 1e-9
    assert large.epsilon(DELTA) > small.epsilon(DELTA)
    assert large.delta(2.0) > small.delta(2.0)
