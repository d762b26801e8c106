"""The contract of every registered accountant, by property (hypothesis).

The accountant half of the contract whose privacy-model half is
``tests/analysis/test_privacy_model_contract.py``. Parametrised over
``registered_accountants()`` (a new accountant is covered, and must state its tolerance in
:data:`TOLERANCE`); an accountant whose answer depends on ``configure(standard=...)`` is
checked once per standard accountant (:data:`STANDARD_SETTINGS`: ``FEASGMAccountant``'s
"pld", "rdp", "prv"). Histories
``[(sigma, q, steps), ...]`` are drawn by hypothesis (sigma in [1, 4], q in [1e-3, 1] and
q = 1, at most 3 segments of at most 6 steps: fast PLDs) and enter through ``step``,
``history =``, ``with_history`` and ``load_state_dict``.

(a) inverse pair, for e >= 0 with d = get_delta(e) in (1e-12, 1):
    ``get_epsilon(d) <= e (1 + r_eps) + a`` and ``get_epsilon(d (1 - r_delta)) >= e (1 - r_eps)
    - a``; and the other direction, for d drawn and e = get_epsilon(d) finite:
    ``get_delta(e) <= d (1 + r_delta) + a``, with ``>= d (1 - r_delta) - a`` where e > 0.
    ``feasgm`` with ``standard="rdp"`` is also checked against Opacus's own
    ``RDPAccountant.get_epsilon`` (an independent implementation of the conversion).
(b) epsilon non-increasing in delta (delta non-increasing in epsilon), non-increasing in the
    noise (every sigma scaled by a factor >= 1), non-decreasing in the number of steps
    (steps appended). The plain last-iterate heuristic is *not* monotone in the number of
    steps (``docs/last_iterate.md``, "Known counterexamples": a later step can dilute the
    sampled one), so steps are checked with ``get_epsilon(delta, robust=True)``, the
    certified max over the last t <= T steps, monotone by construction.
(c) the routes agree: stepped, assigned (``history =``), ``with_history`` and a fresh,
    unconfigured accountant that loaded the ``state_dict`` have the same state and the same
    epsilon and delta; ``take_back(k)`` equals an accountant that never recorded the last k
    steps; ``with_history(h)`` leaves the original unchanged.
(d) every bad input to ``step``, ``get_epsilon``, ``get_delta``, ``take_back``,
    ``with_history``, ``history =`` and ``load_state_dict`` (wrong type, bool, NaN, +-inf,
    out of range, malformed or empty entries) is a TypeError/ValueError whose message names
    the parameter, and the accountant's ``state_dict()`` (and epsilon) are unchanged.
(e) an empty accountant: epsilon 0, delta 0, ``len`` 0, ``num_steps`` 0.
(f) a keyword that ``get_epsilon`` does not take is a TypeError naming it (Opacus's
    ``make_private_with_epsilon`` forwards its extra keywords there).

Tolerances (r_eps, r_delta, a), from each accountant's documented accuracy:

* last_iterate: one root search to 1e-14 (1 + |y|) on the heuristic's hockey-stick
  divergence: 1e-10 relative, 1e-12 absolute; its robust value is certified within 1e-6
  relative (+2e-14) of an attained eps_t (``suffix_maximum``): r_eps = 1e-6 for (b) steps.
* asgm, feasgm "pld": epsilon and delta are read off the same pessimistic discrete PLD
  (exact inverses on that PMF), so only dp_accounting's floating point remains: 1e-9
  relative, 1e-9 absolute.
* feasgm "rdp": Opacus's closed-form conversion per order and its exact inverse
  (``opacus_rdp_delta``): 1e-10 relative, 1e-12 absolute.
* feasgm "prv": Opacus's PRV epsilon is an upper bound within ``eps_error = 0.01`` of the
  estimate on a grid that depends on delta, so monotonicity holds to 2 eps_error absolute;
  it has no delta (``get_delta`` raises NotImplementedError: no round trip).

Opacus's own epsilons ("rdp", "prv") are reported as Opacus gives them: negative at a large
delta (the d -> e -> d direction is checked where e >= 0), and Opacus's PRV raises
RuntimeError("Cannot compute epsilon") for a delta near 1 (deltas are drawn up to 0.9).

Cost: heavy accountants (exact-tail PLDs: asgm, feasgm "pld"/"prv") get a few examples by
default and more under ``-m slow``; the light ones get more by default.
"""

