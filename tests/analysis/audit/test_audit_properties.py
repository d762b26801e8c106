"""Property checks (hypothesis) of the monotonicity the bounds rely on."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from opacus_lastiterate.analysis.audit import epsilon_from_error_rates, one_run_epsilon_bound
from opacus_lastiterate.analysis.audit.clopper_pearson import (
    clopper_pearson_lower,
    clopper_pearson_upper,
)

confidences = st.floats(min_value=0.5, max_value=0.999)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 5000), frac=st.floats(0, 1), c=confidences)
def test_cp_bounds_bracket_the_point_estimate(n: int, frac: float, c: float) -> None:
    k = round(frac * n)
    lo, up = clopper_pearson_lower(k, n, c), clopper_pearson_upper(k, n, c)
    assert 0.0 <= lo <= k / n <= up <= 1.0
    assert clopper_pearson_upper(k, n, min(c + 0.0005, 0.9999)) >= up


@settings(max_examples=150, deadline=None)
@given(
    a=st.floats(0, 1),
    b=st.floats(0, 1),
    da=st.floats(0, 0.2),
    db=st.floats(0, 0.2),
    delta=st.floats(0, 0.5),
)
def test_pure_epsilon_decreases_in_both_rates(
    a: float, b: float, da: float, db: float, delta: float
) -> None:
    e = epsilon_from_error_rates(a, b, delta=delta)
    assert epsilon_from_error_rates(min(a + da, 1.0), min(b + db, 1.0), delta=delta) <= e
    assert e >= 0.0


@settings(max_examples=40, deadline=None)
@given(r=st.integers(1, 200), frac=st.floats(0.5, 1), delta=st.sampled_from([0.0, 1e-6, 1e-4]))
def test_one_run_bound_grows_with_correct_guesses(r: int, frac: float, delta: float) -> None:
    v = max(round(frac * r) - 1, 0)
    lower = one_run_epsilon_bound(r, r, v, delta=delta).epsilon
    higher = one_run_epsilon_bound(r, r, v + 1, delta=delta).epsilon
    assert higher >= lower - 1e-9
