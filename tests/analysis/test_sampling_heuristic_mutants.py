"""Public behaviour of the epoch-scheme heuristic that mutation testing found unasserted
(``docs/testing.md``, "Mutation testing"): equal weights other than one, zero weights on the
count path, repeated weights inside an epoch, the certified grid on partial epochs and on a
single epoch, the robust delta, and the labels. Expected values come from enumerating every
slot of every epoch's permutation (written here) and the closed-form hockey-stick
divergence of the shifted Gaussian mixture (``tests/analysis/_reference.py``)."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest

from opacus_lastiterate.analysis import sampling_heuristic
from opacus_lastiterate.analysis.baselines.gaussian_mechanism import gaussian_epsilon
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.analysis.sampling import (
    BallsInBins,
    DeterministicBatches,
    PoissonSampling,
    ShuffledBatches,
    UnknownSampling,
)
from opacus_lastiterate.analysis.sampling_heuristic import (
    RobustSamplingHeuristic,
    SamplingHeuristic,
)
from opacus_lastiterate.exceptions import WeightedAccuracyWarning
from tests.analysis._reference import ClosedFormMixture

TAIL = " (final model only; exact for linear losses, not a proven bound for deep networks)"


def _run(steps, scheme, sigma=1.0, weights=None) -> DPSGDRun:
    return DPSGDRun.from_history(
        [(sigma, 1.0 / scheme.steps_per_epoch, steps)], weights=weights, sampling=scheme
    )


def _shuffled_law(n: int, b: int, drop_last: bool, weights) -> tuple[list[float], list[float]]:
    """Law of the canary's total weight sum_e X_e over every slot of every epoch's uniform
    permutation (batch j = slot // b; the slots of dropped records and of steps outside the
    run contribute 0)."""
    k = n // b if drop_last else -(-n // b)
    steps = len(weights)
    per_epoch = []
    for e in range(-(-steps // k)):
        outcomes = []
        for slot in range(n):
            t = e * k + slot // b
            inside = slot // b < k and t < steps
            outcomes.append(float(weights[t]) if inside else 0.0)
        per_epoch.append(outcomes)
    law: dict[float, float] = {}
    for combo in itertools.product(*per_epoch):
        v = round(sum(combo), 12)
        law[v] = law.get(v, 0.0) + (1.0 / n) ** len(per_epoch)
    return list(law), list(law.values())


def _reference(n, b, drop_last, weights, sigma) -> ClosedFormMixture:
    shifts, probs = _shuffled_law(n, b, drop_last, weights)
    s = sigma * math.sqrt(float(np.sum(np.asarray(weights, float) ** 2)))
    return ClosedFormMixture(shifts, probs, s)


# -- the count path (equal weights) --------------------------------------------------------------


@pytest.mark.parametrize("c", [0.5, 3.0])
def test_equal_weights_other_than_one_are_scale_free(c) -> None:
    """A constant learning rate c scales the shift and the noise alike: whole epochs are the
    Gaussian mechanism with mu = E / (sigma sqrt(T)) for every c."""
    epochs, sigma = 3, 1.0
    steps = 10 * epochs
    run = _run(steps, ShuffledBatches(100, 10), sigma, weights=np.full(steps, c))
    mu = epochs / (sigma * math.sqrt(steps))
    assert SamplingHeuristic(run).epsilon(1e-5) == pytest.approx(
        gaussian_epsilon(mu=mu, delta=1e-5), rel=1e-9
    )
    partial = _run(7, ShuffledBatches(6, 2), 0.9, weights=np.full(7, c))
    ref = _reference(6, 2, False, np.full(7, c), 0.9)
    assert SamplingHeuristic(partial).delta(1.0) == pytest.approx(ref.delta(1.0), rel=1e-6)


def test_zero_weight_steps_do_not_use_the_canary() -> None:
    """A step with weight 0 (learning rate 0) releases nothing about the canary: its batch's
    share of the epoch is not counted (equal positive weights: the count path)."""
    weights = np.array([1.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    run = _run(6, ShuffledBatches(6, 2), 0.8, weights)
    ref = _reference(6, 2, False, weights, 0.8)
    model = SamplingHeuristic(run)
    for eps in (0.3, 1.0):
        assert model.delta(eps) == pytest.approx(ref.delta(eps), rel=1e-6, abs=1e-13)


def test_zero_weights_among_unequal_weights() -> None:
    """Unequal weights with zeros (the exact route): a zero-weight step adds nothing."""
    weights = np.array([1.0, 0.0, 0.5, 0.8, 0.0, 0.3])
    run = _run(6, ShuffledBatches(6, 2), 0.8, weights)
    ref = _reference(6, 2, False, weights, 0.8)
    assert SamplingHeuristic(run).delta(0.5) == pytest.approx(ref.delta(0.5), rel=1e-6)


def test_all_weights_zero_is_perfectly_private() -> None:
    """No step's gradient reaches the final model."""
    for scheme in (ShuffledBatches(6, 2), BallsInBins(3), DeterministicBatches(6, 2)):
        model = SamplingHeuristic(_run(6, scheme, 1.0, np.zeros(6)))
        assert model.epsilon(1e-5) == 0.0 and model.delta(0.0) == 0.0