from __future__ import annotations

import copy
import logging
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opacus.accountants import IAccountant, RDPAccountant

from opacus_lastiterate.accountants.base import RunAccountant
from opacus_lastiterate.accountants.normalisation import STANDARD_ACCOUNTANTS
from opacus_lastiterate.accountants.registration import registered_accountants

from ._contract_helpers import make_answerable, registered_names

logging.getLogger("absl").setLevel(logging.ERROR)  # dp_accounting's notices

pytestmark = [
    # Drawn sample rates need not match 1/len(DataLoader) of the configured (N, L): FEASGM
    # says so (NormalisationWarning); assigned histories make the last-iterate accountant
    # warn about calibration. Neither is what these properties are about.
    pytest.mark.filterwarnings("ignore::opacus_lastiterate.exceptions.NormalisationWarning"),
    pytest.mark.filterwarnings(
        "ignore::opacus_lastiterate.exceptions.HeuristicCalibrationWarning"
    ),
    pytest.mark.filterwarnings("ignore:Optimal order is the:UserWarning"),
    # Opacus's PRV at q = 1 (log(1 - q))
    pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning"),
    # The plain heuristic is not monotone in T; (b) checks the robust value instead.
    pytest.mark.filterwarnings(
        "ignore::opacus_lastiterate.exceptions.NonMonotoneHeuristicWarning"
    ),
]

N, L = 95, 10  # FEASGM's verdict is safe: int(N * q) = 9 for N - 1, N, N + 1
DELTA = 1e-5


# -- the accountants under test ---------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One registered accountant, with one setting of ``configure(standard=...)``."""

    id: str
    name: str
    config: tuple[tuple[str, Any], ...] = ()

    @property
    def cls(self) -> type[IAccountant]:
        return registered_accountants()[self.name]

    def make(self) -> Any:
        """A fresh accountant, configured as ``_contract_helpers.make_answerable`` does."""
        acc = make_answerable(self.cls(), dataset_size=N, batch_size=L)
        if self.config:
            acc.configure(**dict(self.config))
        return acc


# Accountants whose answer depends on configure(standard=...) (ASGM's configure takes the
# argument too, and ignores it).
STANDARD_SETTINGS = {"feasgm": STANDARD_ACCOUNTANTS}


def _variants() -> list[Variant]:
    out = []
    for name in registered_names():
        settings_ = STANDARD_SETTINGS.get(name, ())
        out += [Variant(f"{name}-{s}", name, (("standard", s),)) for s in settings_]
        if not settings_:
            out.append(Variant(name, name))
    return out


VARIANTS = _variants()
IDS = [v.id for v in VARIANTS]


@dataclass(frozen=True)
class Tolerance:
    r_eps: float
    r_delta: float
    a: float
    has_delta: bool = True  # get_delta answers (round trip defined)


# Module docstring, "Tolerances".
TOLERANCE = {
    "last_iterate": Tolerance(1e-10, 1e-10, 1e-12),
    "asgm": Tolerance(1e-9, 1e-9, 1e-9),
    "feasgm-pld": Tolerance(1e-9, 1e-9, 1e-9),
    "feasgm-rdp": Tolerance(1e-10, 1e-10, 1e-12),
    "feasgm-prv": Tolerance(0.0, 0.0, 0.02, has_delta=False),
}
ROBUST_TOLERANCE = Tolerance(1e-6, 2e-6, 2e-14)
HEAVY = {"asgm", "feasgm-pld", "feasgm-rdp", "feasgm-prv"}
EXAMPLES = {"light": 10, "heavy": 4, "slow": 15}


def _examples(variant: Variant) -> int:
    return EXAMPLES["heavy" if variant.id in HEAVY else "light"]


def _run_property(strategy: st.SearchStrategy[Any], check: Callable[..., None],
                  examples: int) -> None:
    """Run ``check`` on ``examples`` draws of ``strategy`` (a per-variant example count)."""

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(strategy)
    def run(value: Any) -> None:
        check(value)

    run()


