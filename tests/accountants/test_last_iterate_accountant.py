"""Unit tests of LastIterateAccountant: bookkeeping, validation, state, wiring to the analysis."""

from __future__ import annotations

import copy
import math
import pickle
import re
import warnings
from collections import OrderedDict
from typing import Any

import pytest
from opacus.accountants import IAccountant, RDPAccountant

from opacus_lastiterate.accountants import HeuristicCalibrationWarning, LastIterateAccountant
from opacus_lastiterate.accountants import last_iterate as last_iterate_module
from opacus_lastiterate.analysis.baselines import composition
from opacus_lastiterate.analysis.last_iterate import heuristic
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.exceptions import NonMonotoneHeuristicWarning
from tests.analysis._reference import ClosedFormMixture

SEQUENCE = [(1.0, 0.1)] * 3 + [(1.2, 0.1)] * 2 + [(1.2, 0.05)] + [(1.0, 0.1)] * 4


def _stepped(steps: list[tuple[float, float]]) -> LastIterateAccountant:
    acc = LastIterateAccountant()
    for sigma, q in steps:
        acc.step(noise_multiplier=sigma, sample_rate=q)
    return acc


def test_zero_argument_constructor_and_empty_state() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        acc = LastIterateAccountant()
        assert isinstance(acc, IAccountant)
        assert acc.mechanism() == LastIterateAccountant.mechanism() == "last_iterate"
        assert acc.history == []
        assert len(acc) == 0 and acc.num_steps == 0
        assert acc.get_epsilon(1e-5) == 0.0
        assert acc.get_epsilon(1e-5, robust=True) == 0.0
        assert acc.get_delta(1.0) == 0.0


def test_step_merging_matches_opacus_rdp_accountant() -> None:
    acc = _stepped(SEQUENCE)
    rdp = RDPAccountant()
    for sigma, q in SEQUENCE:
        rdp.step(noise_multiplier=sigma, sample_rate=q)
    expected = [(1.0, 0.1, 3), (1.2, 0.1, 2), (1.2, 0.05, 1), (1.0, 0.1, 4)]
    assert acc.history == expected
    assert acc.history == rdp.history


def test_num_steps_counts_steps_and_len_counts_segments() -> None:
    acc = _stepped(SEQUENCE)
    assert acc.num_steps == len(SEQUENCE) == 10
    assert len(acc) == 4  # Opacus's definition: history segments
    constant = _stepped([(1.0, 0.1)] * 7)
    assert constant.num_steps == 7 and len(constant) == 1


def test_sample_rate_one_is_valid() -> None:
    acc = _stepped([(1.0, 1.0)])
    assert acc.history == [(1.0, 1.0, 1)]


BAD_STEP_ARGUMENTS = [
    ("noise_multiplier", float("nan"), ValueError),
    ("noise_multiplier", -1.0, ValueError),
    ("noise_multiplier", float("inf"), ValueError),
    ("noise_multiplier", True, TypeError),
    ("noise_multiplier", "1.0", TypeError),
    ("noise_multiplier", None, TypeError),
    ("sample_rate", float("nan"), ValueError),
    ("sample_rate", 0.0, ValueError),
    ("sample_rate", -0.1, ValueError),
    ("sample_rate", 1.5, ValueError),
    ("sample_rate", True, TypeError),
    ("sample_rate", "0.1", TypeError),
]


@pytest.mark.parametrize(("name", "value", "error"), BAD_STEP_ARGUMENTS)
def test_bad_step_arguments_raise_and_leave_history_unchanged(
    name: str, value: object, error: type[Exception]
) -> None:
    acc = _stepped([(1.0, 0.1), (1.0, 0.1)])
    before = list(acc.history)
    kwargs: dict[str, Any] = {"noise_multiplier": 1.0, "sample_rate": 0.1}
    kwargs[name] = value
    with pytest.raises(error) as info:
        acc.step(**kwargs)
    message = str(info.value)
    assert f"`{name}`" in message
    if error is ValueError and not (isinstance(value, float) and math.isnan(value)):
        assert repr(value) in message  # the offending value
    assert acc.history == before and acc.num_steps == 2


def test_error_message_format_names_range_and_value() -> None:
    with pytest.raises(ValueError, match=r"^`sample_rate` must be in \(0, 1\], got 1\.5\.$"):
        LastIterateAccountant().step(noise_multiplier=1.0, sample_rate=1.5)


@pytest.mark.parametrize("delta", [0.0, 1.0, -1e-5, float("nan")])
def test_get_epsilon_rejects_bad_delta(delta: float) -> None:
    acc = _stepped([(1.0, 0.1)] * 3)
    with pytest.raises(ValueError, match="`delta`"):
        acc.get_epsilon(delta)