def test_repeated_weights_inside_an_epoch() -> None:
    """Two steps of one epoch with the same weight: their probabilities add up."""
    weights = np.array([1.0, 0.5, 0.5, 1.0, 0.5, 0.5])
    run = _run(6, ShuffledBatches(6, 2), 0.7, weights)
    ref = _reference(6, 2, False, weights, 0.7)
    model = SamplingHeuristic(run)
    for eps in (0.3, 1.5):
        assert model.delta(eps) == pytest.approx(ref.delta(eps), rel=1e-6, abs=1e-13)
    assert model.epsilon(1e-3) == pytest.approx(ref.epsilon(1e-3), rel=1e-6)


# -- the certified grid ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "b", "drop_last", "weights"),
    [
        (7, 2, False, [1.0, 0.8, 0.55, 0.3, 0.9, 0.45, 0.2]),  # partial last batch and epoch
        (7, 2, True, [0.6, 1.0, 0.35, 0.8, 0.5, 0.25]),  # a record dropped each epoch
        (6, 2, False, [0.4, 1.0, 0.7]),  # a single epoch
    ],
    ids=["partial", "drop_last", "one_epoch"],
)
def test_grid_route_bounds_the_enumerated_pair(monkeypatch, n, b, drop_last, weights) -> None:
    """With the exact route turned off (``EXACT_SUPPORT_LIMIT`` = 1) epsilon and delta are
    never below the exact pair's and within ``accuracy`` of them; no warning is raised."""
    ref = _reference(n, b, drop_last, weights, 1.0)
    run = _run(len(weights), ShuffledBatches(n, b, drop_last=drop_last), 1.0, weights)
    monkeypatch.setattr(sampling_heuristic, "EXACT_SUPPORT_LIMIT", 1)
    acc = 1e-3
    model = SamplingHeuristic(run, accuracy=acc)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for eps in (0.2, 1.0):
            exact = ref.delta(eps)
            assert exact * (1 - 1e-9) <= model.delta(eps) <= exact * (1 + acc) + 1e-15
        exact = ref.epsilon(1e-4)
        assert exact * (1 - 1e-9) <= model.epsilon(1e-4) <= exact * (1 + acc)
        assert model.delta(60.0) <= 1e-30  # exact: below 1e-300 (no canary contribution
        # reaches e^60 times the likelihood); at most the cut tails of 1e-30 are added