def _variant_tests(fn: Callable[[Variant, int], None]) -> tuple[Any, Any]:
    """The default test (a few examples) and its ``slow`` twin (more) of one property."""

    @pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
    def default(variant: Variant) -> None:
        fn(variant, _examples(variant))

    @pytest.mark.slow
    @pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
    def slow(variant: Variant) -> None:
        fn(variant, EXAMPLES["slow"])

    default.__doc__ = slow.__doc__ = fn.__doc__
    return default, slow


# -- histories ----------------------------------------------------------------------------------

History = list[tuple[float, float, int]]

sigma_st = st.floats(1.0, 4.0)
rate_st = st.one_of(st.floats(1e-3, 1.0), st.just(1.0))
segment_st = st.tuples(sigma_st, rate_st, st.integers(1, 6))


def _merged(history: History) -> History:
    """Adjacent segments with the same (sigma, q) merged, as ``step`` records them."""
    out: History = []
    for sigma, q, n in history:
        if out and out[-1][:2] == (sigma, q):
            out[-1] = (sigma, q, out[-1][2] + n)
        else:
            out.append((sigma, q, n))
    return out


history_st = st.lists(segment_st, min_size=1, max_size=3).map(_merged)


def _stepped(acc: Any, history: History) -> Any:
    for sigma, q, n in history:
        for _ in range(n):
            acc.step(noise_multiplier=sigma, sample_rate=q)
    return acc


def _trimmed(history: History, k: int) -> History:
    """``history`` without its last ``k`` steps (computed here, not by the package)."""
    steps = [(s, q) for s, q, n in history for _ in range(n)]
    kept = steps[: len(steps) - k]
    return _merged([(s, q, 1) for s, q in kept])


def _answers(acc: Any, variant: Variant) -> tuple[float, float | None]:
    eps = acc.get_epsilon(DELTA)
    delta = acc.get_delta(1.0) if TOLERANCE[variant.id].has_delta else None
    return eps, delta


# How far apart the answers of one history may be when it entered by different routes:
# identical, except that the last-iterate accountant's incremental engine, fed step by step,
# accumulates the variance and warm-starts its root search differently from one built from
# the whole run (``IncrementalHeuristic.from_run``: a loaded state, an assigned history,
# take_back, with_history); its documented agreement is the root finder's tolerance, about
# 1e-13 relative (``analysis/last_iterate/incremental.py``). Two states loaded alike agree
# exactly.
ROUTE_TOLERANCE = {"last_iterate": 1e-12}


def _assert_same(a: Any, b: Any, variant: Variant, *, exact: bool = False) -> None:
    assert b.state_dict() == a.state_dict()
    assert b.history == a.history and len(b) == len(a) and b.num_steps == a.num_steps
    rel = 0.0 if exact else ROUTE_TOLERANCE.get(variant.id, 0.0)
    got, want = _answers(b, variant), _answers(a, variant)
    if rel == 0.0:
        assert got == want
    else:
        assert got == pytest.approx(want, rel=rel, abs=1e-300)


def test_every_accountant_states_its_tolerance() -> None:
    assert {v.name for v in VARIANTS} == set(registered_accountants())
    assert set(TOLERANCE) == set(IDS)
    assert all(issubclass(v.cls, RunAccountant) for v in VARIANTS)


# -- (a) the inverse pair ---------------------------------------------------------------------


def _opacus_rdp_epsilon(history: History, delta: float) -> float:
    acc = RDPAccountant()
    acc.history = list(history)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(acc.get_epsilon(delta))