def test_get_epsilon_rejects_non_bool_robust_and_bad_epsilon() -> None:
    acc = _stepped([(1.0, 0.1)] * 3)
    with pytest.raises(TypeError, match="`robust`"):
        acc.get_epsilon(1e-5, robust=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`epsilon`"):
        acc.get_delta(-1.0)


# -- wiring to the analysis layer ----------------------------------------------------------


def test_epsilon_and_delta_equal_the_analysis_functions_on_the_same_history() -> None:
    acc = _stepped(SEQUENCE)
    history = [(1.0, 0.1, 3), (1.2, 0.1, 2), (1.2, 0.05, 1), (1.0, 0.1, 4)]
    for delta in (1e-5, 1e-3):
        assert acc.get_epsilon(delta) == heuristic.LastIterateHeuristic(history).epsilon(delta)
        assert acc.get_epsilon(delta, robust=True) == heuristic.RobustLastIterateHeuristic(history).epsilon(delta)
    assert acc.get_delta(1.5) == heuristic.LastIterateHeuristic(history).delta(1.5)
    # A one-segment history is the constant-parameter heuristic.
    single = _stepped([(0.9, 0.05)] * 12)
    assert single.get_epsilon(1e-5) == pytest.approx(
        privacy_model("heuristic", DPSGDRun.constant(steps=12, sample_rate=0.05, noise_multiplier=0.9)).epsilon(1e-5),
        rel=1e-12,
    )


def test_robust_epsilon_is_the_max_over_every_suffix() -> None:
    # brute force: every suffix of a two-segment history, each evaluated from scratch
    acc = _stepped([(1.0, 0.1)] * 2 + [(2.0, 0.2)])
    suffixes = [[(2.0, 0.2, 1)], [(1.0, 0.1, 1), (2.0, 0.2, 1)], [(1.0, 0.1, 2), (2.0, 0.2, 1)]]
    brute = max(heuristic.LastIterateHeuristic(h).epsilon(1e-6) for h in suffixes)
    assert brute <= acc.get_epsilon(1e-6, robust=True) <= brute * (1 + 1e-6)


def test_zero_noise_step_is_recorded_and_reported_as_inf() -> None:
    acc = _stepped([(1.0, 0.1)])
    with pytest.warns(UserWarning, match="noise_multiplier=0"):
        acc.step(noise_multiplier=0.0, sample_rate=0.1)
    assert acc.history == [(1.0, 0.1, 1), (0.0, 0.1, 1)]
    # a zeroing regulariser would expose the noiseless step: no noise is credited to it
    assert acc.get_epsilon(1e-5) == math.inf == acc.get_epsilon(1e-5, robust=True)
    only = _stepped([(1.0, 0.1)])
    only.history = [(0.0, 0.1, 3)]
    assert only.get_epsilon(1e-5) == math.inf and only.get_delta(5.0) == 1.0


def test_heuristic_is_below_standard_composition() -> None:
    acc = _stepped([(1.0, 0.05)] * 20)
    standard = composition.standard_epsilon(1e-5, steps=20, sample_rate=0.05, noise_multiplier=1.0)
    assert 0.0 < acc.get_epsilon(1e-5) < standard


# -- state_dict -----------------------------------------------------------------------------


def test_state_dict_round_trip() -> None:
    acc = _stepped(SEQUENCE)
    state = acc.state_dict()
    assert set(state) == {"history", "mechanism", "optimizer_trace", "optimizer_trace_disabled"}
    assert state["mechanism"] == "last_iterate"
    assert state["history"] == acc.history
    state["history"].append((5.0, 0.5, 5))  # a copy, not the accountant's list
    assert acc.num_steps == 10

    fresh = LastIterateAccountant()
    with warnings.catch_warnings():
        warnings.simplefilter("error", HeuristicCalibrationWarning)
        fresh.load_state_dict(acc.state_dict())
        assert fresh.history == acc.history
        assert fresh.get_epsilon(1e-5) == acc.get_epsilon(1e-5)


def test_state_dict_fills_a_given_destination() -> None:
    acc = _stepped([(1.0, 0.1)])
    dest: OrderedDict[str, Any] = OrderedDict(other=1)
    assert acc.state_dict(dest) is dest
    assert dest == {
        "other": 1,
        "history": [(1.0, 0.1, 1)],
        "mechanism": "last_iterate",
        "optimizer_trace": {
            f: {"values": [], "steps": []}
            for f in ("lr", "momentum", "dampening", "nesterov", "weight_decay")
        },
        "optimizer_trace_disabled": False,
    }


def test_state_dict_survives_pickle_and_list_entries_are_accepted() -> None:
    acc = _stepped(SEQUENCE)
    state = pickle.loads(pickle.dumps(acc.state_dict()))
    as_lists = {"mechanism": "last_iterate", "history": [list(e) for e in state["history"]]}
    fresh = LastIterateAccountant()
    fresh.load_state_dict(as_lists)  # e.g. after a JSON round trip
    assert fresh.history == acc.history
    assert all(isinstance(e, tuple) for e in fresh.history)


def test_rdp_state_is_rejected_without_changing_state() -> None:
    rdp = RDPAccountant()
    for _ in range(3):
        rdp.step(noise_multiplier=1.0, sample_rate=0.1)
    acc = _stepped([(2.0, 0.2)])
    with pytest.raises(ValueError, match="rdp"):
        acc.load_state_dict(rdp.state_dict())
    assert acc.history == [(2.0, 0.2, 1)]


def test_legacy_state_with_bound_mechanism_method() -> None:
    # Opacus < 1.6 stored ``cls.mechanism`` (the method) instead of its name.
    acc = LastIterateAccountant()
    acc.load_state_dict({"history": [(1.0, 0.1, 2)], "mechanism": LastIterateAccountant.mechanism})
    assert acc.history == [(1.0, 0.1, 2)]
    with pytest.raises(ValueError, match="rdp"):
        acc.load_state_dict({"history": [(1.0, 0.1, 9)], "mechanism": RDPAccountant.mechanism})
    assert acc.history == [(1.0, 0.1, 2)]


CORRUPT_STATES: list[tuple[object, type[Exception], str]] = [
    (None, TypeError, "state_dict"),
    ({}, ValueError, "history"),
    ({"history": [(1.0, 0.1, 1)]}, ValueError, "mechanism"),
    ({"mechanism": "last_iterate"}, ValueError, "history"),
    ({"history": [(1.0, 0.1, 1)], "mechanism": "prv"}, ValueError, "prv"),
    ({"history": "abc", "mechanism": "last_iterate"}, TypeError, "state_dict['history']"),
    ({"history": None, "mechanism": "last_iterate"}, TypeError, "state_dict['history']"),
    (
        {"history": [(1.0, 0.1, 3), (1.0, 1.5, 2)], "mechanism": "last_iterate"},
        ValueError,
        "state_dict['history'][1].sample_rate",
    ),
    (
        {"history": [(1.0, 0.1, 3), (float("nan"), 0.1, 2)], "mechanism": "last_iterate"},
        ValueError,
        "state_dict['history'][1].noise_multiplier",
    ),
    (
        {"history": [(1.0, 0.1, 0)], "mechanism": "last_iterate"},
        ValueError,
        "state_dict['history'][0].steps",
    ),
    (
        {"history": [(1.0, 0.1, 2.0)], "mechanism": "last_iterate"},
        TypeError,
        "state_dict['history'][0].steps",
    ),
    (
        {"history": [(1.0, 0.1)], "mechanism": "last_iterate"},
        TypeError,
        "state_dict['history'][0]",
    ),
]


@pytest.mark.parametrize(("state", "error", "fragment"), CORRUPT_STATES)
def test_corrupt_state_is_rejected_without_changing_state(
    state: object, error: type[Exception], fragment: str
) -> None:
    acc = _stepped([(2.0, 0.2)] * 2)
    before, eps = copy.deepcopy(acc.state_dict()), acc.get_epsilon(1e-5)
    with pytest.raises(error) as info:
        acc.load_state_dict(state)  # type: ignore[arg-type]
    assert fragment in str(info.value)
    assert acc.state_dict() == before and acc.get_epsilon(1e-5) == eps


# -- direct assignment of ``history`` (what Opacus's get_noise_multiplier does) -------------


def test_assigned_history_warns_once_about_heuristic_calibration() -> None:
    acc = LastIterateAccountant()
    acc.history = [(1.0, 0.1, 10)]
    with pytest.warns(HeuristicCalibrationWarning, match="not a differential-privacy guarantee"):
        eps = acc.get_epsilon(1e-5)
    assert issubclass(HeuristicCalibrationWarning, UserWarning)
    assert eps == heuristic.LastIterateHeuristic([(1.0, 0.1, 10)]).epsilon(1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HeuristicCalibrationWarning)
        acc.history = [(2.0, 0.1, 10)]
        acc.get_epsilon(1e-5)  # already warned for this accountant


def test_recorded_steps_do_not_warn() -> None:
    acc = _stepped([(1.0, 0.1)] * 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HeuristicCalibrationWarning)
        acc.get_epsilon(1e-5)
        acc.get_delta(1.0)


def test_invalid_assigned_history_raises_and_leaves_state() -> None:
    acc = _stepped([(1.0, 0.1)] * 2)
    with pytest.raises(ValueError, match=r"`history\[0\].sample_rate`"):
        acc.history = [(1.0, 2.0, 3)]
    assert acc.history == [(1.0, 0.1, 2)]


def test_history_is_a_copy_that_cannot_corrupt_the_accountant() -> None:
    acc = _stepped([(1.0, 0.1)] * 2)
    eps = acc.get_epsilon(1e-5)
    acc.history.append((float("nan"), 0.1, 1))
    assert acc.history == [(1.0, 0.1, 2)] and acc.get_epsilon(1e-5) == eps


# -- display, copying -----------------------------------------------------------------------


def _described(text: str, label: str) -> float:
    match = re.search(rf"{label}[^:]*: (\d+\.\d{{4}})", text)
    assert match is not None, (label, text)
    return float(match.group(1))


@pytest.mark.parametrize(
    "sigma,q,steps,report_robust",
    # (0.5, 0.01, 20): eps_20 = 0.75 < eps_1 = 3.03, the robust value is above the plain one
    [(1.0, 0.1, 3, False), (0.5, 0.01, 20, True)],
)
def test_describe_and_repr_say_it_is_a_heuristic_for_the_final_model(
    sigma: float, q: float, steps: int, report_robust: bool
) -> None:
    """The caveat in every text; the steps, the heuristic epsilon and the robust epsilon that
    describe() prints (4 decimals) are those of Binomial(T, q) + N(0, sigma^2 T) against
    N(0, sigma^2 T) and their max over t <= T, by the independent closed form of
    tests/analysis/_reference.py."""
    acc = _stepped([(sigma, q)] * steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonMonotoneHeuristicWarning)
        texts = (acc.describe(), acc.describe(1e-5), repr(acc))
    for text in texts:
        assert "heuristic" in text
        assert "final model only" in text
        assert "not a proven DP bound" in text
    assert f"{steps} steps in 1 segment" in texts[0]
    assert f"num_steps={steps}" in texts[2]
    eps_t = [ClosedFormMixture.binomial(t, q, sigma).epsilon(1e-5) for t in range(1, steps + 1)]
    plain = _described(texts[1], "Heuristic epsilon at delta=1e-05")
    robust = _described(texts[1], "Robust heuristic epsilon")
    assert abs(plain - eps_t[-1]) <= 5e-5 + 1e-12  # printed to 4 decimals
    assert abs(robust - max(eps_t)) <= 5e-5 + 1e-12
    assert ("above the plain value: report it" in texts[1]) == report_robust
    assert "Heuristic epsilon" not in texts[0]


def test_deepcopy_and_pickle_keep_history() -> None:
    acc = _stepped(SEQUENCE)
    for clone in (copy.deepcopy(acc), pickle.loads(pickle.dumps(acc))):
        assert clone.history == acc.history
        clone.step(noise_multiplier=1.0, sample_rate=0.1)
        assert clone.num_steps == acc.num_steps + 1


def test_opacus_optimizer_hook_records_steps() -> None:
    class FakeOptimizer:
        noise_multiplier = 0.8
        accumulated_iterations = 2

    acc = LastIterateAccountant()
    hook = acc.get_optimizer_hook_fn(sample_rate=0.01)
    hook(FakeOptimizer())  # type: ignore[arg-type]
    hook(FakeOptimizer())  # type: ignore[arg-type]
    assert acc.history == [(0.8, 0.02, 2)]


def test_module_exports() -> None:
    assert last_iterate_module.MECHANISM == "last_iterate"
    assert "LastIterateAccountant" in last_iterate_module.__all__


def test_multi_segment_non_monotonicity_is_found_by_the_spread_out_check() -> None:
    # a long, very noisy first segment, then steps with little noise: the last step alone
    # is far less private than the whole run (eps_T < eps of a short suffix)
    acc = LastIterateAccountant()
    acc.history = [(3.0, 0.05, 1000)]
    acc.load_state_dict(acc.state_dict())  # recorded, not assigned: no calibration warning
    with pytest.warns(NonMonotoneHeuristicWarning, match="last 1 steps alone"):
        for _ in range(20):
            acc.step(noise_multiplier=0.4, sample_rate=0.05)
            acc.get_epsilon(1e-6)
    clone = copy.deepcopy(acc)  # a pending check (a generator) is dropped, not copied
    assert clone.get_epsilon(1e-6) == acc.get_epsilon(1e-6)


# -- calibration (make_private_with_epsilon): plain by default, robust when asked ------------


def _brute_force_robust(sigma: float, q: float, steps: int, delta: float) -> float:
    """max over t <= T of the heuristic epsilon of t steps, every t evaluated."""
    return max(
        privacy_model("heuristic", DPSGDRun.constant(steps=t, sample_rate=q, noise_multiplier=sigma)).epsilon(delta)
        for t in range(1, steps + 1)
    )


@pytest.mark.parametrize("target,q,steps", [(4.0, 0.02, 150), (8.0, 0.05, 60)])
def test_calibration_meets_the_target_on_the_value_asked_for(target, q, steps) -> None:
    """No hidden switch: an assigned history (Opacus's get_noise_multiplier) is answered
    like a recorded one, so the default calibrates the plain value, and robust=True (which
    make_private_with_epsilon forwards) the robust one. In these settings the plain
    heuristic is not monotone in T: the plain calibration leaves the robust value far above
    the target, which the calibration warning says."""
    from opacus.accountants.utils import get_noise_multiplier

    delta = 1e-5
    with pytest.warns(HeuristicCalibrationWarning, match="pass robust=True"):
        sigma_plain = get_noise_multiplier(
            target_epsilon=target, target_delta=delta, sample_rate=q, steps=steps,
            accountant="last_iterate",
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HeuristicCalibrationWarning)
        sigma = get_noise_multiplier(
            target_epsilon=target, target_delta=delta, sample_rate=q, steps=steps,
            accountant="last_iterate", robust=True,
        )
    robust = _brute_force_robust(sigma, q, steps, delta)
    assert target - 0.05 <= robust <= target * (1 + 1e-6)  # Opacus stops within 0.01
    plain = privacy_model("heuristic", DPSGDRun.constant(steps=steps, sample_rate=q, noise_multiplier=sigma_plain)).epsilon(delta)
    assert target - 0.05 <= plain <= target * (1 + 1e-9)
    assert _brute_force_robust(sigma_plain, q, steps, delta) > target * 1.05  # what robust fixes


def test_assigned_and_recorded_histories_answer_alike() -> None:
    recorded = _stepped([(0.39, 0.02)] * 150)
    assigned = LastIterateAccountant()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assigned.history = [(0.39, 0.02, 150)]
        assert assigned.get_epsilon(1e-6) == pytest.approx(recorded.get_epsilon(1e-6), rel=1e-12)
        assert assigned.get_epsilon(1e-6, robust=True) == recorded.get_epsilon(1e-6, robust=True)


def test_an_unknown_keyword_is_a_type_error() -> None:
    acc = _stepped([(1.0, 0.01)] * 10)
    with pytest.raises(TypeError, match="robus"):
        acc.get_epsilon(1e-5, robus=True)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="`robust` must be a bool"):
        acc.get_epsilon(1e-5, robust=None)  # type: ignore[arg-type]


