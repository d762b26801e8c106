"""The contract of every registered privacy model (``analysis.privacy_models``), by property:

* inverse pair: for e >= 0 with d = delta(e) in (1e-12, 1),
  ``epsilon(d) <= e (1 + r_eps) + a`` (d is a valid delta at e, so the smallest epsilon
  valid at d is at most e) and ``epsilon(d (1 - r_delta)) >= e (1 - r_eps) - a`` (d is not
  above the smallest delta at e by more than r_delta). Both hold also where delta(.) is flat
  (an infinite-loss mass, the KL bound of RDP), where epsilon(d) can be far below e;
* monotone: epsilon is non-increasing in delta and in the noise multiplier, non-decreasing in
  the number of steps where the theory says so (below);
* bad input: every argument of the wrong type, NaN, inf or out of range is a TypeError or
  ValueError that names it.

Tolerances (r_eps, r_delta, a) come from each model's documented accuracy:

* heuristic, full_batch: one root search to 1e-14 (1 + |y|) (``gaussian_mixture``,
  ``gaussian_mechanism``): 1e-10 relative, 1e-12 absolute;
* robust_heuristic: epsilon certified within 1e-6 relative (+2e-14) of an attained eps_t
  (``suffix_maximum``), delta by bisection on log delta to 1e-6: r_eps = 1e-6, r_delta = 2e-6;
* standard, asgm, feasgm (PLD): epsilon and delta are read off the same pessimistic discrete
  PMF (the discretisation makes both an upper bound on the continuous model, but they are
  exact inverses of each other on that PMF), so only dp_accounting's floating point
  remains: 1e-9 relative, 1e-9 absolute (its inversion returns up to ~1e-11 where the exact
  answer is 0; the grid step is 1e-3);
* standard_rdp: closed-form conversions per order (dp_accounting): 1e-10 relative.

Step monotonicity: the plain heuristic is *not* monotone in T (``docs/last_iterate.md``,
"Known counterexamples", non-monotonicity), so it is checked on ``robust_heuristic``
(a max over the last t <= T steps, monotone by construction) and on the composition models
(releasing more steps is never more private). Noise monotonicity: adding independent
Gaussian noise is a post-processing for every model but FEASGM, whose noise is divided by a
divisor that differs between the two worlds: FEASGM is not checked in sigma.

The PLD models use a coarse interval (1e-3) and small T to stay fast; ASGM and FEASGM (which
build exact-tail PLDs) get a fixed example by default and the property runs under ``slow``.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from opacus_lastiterate.analysis.privacy_models import (
    PRIVACY_MODEL_NAMES,
    PRIVACY_MODELS,
    privacy_model,
)
from opacus_lastiterate.analysis.run import DPSGDRun, Normalisation

logging.getLogger("absl").setLevel(logging.ERROR)  # dp_accounting's RDP order notices

# name -> (r_eps, r_delta, a): module docstring
TOLERANCE = {
    "heuristic": (1e-10, 1e-10, 1e-12),
    "full_batch": (1e-10, 1e-10, 1e-12),
    "robust_heuristic": (1e-6, 2e-6, 2e-14),
    "standard": (1e-9, 1e-9, 1e-9),
    "asgm": (1e-9, 1e-9, 1e-9),
    "feasgm": (1e-9, 1e-9, 1e-9),
    "standard_rdp": (1e-10, 1e-10, 1e-12),
}
PARAMS: dict[str, dict[str, Any]] = {
    "standard": {"value_discretization_interval": 1e-3},
    "asgm": {"value_discretization_interval": 1e-3},
    "feasgm": {"value_discretization_interval": 1e-3},
}
HEAVY = ("asgm", "feasgm")
LIGHT = tuple(n for n in PRIVACY_MODEL_NAMES if n not in HEAVY)
STEP_MONOTONE = ("robust_heuristic", "standard", "standard_rdp", "full_batch", "asgm", "feasgm")
NOISE_MONOTONE = tuple(n for n in PRIVACY_MODEL_NAMES if n != "feasgm")

FAST = settings(max_examples=12, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=4, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])

steps_st = st.integers(1, 30)
rate_st = st.floats(0.01, 0.5)
sigma_st = st.floats(0.7, 4.0)
eps_st = st.floats(0.0, 4.0)


def _run(steps: int, q: float, sigma: float) -> DPSGDRun:
    norm = Normalisation("realised", dataset_size=60, batch_size=6, dimension=4)
    return DPSGDRun.from_history([(sigma, q, steps)], normalisation=norm)


def _model(name: str, steps: int, q: float, sigma: float):
    return privacy_model(name, _run(steps, q, sigma), **PARAMS.get(name, {}))


def test_the_registry_names_the_lead_vocabulary() -> None:
    assert PRIVACY_MODEL_NAMES == (
        "heuristic", "robust_heuristic", "standard", "standard_rdp", "full_batch", "asgm",
        "feasgm",
    )
    assert set(TOLERANCE) == set(PRIVACY_MODEL_NAMES)
    for name, entry in PRIVACY_MODELS.items():
        assert entry.name == name and entry.description
        assert entry.cls.kind == entry.kind, name  # the class says the same kind
        assert entry.kind in ("exact", "heuristic", "upper_bound", "model")


# -- inverse pair -------------------------------------------------------------------------


def _check_inverse(name: str, steps: int, q: float, sigma: float, e: float) -> None:
    model = _model(name, steps, q, sigma)
    r_eps, r_delta, a = TOLERANCE[name]
    d = model.delta(e)
    assert isinstance(d, float) and 0.0 <= d <= 1.0
    if not 1e-12 < d < 1.0:  # outside what floating point resolves
        assume(False)
    back = model.epsilon(d)
    assert isinstance(back, float)
    assert back <= e * (1 + r_eps) + a, (back, e, d)
    assert model.epsilon(d * (1 - r_delta)) >= e * (1 - r_eps) - a, (e, d)


@pytest.mark.parametrize("name", LIGHT)
@FAST
@given(steps=steps_st, q=rate_st, sigma=sigma_st, e=eps_st)
def test_epsilon_inverts_delta(name: str, steps: int, q: float, sigma: float, e: float) -> None:
    _check_inverse(name, steps, q, sigma, e)


@pytest.mark.parametrize("name", HEAVY)
def test_epsilon_inverts_delta_heavy_example(name: str) -> None:
    for e in (0.3, 1.5):
        assert 1e-12 < _model(name, 5, 0.1, 1.2).delta(e) < 1.0  # the check is not skipped
        _check_inverse(name, 5, 0.1, 1.2, e)


@pytest.mark.slow
@pytest.mark.parametrize("name", HEAVY)
@SLOW
@given(steps=st.integers(1, 4), q=st.floats(0.01, 0.3), sigma=st.floats(1.0, 3.0), e=eps_st)
def test_epsilon_inverts_delta_heavy(name: str, steps: int, q: float, sigma: float,
                                     e: float) -> None:
    _check_inverse(name, steps, q, sigma, e)


# -- monotonicity -------------------------------------------------------------------------


@pytest.mark.parametrize("name", LIGHT)
@FAST
@given(steps=steps_st, q=rate_st, sigma=sigma_st,
       d1=st.floats(1e-10, 0.5), factor=st.floats(1.0, 100.0))
def test_epsilon_is_non_increasing_in_delta(name: str, steps: int, q: float, sigma: float,
                                            d1: float, factor: float) -> None:
    model = _model(name, steps, q, sigma)
    r_eps, _, a = TOLERANCE[name]
    d2 = min(d1 * factor, 0.99)
    assert model.epsilon(d2) <= model.epsilon(d1) * (1 + r_eps) + a
    e = model.epsilon(d1)
    assert model.delta(e + 0.1) <= model.delta(e) * (1 + TOLERANCE[name][1]) + a


@pytest.mark.parametrize("name", [n for n in STEP_MONOTONE if n not in HEAVY])
@FAST
@given(steps=steps_st, extra=st.integers(1, 20), q=rate_st, sigma=sigma_st,
       delta=st.floats(1e-9, 1e-2))
def test_epsilon_is_non_decreasing_in_steps(name: str, steps: int, extra: int, q: float,
                                            sigma: float, delta: float) -> None:
    r_eps, _, a = TOLERANCE[name]
    fewer = _model(name, steps, q, sigma).epsilon(delta)
    more = _model(name, steps + extra, q, sigma).epsilon(delta)
    assert more >= fewer * (1 - r_eps) - a


@pytest.mark.parametrize("name", [n for n in NOISE_MONOTONE if n not in HEAVY])
@FAST
@given(steps=steps_st, q=rate_st, sigma=sigma_st, more=st.floats(1.0, 3.0),
       delta=st.floats(1e-9, 1e-2))
def test_epsilon_is_non_increasing_in_noise(name: str, steps: int, q: float, sigma: float,
                                            more: float, delta: float) -> None:
    r_eps, _, a = TOLERANCE[name]
    noisier = _model(name, steps, q, sigma * more).epsilon(delta)
    assert noisier <= _model(name, steps, q, sigma).epsilon(delta) * (1 + r_eps) + a


@pytest.mark.slow
@pytest.mark.parametrize("name", HEAVY)
def test_heavy_models_are_monotone_in_steps_and_asgm_in_noise(name: str) -> None:
    eps = [_model(name, t, 0.1, 1.5).epsilon(1e-5) for t in (1, 3, 9)]
    assert eps == sorted(eps)
    if name in NOISE_MONOTONE:
        eps = [_model(name, 4, 0.1, s).epsilon(1e-5) for s in (0.8, 1.6, 3.2)]
        assert eps == sorted(eps, reverse=True)


# -- bad input ------------------------------------------------------------------------------

BAD_DELTAS = [("0.1", TypeError), (None, TypeError), (True, TypeError), (math.nan, ValueError),
              (math.inf, ValueError), (0.0, ValueError), (1.0, ValueError), (-0.1, ValueError),
              (2.0, ValueError)]
BAD_EPSILONS = [("1", TypeError), (None, TypeError), (False, TypeError), (math.nan, ValueError),
                (math.inf, ValueError), (-1e-9, ValueError), (-math.inf, ValueError)]


@pytest.fixture(scope="module")
def models() -> dict[str, Any]:
    # the queries are validated before anything is computed: the heavy models stay cheap
    return {name: _model(name, 3, 0.1, 1.0) for name in PRIVACY_MODEL_NAMES}


@pytest.mark.parametrize("name", PRIVACY_MODEL_NAMES)
@pytest.mark.parametrize(("value", "error"), BAD_DELTAS)
def test_bad_delta_names_the_parameter(models, name: str, value: object, error: type) -> None:
    with pytest.raises(error, match="`delta`"):
        models[name].epsilon(value)


@pytest.mark.parametrize("name", PRIVACY_MODEL_NAMES)
@pytest.mark.parametrize(("value", "error"), BAD_EPSILONS)
def test_bad_epsilon_names_the_parameter(models, name: str, value: object, error: type) -> None:
    with pytest.raises(error, match="`epsilon`"):
        models[name].delta(value)


BAD_PARAMS = [
    (name, param, value, error)
    for name in ("standard", "asgm", "feasgm")
    for param, value, error in [
        ("value_discretization_interval", 0.0, ValueError),
        ("value_discretization_interval", -1e-3, ValueError),
        ("value_discretization_interval", math.nan, ValueError),
        ("value_discretization_interval", math.inf, ValueError),
        ("value_discretization_interval", "1e-3", TypeError),
    ]
] + [
    ("asgm", "discretization_method", "floor", ValueError),
    ("feasgm", "discretization_method", 1, TypeError),
    ("heuristic", "accuracy", 0.0, ValueError),
    ("heuristic", "accuracy", math.nan, ValueError),
    ("heuristic", "accuracy", "0.1", TypeError),
    ("standard_rdp", "orders", [2.0, 1.0], ValueError),
    ("standard_rdp", "orders", [2.0, math.nan], ValueError),
    ("standard_rdp", "orders", "2", TypeError),
    ("standard_rdp", "orders", [], ValueError),
]


@pytest.mark.parametrize(("name", "param", "value", "error"), BAD_PARAMS)
def test_bad_model_parameter_names_it(name: str, param: str, value: object, error: type) -> None:
    with pytest.raises(error, match=param):
        privacy_model(name, _run(3, 0.1, 1.0), **{param: value})


@pytest.mark.parametrize("name", PRIVACY_MODEL_NAMES)
def test_unknown_parameter_and_name_are_refused(name: str) -> None:
    with pytest.raises(TypeError, match="no_such_option"):
        privacy_model(name, _run(3, 0.1, 1.0), no_such_option=1)
    with pytest.raises(ValueError, match="robust_heuristic"):  # the valid names are listed
        privacy_model("robust", _run(3, 0.1, 1.0))
    with pytest.raises(TypeError, match="`name`"):
        privacy_model(3, _run(3, 0.1, 1.0))  # type: ignore[arg-type]
