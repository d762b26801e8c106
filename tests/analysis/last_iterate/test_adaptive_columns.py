"""An adaptive run kept as numpy columns (analysis/last_iterate/adaptive_columns.py): the kept
model built from columns holds no Python object per step, answers what the model fed step by
step answers (the same floats: the vectorised SGD equivalent repeats the per-step one bit for
bit), and its weights match an independent numpy simulation of AdamW."""

from __future__ import annotations

import math

import numpy as np
import pytest

from opacus_lastiterate.analysis.kept_model import KeptModel
from opacus_lastiterate.analysis.last_iterate.adaptive_columns import (
    AdaptiveColumns,
    adaptive_columns_weights,
)
from opacus_lastiterate.analysis.last_iterate.adaptive_steps import (
    AdaptiveStep,
    SGDEquivalent,
    adaptive_run_weights,
)
from opacus_lastiterate.analysis.last_iterate.adaptive_weights import AdaptiveSettings
from opacus_lastiterate.analysis.run import DPSGDRun

DELTA = 1e-5
SIGMA, Q = 1.5, 0.02


def _runs(seed: int, name: str = "adamw", **options: object) -> list[tuple[AdaptiveStep, int]]:
    """Random runs: a learning rate that changes at most steps, noise that changes, runs of
    1 to 3 identical steps (and some of 0)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(int(rng.integers(20, 200))):
        settings = AdaptiveSettings(name, float(rng.uniform(1e-4, 1e-2)), **options)
        step = AdaptiveStep(settings, float(rng.choice([0.02, 0.05])))
        out.append((step, int(rng.integers(0, 4))))
    return out


CASES = [
    ("adamw", {"weight_decay": 0.01}),
    ("adamw", {"weight_decay": 0.3, "amsgrad": True, "beta2": 0.99}),
    ("adam", {}),
    ("adam", {"eps": 1e-2, "beta1": 0.5}),
]


@pytest.mark.parametrize("name, options", CASES)
def test_the_vectorised_sgd_equivalent_repeats_the_step_by_step_one_bit_for_bit(name, options):
    runs = _runs(1, name, **options)
    step_by_step = SGDEquivalent()
    expected = [step_by_step.append(s).lr for s, n in runs for _ in range(n)]  # type: ignore[union-attr]
    half = len(runs) // 2
    vectorised = SGDEquivalent()
    first = vectorised.extend(AdaptiveColumns.from_runs(runs[:half]))
    second = vectorised.extend(AdaptiveColumns.from_runs(runs[half:]))
    assert first is not None and second is not None
    assert np.concatenate([first, second]).tolist() == expected
    # and continues step by step from where the columns left it
    mixed = SGDEquivalent()
    mixed.extend(AdaptiveColumns.from_runs(runs[:half]))
    rest = [mixed.append(s).lr for s, n in runs[half:] for _ in range(n)]  # type: ignore[union-attr]
    assert rest == expected[len(first) :]


def test_columns_that_do_not_map_onto_sgd_end_the_equivalent():
    l2 = [(AdaptiveStep(AdaptiveSettings("adam", 1e-3, weight_decay=0.1), 0.02), 3)]
    eq = SGDEquivalent()
    assert eq.extend(AdaptiveColumns.from_runs(l2)) is None and not eq.supported
    betas = [(AdaptiveStep(AdaptiveSettings("adam", 1e-3, beta1=b), 0.02), 2) for b in (0.9, 0.8)]
    eq = SGDEquivalent()
    assert eq.extend(AdaptiveColumns.from_runs(betas)) is None and not eq.supported


def _numpy_adamw(lrs, stds, *, beta1, beta2, eps, weight_decay):
    """The final-parameter response of torch's AdamW on one coordinate to a unit gradient at
    each step, second moment frozen at its expectation, simulated forward."""
    T = len(lrs)
    v, acc = np.zeros(T), 0.0
    for t in range(T):
        acc = beta2 * acc + (1 - beta2) * stds[t] ** 2
        v[t] = acc
    out = np.empty(T)
    for impulse in range(T):
        p = m = 0.0
        for t in range(T):
            g = 1.0 if t == impulse else 0.0
            p *= 1 - lrs[t] * weight_decay
            m = beta1 * m + (1 - beta1) * g
            p -= lrs[t] * m / (1 - beta1 ** (t + 1)) / (
                math.sqrt(v[t] / (1 - beta2 ** (t + 1))) + eps)  # fmt: skip
        out[impulse] = -p
    return out


def test_weights_from_columns_match_a_numpy_adamw_and_the_list_api():
    runs = _runs(2, "adamw", weight_decay=0.05)
    lrs = [s.settings.lr for s, n in runs for _ in range(n)]
    stds = [s.noise_std for s, n in runs for _ in range(n)]
    w = adaptive_columns_weights(AdaptiveColumns.from_runs(runs))
    expected = _numpy_adamw(lrs, stds, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.05)
    np.testing.assert_allclose(w, expected, rtol=1e-9)
    assert w.tolist() == adaptive_run_weights(runs).tolist()


@pytest.mark.parametrize("name, options", [*CASES, ("nadam", {}), ("rmsprop", {"beta1": 0.5})])
def test_a_kept_model_built_from_columns_makes_no_object_per_step_and_answers_the_same(
    name, options, monkeypatch
):
    runs = _runs(3, name, **options)
    steps = sum(n for _, n in runs)
    appended = KeptModel()
    for step, n in runs:
        appended.append(SIGMA, Q, n, step)
    made = []
    original = AdaptiveStep.__post_init__

    def counted(self: AdaptiveStep) -> None:
        made.append(self)
        original(self)

    monkeypatch.setattr(AdaptiveStep, "__post_init__", counted)
    columns = AdaptiveColumns.from_runs(runs)
    made.clear()
    run = DPSGDRun.constant(steps=steps, sample_rate=Q, noise_multiplier=SIGMA)
    built = KeptModel.from_run(run, columns)
    eps = built.epsilon(DELTA)
    weights = built.weights()
    assert len(made) <= 2 < steps  # the last run's step, not one per step or run
    assert eps == appended.epsilon(DELTA)
    assert weights.tolist() == appended.weights().tolist()
    # both continue with the same floats
    more = AdaptiveStep(AdaptiveSettings(name, 3e-3, **options), 0.03)  # type: ignore[arg-type]
    for kept in (built, appended):
        kept.append(SIGMA, Q, 2, more)
    assert built.epsilon(DELTA) == appended.epsilon(DELTA)


def test_mixed_optimizers_in_columns_are_refused_by_the_weights():
    runs = [
        (AdaptiveStep(AdaptiveSettings("adam", 1e-3), 0.02), 2),
        (AdaptiveStep(AdaptiveSettings("nadam", 1e-3), 0.02), 1),
    ]
    with pytest.raises(ValueError, match=r"settings\[2\]\.optimizer"):
        adaptive_columns_weights(AdaptiveColumns.from_runs(runs))


def test_settings_columns_rebuild_the_same_model_without_objects_per_run(monkeypatch):
    runs = _runs(4, "adamw", weight_decay=0.01)
    kept = KeptModel()
    for step, n in runs:
        kept.append(SIGMA, Q, n, step)
    made = []
    original = AdaptiveStep.__post_init__
    monkeypatch.setattr(
        AdaptiveStep, "__post_init__", lambda self: (made.append(self), original(self))[1]
    )
    again = KeptModel.from_run(kept.run, kept.settings_columns)
    assert len(made) <= 2 < len(runs)
    assert again.epsilon(DELTA) == kept.epsilon(DELTA)
    assert again.settings == kept.settings  # the same steps, read back as objects
    assert KeptModel().settings_columns is None


def test_the_trace_gives_back_the_runs_it_was_given_and_grows_from_columns():
    from opacus_lastiterate.analysis.last_iterate.adaptive_columns import AdaptiveStepTrace

    runs = _runs(5, "adam", amsgrad=True) + _runs(6, "adam", amsgrad=True)
    expected = [(s, n) for s, n in runs if n > 0]
    merged: list[tuple[AdaptiveStep, int]] = []  # identical neighbours are one run
    for s, n in expected:
        if merged and merged[-1][0] == s:
            merged[-1] = (s, merged[-1][1] + n)
        else:
            merged.append((s, n))
    grown = AdaptiveStepTrace(runs)
    assert grown.runs() == merged and grown.covered == sum(n for _, n in runs)
    half = len(runs) // 2
    resumed = AdaptiveStepTrace(AdaptiveColumns.from_runs(runs[:half]))
    for s, n in runs[half:]:
        if n:
            resumed.append(s, n)
    assert resumed.runs() == merged and resumed.last == merged[-1][0]
    columns = resumed.columns()
    for got, want in zip(columns, AdaptiveColumns.from_runs(merged), strict=True):
        assert got.tolist() == want.tolist()
