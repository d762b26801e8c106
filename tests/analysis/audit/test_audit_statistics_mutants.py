"""Public behaviour of the audit statistics that mutation testing found unasserted
(``docs/testing.md``, "Mutation testing"): the default confidence, the refusal of bad input
naming the parameter, and float output for an integer count (arrays keep their shape).
Expected values are scipy's Beta quantiles, computed here."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from opacus_lastiterate.analysis.audit.clopper_pearson import (
    clopper_pearson_lower,
    clopper_pearson_upper,
)

FUNCTIONS = [clopper_pearson_upper, clopper_pearson_lower]


def test_default_confidence_is_95_percent() -> None:
    k, n = 3, 10
    assert clopper_pearson_upper(k, n) == pytest.approx(stats.beta.ppf(0.95, k + 1, n - k), rel=1e-9)
    assert clopper_pearson_lower(k, n) == pytest.approx(stats.beta.ppf(0.05, k, n - k + 1), rel=1e-9)


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize(
    ("args", "name"),
    [
        ((3, 0, 0.9), "trials"),
        ((3, -1, 0.9), "trials"),
        ((3, 10, 1.0), "confidence"),
        ((3, 10, 1.5), "confidence"),
        ((3, 10, 0.0), "confidence"),
        ((11, 10, 0.9), "successes"),
    ],
)
def test_bad_input_names_the_parameter(fn, args, name) -> None:
    with pytest.raises(ValueError, match=rf"^`{name}"):
        fn(*args)


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_an_integer_count_gives_floats_and_an_array_keeps_its_shape(fn) -> None:
    one = fn(3, 10, 0.9)
    many = fn(np.array([[0, 3], [9, 10]]), 10, 0.9)
    for value in one if isinstance(one, tuple) else (one,):
        assert type(value) is float
    for value in many if isinstance(many, tuple) else (many,):
        assert isinstance(value, np.ndarray) and value.shape == (2, 2)