def _check_inverse(variant: Variant, examples: int) -> None:
    """get_epsilon(get_delta(e)) is e, and get_delta(get_epsilon(d)) is d (module docs)."""
    tol = TOLERANCE[variant.id]
    if not tol.has_delta:
        acc = _stepped(variant.make(), [(2.0, 0.1, 2)])
        with pytest.raises(NotImplementedError, match="standard='pld'"):
            acc.get_delta(1.0)
        return

    def check(drawn: tuple[History, float, float]) -> bool:
        history, e, d = drawn
        acc = _stepped(variant.make(), history)
        got_d = acc.get_delta(e)
        assert isinstance(got_d, float) and 0.0 <= got_d <= 1.0
        checked = 1e-12 < got_d < 1.0  # else outside what floating point resolves
        if checked:
            back = acc.get_epsilon(got_d)
            assert back <= e * (1 + tol.r_eps) + tol.a, (back, e, got_d)
            assert acc.get_epsilon(got_d * (1 - tol.r_delta)) >= e * (1 - tol.r_eps) - tol.a
            if variant.id == "feasgm-rdp":  # against Opacus's own conversion
                assert _opacus_rdp_epsilon(history, got_d) == pytest.approx(e, rel=1e-10, abs=1e-12)
        got_e = acc.get_epsilon(d)
        if math.isfinite(got_e) and got_e >= 0.0:  # Opacus's RDP may give e < 0: see docs
            back_d = acc.get_delta(got_e)
            assert back_d <= d * (1 + tol.r_delta) + tol.a, (back_d, d, got_e)
            if got_e > 0.0:
                assert back_d >= d * (1 - tol.r_delta) - tol.a, (back_d, d, got_e)
        return checked and math.isfinite(got_e) and got_e > 0.0

    assert check(([(2.0, 0.1, 5)], 1.0, DELTA))  # the checks are not all skipped
    _run_property(st.tuples(history_st, st.floats(0.0, 6.0), st.floats(1e-10, 0.5)), check,
                  examples)


test_epsilon_and_delta_are_inverse, test_epsilon_and_delta_are_inverse_slow = _variant_tests(
    _check_inverse
)


# -- (b) monotonicity -------------------------------------------------------------------------


def _check_delta_monotone(variant: Variant, examples: int) -> None:
    """epsilon is non-increasing in delta, and delta in epsilon."""
    tol = TOLERANCE[variant.id]

    def check(drawn: tuple[History, float, float, float]) -> None:
        history, d1, factor, e1 = drawn
        acc = _stepped(variant.make(), history)
        d2 = min(d1 * factor, 0.9)  # Opacus's PRV raises RuntimeError at delta near 1
        assert acc.get_epsilon(d2) <= acc.get_epsilon(d1) * (1 + tol.r_eps) + tol.a
        if tol.has_delta:
            assert acc.get_delta(e1 + 0.1) <= acc.get_delta(e1) * (1 + tol.r_delta) + tol.a
        if variant.name == "last_iterate":
            r = ROBUST_TOLERANCE
            high = acc.get_epsilon(d1, robust=True) * (1 + r.r_eps) + r.a
            assert acc.get_epsilon(d2, robust=True) <= high

    _run_property(
        st.tuples(history_st, st.floats(1e-10, 0.5), st.floats(1.0, 100.0), st.floats(0.0, 5.0)),
        check,
        examples,
    )


test_monotone_in_delta, test_monotone_in_delta_slow = _variant_tests(_check_delta_monotone)


def _check_noise_monotone(variant: Variant, examples: int) -> None:
    """More noise on every step (sigma times a factor >= 1) never raises epsilon. (Adding
    independent Gaussian noise is post-processing; FEASGM's accountant reports the SGM
    epsilon of the history, which is monotone too: only its dimension-aware curve is not.)"""
    tol = TOLERANCE[variant.id]

    def check(drawn: tuple[History, float, float]) -> None:
        history, factor, delta = drawn
        noisier = [(s * factor, q, n) for s, q, n in history]
        fewer = _stepped(variant.make(), history).get_epsilon(delta)
        more = _stepped(variant.make(), noisier).get_epsilon(delta)
        assert more <= fewer * (1 + tol.r_eps) + tol.a, (more, fewer)

    _run_property(st.tuples(history_st, st.floats(1.0, 3.0), st.floats(1e-9, 1e-2)), check,
                  examples)


test_monotone_in_noise, test_monotone_in_noise_slow = _variant_tests(_check_noise_monotone)