def test_an_unreachable_accuracy_warns_and_keeps_the_upper_bound(monkeypatch) -> None:
    """accuracy = 1e-12 needs a grid beyond the size limit: the answer is the upper end of
    the last grid, never below the exact pair, with a WeightedAccuracyWarning saying so."""
    weights = [1.0, 0.8, 0.55, 0.3, 0.9, 0.45, 0.2]
    ref = _reference(7, 2, False, weights, 1.0)
    run = _run(7, ShuffledBatches(7, 2), 1.0, weights)
    monkeypatch.setattr(sampling_heuristic, "EXACT_SUPPORT_LIMIT", 1)
    pattern = (
        r"^sampling heuristic: reached relative accuracy .+, not the requested 1e-12, at the "
        r"grid-size limit \(resolution \d+\); the value is still an upper bound\.$"
    )
    with pytest.warns(WeightedAccuracyWarning, match=pattern):
        value = SamplingHeuristic(run, accuracy=1e-12).epsilon(1e-4)
    exact = ref.epsilon(1e-4)
    assert exact * (1 - 1e-9) <= value <= exact * 1.1


# -- the robust maximum ---------------------------------------------------------------------------


def test_robust_delta_is_the_max_over_suffixes() -> None:
    run = _run(25, BallsInBins(10), 1.0)
    for eps in (0.2, 1.0):
        each = [SamplingHeuristic(run.suffix(t)).delta(eps) for t in range(1, 26)]
        assert RobustSamplingHeuristic(run).delta(eps) == max(each)


def test_robust_epsilon_below_one() -> None:
    """sigma = 5: every suffix's epsilon is below 1 (the maximum is not floored at 1)."""
    run = _run(12, ShuffledBatches(60, 20), 5.0)
    each = [SamplingHeuristic(run.suffix(t)).epsilon(1e-3) for t in range(1, 13)]
    robust = RobustSamplingHeuristic(run).epsilon(1e-3)
    assert robust == max(each) and 0.0 < robust < 1.0


def test_robust_accepts_equal_weights() -> None:
    """A constant learning rate 0.5 given as weights is plain SGD: the same maximum as the
    run without weights (the pair does not depend on the common scale)."""
    plain = _run(12, ShuffledBatches(60, 20), 1.0)
    scaled = _run(12, ShuffledBatches(60, 20), 1.0, weights=np.full(12, 0.5))
    assert RobustSamplingHeuristic(scaled).epsilon(1e-5) == pytest.approx(
        RobustSamplingHeuristic(plain).epsilon(1e-5), rel=1e-9
    )


def test_robust_refusal_names_run_and_reason() -> None:
    with pytest.raises(ValueError) as info:
        RobustSamplingHeuristic(_run(4, BallsInBins(2), 1.0, [1.0, 2.0, 1.0, 1.0]))
    text = str(info.value)
    assert text.startswith("`run` must have no per-step weights")
    assert text.endswith("computed for plain SGD at a constant learning rate.")


# -- refused inputs -------------------------------------------------------------------------------


@pytest.mark.parametrize("accuracy", [0.0, 1.0, 1.5])
def test_accuracy_outside_the_open_unit_interval_is_named(accuracy) -> None:
    with pytest.raises(ValueError, match=r"^`accuracy` must be in \(0, 1\)"):
        SamplingHeuristic(_run(10, ShuffledBatches(100, 10)), accuracy=accuracy)


def test_a_poisson_run_is_refused_naming_the_schemes() -> None:
    run = DPSGDRun.constant(
        steps=3, sample_rate=0.1, noise_multiplier=1.0, sampling=PoissonSampling(0.1)
    )
    with pytest.raises(
        ValueError, match=r"^`run.sampling` must be ShuffledBatches, DeterministicBatches or BallsInBins"
    ):
        SamplingHeuristic(run)


# -- labels ----------------------------------------------------------------------------------------


def test_labels_say_assumes_only_for_an_unknown_sampler() -> None:
    known = ShuffledBatches(100, 10)
    unknown = UnknownSampling("WeightedRandomSampler", known)
    assert SamplingHeuristic(_run(10, known)).label == (
        f"last-iterate heuristic for {known.describe()}{TAIL}"
    )
    assert SamplingHeuristic(_run(10, unknown)).label == (
        f"last-iterate heuristic for assumes {unknown.describe()}{TAIL}"
    )
    robust = RobustSamplingHeuristic(_run(10, known))
    assert robust.label.startswith("robust last-iterate heuristic") and "assumes" not in robust.label
    assert "shuffled" in repr(robust)
