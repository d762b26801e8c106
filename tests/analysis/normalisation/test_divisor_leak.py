"""The dimension-aware curve of (sum + Z) / c with a data-dependent divisor."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution

from opacus_lastiterate.analysis.baselines.composition import standard_epsilon
from opacus_lastiterate.analysis.normalisation.divisor_leak import (
    divisor_leak_loss,
    divisor_leak_pld,
    feasgm_delta,
    feasgm_epsilon,
)
from opacus_lastiterate.analysis.normalisation.opacus_arithmetic import opacus1x_batch_arithmetic
from tests.analysis.normalisation._reference import divisor_leak_delta_quadrature

EPS = [0.0, 0.2, 1.0, 2.0]


def _deltas(pld, add: bool) -> np.ndarray:
    pmf = pld._pmf_add if add else pld._pmf_remove
    return np.asarray(pmf.get_delta_for_epsilon(np.array(EPS)))


@pytest.mark.parametrize(
    ("c1", "c2", "q", "sigma", "d"),
    [
        (20.0, 21.0, 0.05, 1.0, 1),  # projection only
        (21.0, 20.0, 0.3, 0.8, 3),  # divisor shrinks with the target
        (20.0, 21.0, 0.05, 1.0, 100),
        (249.0, 250.0, 0.005, 1.0, 10_000),
        (5.0, 7.0, 0.5, 2.0, 2),  # EASGM at tiny N
    ],
)
@pytest.mark.parametrize("add", [False, True])
def test_one_step_matches_quadrature(c1, c2, q, sigma, d, add) -> None:
    pld = divisor_leak_pld(
        divisor_without=c1, divisor_with=c2, sample_rate=q, noise_multiplier=sigma, dimension=d
    )
    got = _deltas(pld, add)
    exact = divisor_leak_delta_quadrature(c1, c2, q, sigma, d, EPS, add=add)
    assert np.all(got >= exact * (1 - 1e-7) - 1e-14), (got, exact)  # pessimistic
    assert np.allclose(got, exact, rtol=1e-5, atol=1e-12), (got, exact)


def test_constant_divisor_is_sgm() -> None:
    q, s, t = 0.01, 1.0, 1000
    pld = divisor_leak_pld(
        divisor_without=100,
        divisor_with=100,
        sample_rate=q,
        noise_multiplier=s,
        dimension=10**6,
        steps=t,
    )
    sgm = privacy_loss_distribution.from_gaussian_mechanism(
        s, sampling_prob=q, value_discretization_interval=3e-4
    ).self_compose(t)
    assert pld.get_epsilon_for_delta(1e-5) == pytest.approx(
        sgm.get_epsilon_for_delta(1e-5), rel=1e-6
    )


def test_leak_grows_with_dimension() -> None:
    kw = dict(divisor_without=249, divisor_with=250, sample_rate=0.005, noise_multiplier=1.0)
    tv = [
        divisor_leak_pld(**kw, dimension=d).get_delta_for_epsilon(0.0)
        for d in (1, 100, 10**4, 10**5)
    ]
    assert tv == sorted(tv) and tv[-1] > 0.6  # 0.0019, 0.023, 0.22, 0.63


def test_loss_formula() -> None:
    c1, c2, q, s, d = 3.0, 4.0, 0.2, 1.5, 10
    u, v = 0.3, 2.0
    a = (
        math.log(c2 / c1)
        + u * u * (c1 * c1 - c2 * c2) / (2 * s * s)
        + math.log((1 - q) + q * math.exp((2 * u * c2 - 1) / (2 * s * s)))
    )
    b = (d - 1) * math.log(c2 / c1) - v * (c2 * c2 - c1 * c1) / (2 * s * s)
    got = divisor_leak_loss(
        u, v, divisor_without=c1, divisor_with=c2, sample_rate=q, noise_multiplier=s, dimension=d
    )
    assert got == pytest.approx(a + b)


def test_feasgm_safe_configuration_is_sgm_at_the_sampler_rate() -> None:
    """MNIST, L = 256: c = 255 and q = 1/235 for all neighbours, so the curve is SGM's."""
    kw = dict(noise_multiplier=1.0, steps=200)
    got = feasgm_epsilon(1e-5, dataset_size=60000, batch_size=256, dimension=10**6, **kw)
    q = opacus1x_batch_arithmetic(60000, 256).sampler_rate
    assert got == pytest.approx(standard_epsilon(1e-5, sample_rate=q, **kw), rel=2e-3)


def test_feasgm_unsafe_configuration_leaks_with_dimension() -> None:
    """N = 50000, L = 250: c = 249, 250, 248 for N - 1, N, N + 1."""
    kw = dict(dataset_size=50000, batch_size=250, noise_multiplier=1.0, steps=10)
    small_d = feasgm_delta(1.0, **kw, dimension=1)
    large_d = feasgm_delta(1.0, **kw, dimension=10**4)
    assert small_d < 1e-3 and large_d > 0.5  # 5.7e-9 and 0.88


def test_feasgm_zero_divisor_is_certain() -> None:
    kw = dict(dataset_size=49, batch_size=1, noise_multiplier=1.0, steps=1, dimension=10)
    assert feasgm_epsilon(1e-5, **kw) == math.inf
    assert feasgm_delta(3.0, **kw) == 1.0


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(divisor_without=0.0), ValueError, "divisor_without"),
        (dict(divisor_with=-1.0), ValueError, "divisor_with"),
        (dict(dimension=0), ValueError, "dimension"),
        (dict(dimension=2.0), TypeError, "dimension"),
        (dict(sample_rate=0.0), ValueError, "sample_rate"),
        (dict(value_discretization_interval=-1.0), ValueError, "value_discretization_interval"),
    ],
)
def test_validation(kwargs: dict, error: type, match: str) -> None:
    base = dict(
        divisor_without=2.0, divisor_with=3.0, sample_rate=0.1, noise_multiplier=1.0, dimension=5
    )
    base.update(kwargs)
    with pytest.raises(error, match=match):
        divisor_leak_pld(**base)