def _check_steps_monotone(variant: Variant, examples: int) -> None:
    """More steps never lower epsilon. The composition accountants (every step released or
    accounted as released) are checked on any appended steps. The last-iterate accountant is
    checked on its robust value, the max over the suffixes of the run, which is monotone when
    every step has the same (sigma, q) (the suffixes of the longer run include those of the
    shorter); with a noisier step appended the final model can be more private (on
    [(1, 1, 1)] then (2, 1, 1) the heuristic falls from 2.42 to 2.08 at delta 2^-7: the
    signal grows by 1 and the noise variance by 4), and the plain value is not monotone even
    at one (sigma, q) (module docstring, (b))."""
    robust = variant.name == "last_iterate"
    tol = ROBUST_TOLERANCE if robust else TOLERANCE[variant.id]
    kwargs = {"robust": True} if robust else {}

    def check(drawn: tuple[History, History, float]) -> None:
        history, extra, delta = drawn
        acc = _stepped(variant.make(), history)
        before = acc.get_epsilon(delta, **kwargs)
        after = _stepped(acc, extra).get_epsilon(delta, **kwargs)
        assert after >= before * (1 - tol.r_eps) - tol.a, (after, before)

    if robust:
        @st.composite
        def drawn_st(draw: Any) -> tuple[History, History, float]:
            sigma, q, n = draw(segment_st)
            extra = draw(st.integers(1, 12))
            return [(sigma, q, n)], [(sigma, q, extra)], draw(st.floats(1e-9, 1e-2))

        strategy = drawn_st()
    else:
        extra_st = st.lists(segment_st, min_size=1, max_size=2).map(_merged)
        strategy = st.tuples(history_st, extra_st, st.floats(1e-9, 1e-2))
    _run_property(strategy, check, examples)


test_monotone_in_steps, test_monotone_in_steps_slow = _variant_tests(_check_steps_monotone)


# -- (c) state: routes, round trips, take_back, with_history ------------------------------------


def _check_routes(variant: Variant, examples: int) -> None:
    """stepped == assigned == with_history == a fresh accountant loaded from the state."""

    def check(history: History) -> None:
        stepped = _stepped(variant.make(), history)
        assert stepped.history == history and stepped.num_steps == sum(n for *_, n in history)
        assigned = variant.make()
        assigned.history = history
        twin = variant.make().with_history(history)
        fresh = variant.cls()  # unconfigured: the state must carry what it needs
        state = copy.deepcopy(stepped.state_dict())
        fresh.load_state_dict(state)
        assert state == stepped.state_dict()  # loading did not alter the given state
        for other in (assigned, twin, fresh):
            _assert_same(stepped, other, variant)
        again = variant.cls()
        again.load_state_dict(fresh.state_dict())
        _assert_same(fresh, again, variant, exact=True)

    _run_property(history_st, check, examples)


test_routes_and_state_round_trip, test_routes_and_state_round_trip_slow = _variant_tests(
    _check_routes
)


def _check_take_back(variant: Variant, examples: int) -> None:
    """take_back(k) equals an accountant that never recorded the last k steps."""

    @st.composite
    def drawn_st(draw: Any) -> tuple[History, int]:
        history = draw(history_st)
        return history, draw(st.integers(0, sum(n for *_, n in history)))

    def check(drawn: tuple[History, int]) -> None:
        history, k = drawn
        acc = _stepped(variant.make(), history)
        acc.take_back(k)
        never = _stepped(variant.make(), _trimmed(history, k))
        _assert_same(never, acc, variant)
        fresh = variant.cls()
        fresh.load_state_dict(acc.state_dict())
        # exact where take_back rebuilt acc from its state (k > 0); k = 0 leaves it stepped
        _assert_same(acc, fresh, variant, exact=k > 0)
        # and it goes on alike
        for a in (acc, never):
            a.step(noise_multiplier=2.0, sample_rate=0.1)
        _assert_same(never, acc, variant)

    _run_property(drawn_st(), check, examples)


test_take_back_forgets_the_steps, test_take_back_forgets_the_steps_slow = _variant_tests(
    _check_take_back
)


def _check_with_history(variant: Variant, examples: int) -> None:
    """with_history(h) is a copy that recorded h; the original is unchanged."""

    def check(drawn: tuple[History, History]) -> None:
        first, second = drawn
        acc = _stepped(variant.make(), first)
        before = copy.deepcopy(acc.state_dict())
        twin = acc.with_history(second)
        assert twin is not acc and type(twin) is type(acc)
        _assert_same(_stepped(variant.make(), second), twin, variant)
        assert acc.state_dict() == before
        _assert_same(_stepped(variant.make(), first), acc, variant)

    _run_property(st.tuples(history_st, history_st), check, examples)