def test_recorded_steps_report_the_plain_value_by_default() -> None:
    acc = _stepped([(0.39, 0.02)] * 150)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonMonotoneHeuristicWarning)
        plain = acc.get_epsilon(1e-6)
    assert plain == pytest.approx(heuristic.LastIterateHeuristic([(0.39, 0.02, 150)]).epsilon(1e-6), rel=1e-12)
    assert acc.get_epsilon(1e-6, robust=True) > plain * 1.01


def test_a_long_replay_batch_gives_the_values_from_scratch() -> None:
    """replay_steps of 3,000 steps from the first one (solved in batches as long as the run
    so far) returns, after each step, the heuristic of the run up to that step computed from
    scratch (1e-9 relative, the root finders' tolerances)."""
    from opacus_lastiterate.analysis.last_iterate.optimizer_weights import SGDSettings

    acc = LastIterateAccountant()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonMonotoneHeuristicWarning)
        eps = acc.replay_steps(1.0, 0.01, SGDSettings(0.1, 0.0, 0.0, False, 0.0), 3000, delta=1e-5)
    assert eps is not None and eps.shape == (3000,) and acc.num_steps == 3000
    for t in (1, 2, 17, 100, 1000, 1001, 2999, 3000):
        expected = heuristic.LastIterateHeuristic([(1.0, 0.01, t)]).epsilon(1e-5)
        assert eps[t - 1] == pytest.approx(expected, rel=1e-9), t
