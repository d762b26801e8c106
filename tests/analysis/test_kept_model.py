"""KeptModel: the incremental form of the chooser (a run kept as it grows).

Each test compares the kept model with the registry's model of the same run built from
scratch (``privacy_model``), the number the chooser defines; the values of the registry are
held against independent computations in ``test_route_conformance.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from opacus_lastiterate.analysis.kept_model import KeptModel
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import SGDSettings, sgd_weights
from opacus_lastiterate.analysis.privacy_models import choose, privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.analysis.sampling import ShuffledBatches

DELTA = 1e-5
PLAIN = SGDSettings(0.1, 0.0, 0.0, False, 0.0)


def _kept(settings: list[SGDSettings | None], sigma: float = 1.0, q: float = 0.1,
          **kw: object) -> KeptModel:
    kept = KeptModel(**kw)  # type: ignore[arg-type]
    for st in settings:
        kept.append(sigma, q, 1, st)
    return kept


def test_plain_sgd_is_the_constant_rate_formula() -> None:
    kept = _kept([PLAIN] * 30)
    assert not kept.uses_weights and kept.choice().kept == "constant"
    run = DPSGDRun.constant(steps=30, sample_rate=0.1, noise_multiplier=1.0)
    assert kept.epsilon(DELTA) == pytest.approx(privacy_model("heuristic", run).epsilon(DELTA),
                                                rel=1e-12)
    assert kept.delta(1.0) == pytest.approx(privacy_model("heuristic", run).delta(1.0), rel=1e-9)


def test_momentum_makes_the_weighted_heuristic() -> None:
    steps = [SGDSettings(0.1, 0.9, 0.0, False, 0.0)] * 20
    kept = _kept(steps)
    assert kept.uses_weights and kept.choice().kept == "weighted"
    w = sgd_weights(np.full(20, 0.1), momentum=0.9)
    run = DPSGDRun.from_history([(1.0, 0.1, 20)], weights=w)
    assert np.allclose(kept.run.weights, w)
    expected = privacy_model("heuristic", run).epsilon(DELTA)
    assert kept.epsilon(DELTA) == pytest.approx(expected, rel=1e-3)
    # delta of a weighted run: the registry's model, from scratch
    assert kept.delta(1.0) == pytest.approx(privacy_model("heuristic", run).delta(1.0), rel=1e-3)


def test_one_step_with_unknown_settings_drops_the_weights_for_good() -> None:
    varying = [SGDSettings(0.1 / (t + 1), 0.0, 0.0, False, 0.0) for t in range(10)]
    kept = _kept(varying)
    assert kept.uses_weights
    kept.append(1.0, 0.1, 1, None)
    kept.append(1.0, 0.1, 1, varying[0])
    assert not kept.uses_weights and kept.settings is None
    run = DPSGDRun.constant(steps=12, sample_rate=0.1, noise_multiplier=1.0)
    assert kept.epsilon(DELTA) == pytest.approx(privacy_model("heuristic", run).epsilon(DELTA),
                                                rel=1e-12)


def test_robust_value_is_of_the_constant_rate_formula() -> None:
    kept = _kept([SGDSettings(0.1, 0.9, 0.0, False, 0.0)] * 15)
    assert not choose("robust_heuristic", sampling=None, weighted=True).weights
    run = DPSGDRun.constant(steps=15, sample_rate=0.1, noise_multiplier=1.0)
    assert kept.epsilon(DELTA, "robust_heuristic") == privacy_model(
        "robust_heuristic", run).epsilon(DELTA)


def test_standard_bounds_of_a_weighted_run_are_those_of_its_steps() -> None:
    """Every step is released: the standard bounds do not depend on the weights, so a run
    with momentum and a changing learning rate has the bounds of its (sigma, q) steps."""
    kept = _kept([SGDSettings(0.1 / (1 + t), 0.9, 0.0, False, 0.0) for t in range(15)])
    assert kept.uses_weights
    run = DPSGDRun.constant(steps=15, sample_rate=0.1, noise_multiplier=1.0)
    for name in ("standard", "standard_rdp"):
        assert not choose(name, sampling=None, weighted=True).weights
        assert kept.epsilon(DELTA, name) == privacy_model(name, run).epsilon(DELTA)


def test_the_scheme_picks_the_model_and_can_change() -> None:
    scheme = ShuffledBatches(dataset_size=100, batch_size=10)
    kept = _kept([PLAIN] * 25)
    poisson = kept.epsilon(DELTA)
    kept.sampling = scheme
    assert kept.choice().kept is None
    run = DPSGDRun.constant(steps=25, sample_rate=0.1, noise_multiplier=1.0, sampling=scheme)
    for name in ("heuristic", "standard"):
        assert kept.epsilon(DELTA, name) == privacy_model(name, run).epsilon(DELTA)
    assert kept.epsilon(DELTA) < poisson * 0.9


def test_from_run_with_settings_equals_appending_them() -> None:
    settings = [SGDSettings(lr, 0.5, 0.0, False, 0.0) for lr in (0.1, 0.1, 0.05, 0.05, 0.05)]
    appended = _kept(settings)
    run = DPSGDRun.from_history([(1.0, 0.1, 2), (1.0, 0.1, 3)])
    built = KeptModel.from_run(run, [(settings[0], 2), (settings[2], 3)])
    assert built.settings == appended.settings
    assert built.epsilon(DELTA) == appended.epsilon(DELTA)
    with pytest.raises(ValueError, match="cover"):
        KeptModel.from_run(run, [(settings[0], 2)])


def test_advance_gives_the_epsilons_of_appending_step_by_step() -> None:
    batch = _kept([PLAIN] * 3)
    eps = batch.advance(1.0, 0.1, 40, DELTA, PLAIN)
    one = _kept([PLAIN] * 3)
    for t in range(40):
        one.append(1.0, 0.1, 1, PLAIN)
        assert eps[t] == pytest.approx(one.epsilon(DELTA), rel=1e-10)
    with pytest.raises(ValueError, match="weights"):
        batch.advance(1.0, 0.1, 2, DELTA, SGDSettings(0.1, 0.9, 0.0, False, 0.0))


def test_a_restored_characteristic_answers_within_the_accuracy() -> None:
    settings = [SGDSettings(0.1, 0.9, 0.0, False, 0.0)] * 30
    kept = _kept(settings)
    first = kept.weighted_result(DELTA)
    saved = kept.characteristic_state()
    assert saved is not None
    restored = KeptModel.from_run(kept.run, [(settings[0], 30)])
    restored.restore_characteristic(saved)
    again = restored.weighted_result(DELTA)
    assert again.epsilon == pytest.approx(first.epsilon, rel=1e-3)
    assert again.lower_bound <= first.epsilon and first.lower_bound <= again.epsilon


def test_settings_of_another_class_are_refused_by_name() -> None:
    kept = KeptModel()
    with pytest.raises(TypeError, match="settings"):
        kept.append(1.0, 0.1, 1, (0.1, 0.0, 0.0, False, 0.0))


def test_weights_that_flip_sign_are_refused_as_a_run_refuses_them() -> None:
    """Adam with an L2 weight decay far above its frozen preconditioner: the weights of an
    independent computation (adaptive_run_weights) are negative, so DPSGDRun refuses them and
    so does every query of the kept model."""
    from opacus_lastiterate.analysis.last_iterate.adaptive_steps import (
        AdaptiveStep,
        adaptive_run_weights,
    )
    from opacus_lastiterate.analysis.last_iterate.adaptive_weights import AdaptiveSettings

    step = AdaptiveStep(AdaptiveSettings("adam", lr=1e-3, weight_decay=0.1), noise_std=1e-6)
    weights = adaptive_run_weights([(step, 20)])
    assert (weights < 0).any()
    with pytest.raises(ValueError, match="weights"):
        DPSGDRun([(1.0, 0.1, 20)], weights=weights)
    kept = KeptModel()
    for _ in range(20):
        kept.append(1.0, 0.1, 1, step)
    with pytest.raises(ValueError, match="finite and >= 0"):
        kept.epsilon(1e-5, "heuristic")