test_with_history_is_a_copy, test_with_history_is_a_copy_slow = _variant_tests(
    _check_with_history
)


# -- (d) bad input ----------------------------------------------------------------------------

CHEAP = [(3.0, 0.1, 2), (4.0, 0.2, 1)]  # a non-empty history that answers fast

# Not a real number: TypeError. np.bool_ is not a numbers.Real.
NOT_REAL = [None, True, False, np.bool_(True), "0.1", b"1", [0.1], (0.1,), {"x": 0.1},
            complex(0.1, 0.0), object()]
NON_FINITE = [math.nan, math.inf, -math.inf, np.float64("nan"), np.float32("inf")]


def _bad_reals(low: float, high: float, *, low_in: bool, high_in: bool) -> st.SearchStrategy[Any]:
    """Values outside the interval (low, high) with the given ends (in or out)."""
    below = st.floats(max_value=low, exclude_max=low_in, allow_nan=False)
    above = st.floats(min_value=high, exclude_min=high_in, allow_nan=False)
    options = [st.sampled_from(NOT_REAL + NON_FINITE), above]
    if low != -math.inf:
        options.append(below)
    return st.one_of(*options).filter(lambda x: not _in_interval(x, low, high, low_in, high_in))


def _in_interval(x: Any, low: float, high: float, low_in: bool, high_in: bool) -> bool:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.floating)):
        return False
    x = float(x)
    return (x >= low if low_in else x > low) and (x <= high if high_in else x < high)


BAD_DELTA = _bad_reals(0.0, 1.0, low_in=False, high_in=False)
BAD_EPSILON = _bad_reals(0.0, math.inf, low_in=True, high_in=False)
BAD_RATE = _bad_reals(0.0, 1.0, low_in=False, high_in=True)
BAD_NOISE = _bad_reals(0.0, math.inf, low_in=True, high_in=False)
BAD_STEPS = st.one_of(
    st.sampled_from([None, True, False, 1.0, 1.5, "1", math.nan, math.inf, np.float64(1.0)]),
    st.integers(max_value=-1),
    st.integers(min_value=4, max_value=10**30),  # CHEAP has 3 steps
    st.integers(max_value=-1).map(np.int64),
)


def _bad_entry_st() -> st.SearchStrategy[Any]:
    good = (2.0, 0.1, 2)
    entries = st.one_of(
        st.sampled_from([None, 2.0, "2.0, 0.1, 2", (), (2.0,), (2.0, 0.1), (2.0, 0.1, 2, 1),
                         (2.0, 0.1, 0)]),  # a segment of no steps is an empty entry
        BAD_NOISE.map(lambda s: (s, good[1], good[2])),
        BAD_RATE.map(lambda q: (good[0], q, good[2])),
        BAD_STEPS.filter(lambda n: not (isinstance(n, int) and not isinstance(n, bool)
                                        and n >= 1)).map(lambda n: (good[0], good[1], n)),
    )
    # a valid first entry and a bad one after it: every entry is checked
    return st.one_of(
        entries.map(lambda e: [good, e]),
        st.sampled_from([None, "history", 3, {"a": 1}, {(2.0, 0.1, 2)}]),
    )


BAD_HISTORY = _bad_entry_st()


@dataclass(frozen=True)
class BadCall:
    """One way to pass a bad value: the call and the parameter its message must name."""

    method: str
    parameter: str
    values: st.SearchStrategy[Any]


def _call(acc: Any, method: str, value: Any) -> None:
    if method == "step_noise":
        acc.step(noise_multiplier=value, sample_rate=0.1)
    elif method == "step_rate":
        acc.step(noise_multiplier=2.0, sample_rate=value)
    elif method == "get_epsilon":
        acc.get_epsilon(value)
    elif method == "get_delta":
        acc.get_delta(value)
    elif method == "take_back":
        acc.take_back(value)
    elif method == "with_history":
        acc.with_history(value)
    elif method == "assign_history":
        acc.history = value
    elif method == "load_history":
        acc.load_state_dict({**acc.state_dict(), "history": value})
    elif method == "load_state":
        acc.load_state_dict(value)
    else:  # pragma: no cover
        raise AssertionError(method)


BAD_STATES = st.one_of(
    st.sampled_from([None, [], 3, "state", [("history", [])]]),
    st.dictionaries(st.sampled_from(["history", "mechanism", "configuration"]),
                    st.sampled_from([None, 3, "asgm", "rdp", []]), max_size=1),
)

BAD_CALLS = [
    BadCall("step_noise", "noise_multiplier", BAD_NOISE),
    BadCall("step_rate", "sample_rate", BAD_RATE),
    BadCall("get_epsilon", "delta", BAD_DELTA),
    BadCall("get_delta", "epsilon", BAD_EPSILON),
    BadCall("take_back", "steps", BAD_STEPS),
    BadCall("with_history", "history", BAD_HISTORY),
    BadCall("assign_history", "history", BAD_HISTORY),
    BadCall("load_history", "state_dict['history']", BAD_HISTORY),
    BadCall("load_state", "state_dict", BAD_STATES),
]


def _state(acc: Any) -> tuple[Any, int, int]:
    return copy.deepcopy(acc.state_dict()), len(acc), acc.num_steps


def _snapshot(acc: Any) -> tuple[Any, int, int, float]:
    return (*_state(acc), acc.get_epsilon(DELTA))


@pytest.mark.parametrize("bad", BAD_CALLS, ids=[b.method for b in BAD_CALLS])
@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_bad_input_names_the_parameter_and_changes_nothing(variant: Variant, bad: BadCall) -> None:
    acc = _stepped(variant.make(), CHEAP)
    before = _snapshot(acc)

    def check(value: Any) -> None:
        with pytest.raises((TypeError, ValueError)) as info:
            _call(acc, bad.method, value)
        assert f"`{bad.parameter}" in str(info.value), (value, str(info.value))
        assert _state(acc) == before[:3]

    _run_property(bad.values, check, 25)
    assert _snapshot(acc) == before  # the answer too (once: Opacus's PRV takes 0.1 s)


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_take_back_beyond_the_history_is_refused(variant: Variant) -> None:
    acc = variant.make()
    with pytest.raises(ValueError, match="`steps`"):
        acc.take_back(1)  # nothing recorded
    acc.take_back(0)
    _stepped(acc, CHEAP)
    before = _snapshot(acc)
    with pytest.raises(ValueError, match=r"`steps` must be an integer in \[0, 3\]"):
        acc.take_back(4)
    assert _snapshot(acc) == before


# -- (e) the empty accountant --------------------------------------------------------------------


@pytest.mark.parametrize("configured", [False, True], ids=["fresh", "configured"])
@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_empty_accountant_reports_zero(variant: Variant, configured: bool) -> None:
    acc = variant.make() if configured else variant.cls()
    assert len(acc) == 0 and acc.num_steps == 0 and acc.history == []
    for delta in (1e-12, DELTA, 0.5):
        assert acc.get_epsilon(delta) == 0.0
    for eps in (0.0, 1.0, 50.0):
        assert acc.get_delta(eps) == 0.0
    fresh = variant.cls()
    fresh.load_state_dict(acc.state_dict())
    assert fresh.state_dict() == acc.state_dict() and fresh.get_epsilon(DELTA) == 0.0
    # stepping then taking it back is the empty accountant again
    _stepped(acc, [(2.0, 0.1, 2)])
    acc.take_back(2)
    assert acc.state_dict() == fresh.state_dict() and acc.get_epsilon(DELTA) == 0.0


# -- (f) unknown keywords ------------------------------------------------------------------------

# Keywords that make_private_with_epsilon may forward and Opacus's own accountants take
# (RDP: alphas; PRV: eps_error, delta_error), and misspellings of ours.
UNKNOWN = ["no_such_option", "alphas", "eps_error", "delta_error", "robus", "target_epsilon"]


@pytest.mark.parametrize("keyword", UNKNOWN)
@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_unknown_keyword_to_get_epsilon_is_a_type_error(variant: Variant, keyword: str) -> None:
    acc = _stepped(variant.make(), CHEAP)
    before = _snapshot(acc)
    with pytest.raises(TypeError, match=keyword):
        acc.get_epsilon(DELTA, **{keyword: 1})
    with pytest.raises(TypeError, match=keyword):
        acc.get_delta(1.0, **{keyword: 1})
    assert _snapshot(acc) == before
