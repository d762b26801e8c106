"""The balls-in-bins standard number: random allocation through pld-accounting.

Every reference value here is computed independently of the package under test: the exact
two-step divergence by one-dimensional quadrature, the Monte Carlo divergence of the
dominating pair of Chua et al. (arXiv 2412.16802), the closed-form Gaussian mechanism, and
dp_accounting's Poisson PLD.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import integrate, optimize, special, stats

from opacus_lastiterate.analysis import sampling_allocation
from opacus_lastiterate.analysis.baselines.composition import StandardComposition
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.analysis.sampling import BallsInBins, ShuffledBatches, UnknownSampling
from opacus_lastiterate.analysis.sampling_allocation import (
    BallsInBinsBound,
    balls_in_bins_pld,
    random_allocation_pld,
)
from opacus_lastiterate.analysis.sampling_standard import NoAmplificationBound

needs_package = pytest.mark.skipif(
    not sampling_allocation.allocation_available(), reason="pld-accounting is not installed"
)


COARSE = 0.05  # a grid for tests that need some upper bound, not the tightest (much faster)


def _run(steps, b, sigma=1.0, first=0):
    return DPSGDRun.from_history(
        [(sigma, 1.0 / b, steps)], sampling=BallsInBins(b, first_step_in_epoch=first)
    )


def _gaussian_delta(eps, mu):  # Balle and Wang's closed form, written out here
    return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)


# -- an exact reference: one epoch of two steps -------------------------------------------------


def _two_step_delta(eps, sigma):
    """delta(eps) of P = (N(e_1, s^2 I) + N(e_2, s^2 I)) / 2 against Q = N(0, s^2 I), both
    orders. With L = p / q = (a(y_1) + a(y_2)), a(y) = exp((2y - 1) / (2 s^2)) / 2, the inner
    integral over y_1 is closed-form (a(y_1) times the density of Q is half the density of
    N(1, s^2)), leaving a quadrature over y_2."""
    s2, ee = sigma * sigma, math.exp(eps)

    def a(y):
        return 0.5 * math.exp((2 * y - 1) / (2 * s2))

    def remove(y2):  # E_Q[(L - e^eps)^+ | y_2]
        c = 2 * (ee - a(y2))
        cut = -math.inf if c <= 0 else s2 * math.log(c) + 0.5
        return 0.5 * stats.norm.sf((cut - 1) / sigma) + (a(y2) - ee) * stats.norm.sf(cut / sigma)

    def add(y2):  # E_Q[(1 - e^eps L)^+ | y_2]
        c = 2 * (math.exp(-eps) - a(y2))
        if c <= 0:
            return 0.0
        cut = s2 * math.log(c) + 0.5
        return (1 - ee * a(y2)) * stats.norm.cdf(cut / sigma) - 0.5 * ee * stats.norm.cdf(
            (cut - 1) / sigma
        )

    return max(
        integrate.quad(lambda y, f=f: f(y) * stats.norm.pdf(y, scale=sigma),
                       -14 * sigma, 14 * sigma + 1, limit=400, epsabs=1e-14, epsrel=1e-10)[0]
        for f in (remove, add)
    )


def _two_step_epsilon(delta, sigma):
    return optimize.brentq(lambda e: _two_step_delta(e, sigma) - delta, 0.0, 50.0, xtol=1e-10)


@needs_package
@pytest.mark.parametrize(
    ("sigma", "delta", "published"), [(1.0, 1e-3, 2.49944), (2.0, 1e-5, 1.465)]
)
def test_reproduces_the_sources_two_step_values(sigma, delta, published) -> None:
    """Random allocation of a record to 1 of 2 steps with Gaussian noise sigma.

    Source: Feldman and Shenfeld, "Efficient privacy loss accounting for subsampling and
    random allocation" (arXiv 2602.17284), whose code is pld-accounting; its repository
    (moshenfeld/RA_PLD, tests/integration/test_golden_oracles.py) publishes epsilon = 2.49944
    at sigma = 1, delta = 1e-3 and epsilon = 1.465 at sigma = 2, delta = 1e-5, each with a
    stated tolerance of 0.03. We reproduce both within 0.03, and check against the exact value
    (quadrature above: 2.49579 and 1.46195) that ours is an upper bound and within 1.5%.
    """
    bound = BallsInBinsBound(_run(2, 2, sigma)).epsilon(delta)
    exact = _two_step_epsilon(delta, sigma)
    assert abs(bound - published) <= 0.03
    assert abs(exact - published) <= 0.03  # the published value is itself near the exact one
    assert exact - 1e-9 <= bound <= exact * 1.015


@pytest.mark.slow
@needs_package
@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.0])
def test_two_steps_bound_delta_at_each_epsilon(sigma) -> None:
    model = BallsInBinsBound(_run(2, 2, sigma))
    for eps in (0.1, 0.5, 1.0, 2.0):
        exact = _two_step_delta(eps, sigma)
        assert exact * (1 - 1e-9) <= model.delta(eps) <= exact * 1.3 + 1e-6


# -- Monte Carlo of the dominating pair (Chua et al., arXiv 2412.16802) ----------------------


def _mc_delta(eps, sigma, b, epochs, n, seed):
    """Monte Carlo delta(eps) of E epochs of P = (1/b) sum_j N(e_j, s^2 I_b) against
    Q = N(0, s^2 I_b), both orders; returns (estimate, standard error). Remove:
    E_P[(1 - e^eps / L)^+]; add: E_Q[(1 - e^eps L)^+]; both integrands lie in [0, 1]."""
    rng = np.random.default_rng(seed)
    out = []
    for under_p in (True, False):
        log_l = np.zeros(n)
        for _ in range(epochs):
            y = rng.normal(scale=sigma, size=(n, b))
            if under_p:
                y[np.arange(n), rng.integers(b, size=n)] += 1.0
            log_l += special.logsumexp((2 * y - 1) / (2 * sigma * sigma), axis=1) - math.log(b)
        if under_p:
            vals = -np.expm1(np.minimum(eps - log_l, 0.0))
        else:
            vals = -np.expm1(np.minimum(log_l + eps, 0.0))
        out.append((float(vals.mean()), float(vals.std(ddof=1) / math.sqrt(n))))
    return max(out)


@needs_package
@pytest.mark.parametrize(("sigma", "b", "epochs"), [(1.0, 10, 1), (0.8, 20, 2)])
def test_monte_carlo_of_the_pair_stays_below_the_bound(sigma, b, epochs) -> None:
    """delta_MC - 4 SE <= delta_bound at a few epsilons (a one-sided test at 4 SE: a false
    failure has probability about 3e-5 per comparison), at the coarse grid (any grid is an upper
    bound; the default's finer grids at these deltas take a minute without numba)."""
    model = BallsInBinsBound(_run(b * epochs, b, sigma), loss_discretization=COARSE)
    for eps in (0.25, 1.0, 2.0):
        est, se = _mc_delta(eps, sigma, b, epochs, n=100_000, seed=11)
        assert est - 4 * se <= model.delta(eps), (eps, est, se, model.delta(eps))
        # and the bound is not far above the truth: within 10% plus 4 SE
        assert model.delta(eps) <= 1.1 * (est + 4 * se) + 1e-4


@pytest.mark.slow
@needs_package
def test_monte_carlo_many_steps_per_epoch() -> None:
    """200 steps per epoch, 3 epochs: below the bound at 4 SE; and the bound's curve is within
    0.1 of the estimate in epsilon (the grid costs more at many steps: at a grid of 0.05,
    measured delta(0.25) = 0.0297 against 0.0225 at 0.01 and 0.0208 by Monte Carlo). At the
    coarse grid: the default's grid at this setting is tested against an exact lower bound
    below, and costs minutes without numba."""
    sigma, b, epochs = 0.8, 200, 3
    model = BallsInBinsBound(_run(b * epochs, b, sigma), loss_discretization=COARSE)
    for eps in (0.25, 0.5, 1.0):
        est, se = _mc_delta(eps, sigma, b, epochs, n=200_000, seed=5)
        assert est - 4 * se <= model.delta(eps)
        assert model.delta(eps + 0.1) <= est + 4 * se


# -- an independent lower bound for many steps per epoch ----------------------------------------


def _lognormal_cells(edges, mu, s):
    """P(edges[k] <= X < edges[k + 1]) for ln X ~ N(mu, s^2), differencing the cdf below the
    median and the survival function above it (no cancellation in either tail)."""
    z = np.full(edges.shape, -np.inf)
    z[edges > 0] = (np.log(edges[edges > 0]) - mu) / s
    cdf, sf = special.ndtr(z), special.ndtr(-z)
    return np.where(z[1:] <= 0, cdf[1:] - cdf[:-1], sf[:-1] - sf[1:])


def _remove_lower_epsilon(sigma, b, epochs, delta, *, h, s_max, eta=1e-5, log_min=-1.0):
    """A lower bound on epsilon(delta) of E epochs of the random-allocation pair, from the
    direction E_Q[(L - e^eps)^+] alone (the larger one at the settings tested), by numpy and
    scipy only.

    Under Q one epoch's likelihood ratio is S = (1/b) sum_j X_j with X_j iid lognormal,
    ln X ~ N(-1/(2 sigma^2), 1/sigma^2) (so E X = 1), and E epochs give L = prod_e S_e. Every
    step moves mass down or drops it, and E_Q[(L - e^eps)^+] is increasing in each S_e, so each
    step can only lower delta: X/b is rounded down to a multiple of h (values >= s_max dropped),
    the b-fold sum is taken by FFT (sums past the FFT length wrap round to smaller values), log S
    is rounded down to a multiple of eta (S < e^log_min dropped) and the E-fold sum of logs is
    taken by FFT. The gap to the exact value comes from the rounding (S falls by at most b h, the
    log of L by at most E eta) and the dropped tail; negative FFT round-off (at most 1e-15 here)
    is clipped."""
    mu, s = -0.5 / sigma**2, 1.0 / sigma
    n = math.ceil(s_max / h)
    pmf_t = _lognormal_cells(np.arange(n + 1) * (h * b), mu, s)
    m = 1 << (n - 1).bit_length()
    pmf_s = np.clip(np.fft.irfft(np.fft.rfft(pmf_t, n=m) ** b, n=m), 0.0, None)
    values = np.arange(m) * h
    keep = values >= math.exp(log_min)
    index = np.floor(np.log(values[keep]) / eta).astype(np.int64)
    low = int(index.min())
    pmf_log = np.bincount(index - low, weights=pmf_s[keep])
    if epochs > 1:
        size = epochs * (len(pmf_log) - 1) + 1
        spectrum = np.fft.rfft(pmf_log, n=1 << (size - 1).bit_length())
        pmf_log = np.clip(np.fft.irfft(spectrum**epochs)[:size], 0.0, None)
    loss = (np.arange(len(pmf_log)) + epochs * low) * eta
    loss, mass = loss[loss > 0], pmf_log[loss > 0]  # L <= 1 adds nothing for eps >= 0

    def delta_of(eps):
        return float((mass * np.clip(np.exp(loss) - math.exp(eps), 0.0, None)).sum())

    return optimize.brentq(lambda e: delta_of(e) - delta, 0.0, 60.0, xtol=1e-9)


def test_the_lower_bound_reference_against_exact_values() -> None:
    """The reference above is below, and close to, two exact values: two steps per epoch
    (quadrature) and one step per epoch, where the pair is the Gaussian mechanism and E epochs
    have epsilon in closed form (mu = sqrt(E) / sigma)."""
    two_steps = _remove_lower_epsilon(2.0, 2, 1, 1e-5, h=2e-5, s_max=20.0)
    exact = _two_step_epsilon(1e-5, 2.0)
    assert exact * (1 - 1e-4) <= two_steps <= exact
    one_step = _remove_lower_epsilon(2.0, 1, 4, 1e-5, h=4e-5, s_max=40.0, log_min=-6.0)
    mu = math.sqrt(4) / 2.0
    gaussian = optimize.brentq(lambda e: _gaussian_delta(e, mu) - 1e-5, 0.0, 50.0, xtol=1e-12)
    assert gaussian * (1 - 1e-4) <= one_step <= gaussian


@pytest.mark.slow
@needs_package
@pytest.mark.parametrize(
    ("sigma", "b", "epochs", "h", "s_max"), [(0.8, 200, 3, 2e-6, 16.0), (0.8, 1000, 1, 5e-7, 4.0)]
)
def test_default_grid_is_within_one_percent_above_exact(sigma, b, epochs, h, s_max) -> None:
    """At the two settings of the issue (delta = 1e-5) the default grid is above the
    independent lower bound and at most 1 % above it, hence at most 1 % above the exact value
    (the reference is 1.2515 and 0.28338, about 0.05 % below the exact values). The previous
    default grid, 0.05, fails the second check (3.6 % and 5.2 % above the reference). The
    default costs, in CPU seconds on a shared machine, 8 and about 25 with numba, 56 and 233
    without it."""
    reference = _remove_lower_epsilon(sigma, b, epochs, 1e-5, h=h, s_max=s_max)
    run = _run(b * epochs, b, sigma)
    ours = BallsInBinsBound(run).epsilon(1e-5)
    assert reference <= ours <= 1.01 * reference, (ours, reference)
    coarse = BallsInBinsBound(run, loss_discretization=0.05).epsilon(1e-5)
    assert ours <= coarse
    assert coarse > 1.03 * reference


# -- sanity: between Poisson and no amplification; monotone --------------------------------


@needs_package
@pytest.mark.parametrize(("sigma", "b", "epochs"), [(1.0, 10, 3), (1.0, 100, 2), (0.7, 50, 1)])
def test_between_no_amplification_and_near_poisson(sigma, b, epochs) -> None:
    """The raw PLD is below the no-amplification bound (Gaussian composition, closed form).
    Against Poisson at rate 1/b (dp_accounting): random allocation is known to be close to it
    (Chua et al. report similar-or-better privacy in practical regimes; Feldman and Shenfeld
    that its privacy-utility trade-off is at least as good); no inequality either way is
    claimed here, only a sanity band of 35% around the Poisson value."""
    run = _run(b * epochs, b, sigma)
    delta = 1e-5
    raw = float(balls_in_bins_pld(run, loss_discretization=COARSE).get_epsilon_for_delta(delta))
    mu = math.sqrt(epochs) / sigma
    no_amp = optimize.brentq(lambda e: _gaussian_delta(e, mu) - delta, 0.0, 100.0)
    poisson = StandardComposition(
        DPSGDRun.constant(steps=b * epochs, sample_rate=1.0 / b, noise_multiplier=sigma)
    ).epsilon(delta)
    assert raw < no_amp
    assert 0.65 * poisson <= raw <= 1.35 * poisson
    model = BallsInBinsBound(run, loss_discretization=COARSE)
    assert model.epsilon(delta) == pytest.approx(min(raw, no_amp), rel=1e-9)


@needs_package
def test_monotone_in_steps_and_in_sigma() -> None:
    b = 10
    by_steps = [BallsInBinsBound(_run(t, b), loss_discretization=COARSE).epsilon(1e-5)
                for t in (1, 5, 10, 11, 20, 27, 30)]
    assert all(x <= y for x, y in itertools.pairwise(by_steps))
    assert by_steps[0] == by_steps[2]  # a partial epoch counts as a whole one
    assert by_steps[2] < by_steps[3]
    by_sigma = [BallsInBinsBound(_run(20, b, s), loss_discretization=COARSE).epsilon(1e-5)
                for s in (0.6, 0.8, 1.0, 1.5, 3.0)]
    assert all(x > y for x, y in itertools.pairwise(by_sigma))


@needs_package
def test_partial_epochs_count_as_whole_ones() -> None:
    """A run resumed mid-epoch (first_step_in_epoch = 7 of 10) for 8 steps touches two epochs:
    its bound is that of two whole epochs."""
    resumed = BallsInBinsBound(_run(8, 10, 1.0, first=7))
    whole = BallsInBinsBound(_run(20, 10, 1.0))
    assert resumed.epsilon(1e-5) == whole.epsilon(1e-5)


@needs_package
def test_noise_changing_inside_an_epoch_uses_its_smallest_sigma() -> None:
    b = 10
    mixed = DPSGDRun.from_history([(2.0, 0.1, 15), (1.0, 0.1, 5)], sampling=BallsInBins(b))
    # epoch 1 at sigma 2; epoch 2 has steps at 2 and at 1: accounted at 1
    reference = random_allocation_pld(2.0, b).compose(random_allocation_pld(1.0, b))
    assert BallsInBinsBound(mixed, loss_discretization=COARSE).epsilon(1e-5) == pytest.approx(
        float(reference.get_epsilon_for_delta(1e-5)), rel=1e-12
    )
    low = BallsInBinsBound(_run(20, b, 1.0)).epsilon(1e-5)
    high = BallsInBinsBound(_run(20, b, 2.0)).epsilon(1e-5)
    assert high < BallsInBinsBound(mixed).epsilon(1e-5) < low


# -- registry, labels, fallback, errors ---------------------------------------------------------


def test_registry_builds_it_for_balls_in_bins_only() -> None:
    run = _run(20, 10)
    model = privacy_model("standard", run)
    assert isinstance(model, BallsInBinsBound)
    assert isinstance(privacy_model("standard", run, value_discretization_interval=1e-3),
                      BallsInBinsBound)
    assert isinstance(privacy_model("standard_rdp", run), NoAmplificationBound)
    shuffled = DPSGDRun.from_history([(1.0, 0.1, 20)], sampling=ShuffledBatches(1000, 100))
    assert isinstance(privacy_model("standard", shuffled), NoAmplificationBound)
    unknown = DPSGDRun.from_history([(1.0, 0.1, 20)],
                                    sampling=UnknownSampling("MySampler", BallsInBins(10)))
    model = privacy_model("standard", unknown)
    assert isinstance(model, BallsInBinsBound)
    assert "assumes balls-in-bins" in model.label
    assert model.kind == "upper_bound"


@needs_package
def test_label_names_the_bound_and_its_neighbours() -> None:
    label = BallsInBinsBound(_run(20, 10)).label
    assert "random allocation" in label and "add/remove" in label and "upper bound" in label


def test_without_the_package_it_is_the_no_amplification_bound(monkeypatch) -> None:
    monkeypatch.setattr(sampling_allocation, "allocation_available", lambda: False)
    run = _run(30, 10, 1.3)
    model = BallsInBinsBound(run)
    assert not model.amplified
    mu = math.sqrt(3) / 1.3
    assert model.delta(2.0) == pytest.approx(_gaussian_delta(2.0, mu), rel=1e-9)
    assert "not installed" in model.label and "without amplification" in model.label
    with pytest.raises(ImportError, match="pld-accounting"):
        random_allocation_pld(1.0, 10)


def test_zero_noise_and_empty_runs() -> None:
    assert BallsInBinsBound(_run(0, 10)).epsilon(1e-5) == 0.0
    assert BallsInBinsBound(_run(5, 10, 0.0)).epsilon(1e-5) == math.inf


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: BallsInBinsBound(DPSGDRun.constant(steps=3, sample_rate=0.1,
                                                    noise_multiplier=1.0)),
         ValueError, "`run.sampling`"),
        (lambda: BallsInBinsBound(_run(3, 10), loss_discretization=0.0), ValueError,
         "`loss_discretization`"),
        (lambda: BallsInBinsBound(_run(3, 10), tail_truncation="x"), TypeError,
         "`tail_truncation`"),
        (lambda: random_allocation_pld(1.0, 0), ValueError, "`steps_per_epoch`"),
        (lambda: random_allocation_pld(-1.0, 3), ValueError, "`noise_multiplier`"),
    ],
)
def test_bad_input(call, error, match) -> None:
    with pytest.raises(error, match=match):
        call()


@needs_package
@pytest.mark.parametrize(("sigma", "delta"), [(1.0, 1e-3), (2.0, 1e-5), (4.0, 1e-5)])
def test_the_grid_sets_only_the_excess_over_the_exact_two_step_value(sigma, delta) -> None:
    """Against the exact two-step value (quadrature): the default (chosen) grid and the coarse
    one are both pessimistic; the default is within 1 % (its target), the coarse grid within
    3 % (measured 0.5 %, 0.9 % and 2.4 %) and no tighter than the default."""
    exact = _two_step_epsilon(delta, sigma)
    default = BallsInBinsBound(_run(2, 2, sigma)).epsilon(delta)
    coarse = BallsInBinsBound(_run(2, 2, sigma), loss_discretization=COARSE).epsilon(delta)
    assert exact - 1e-9 <= default <= exact * 1.01
    assert default <= coarse <= exact * 1.03


@needs_package
def test_the_grid_is_chosen_from_the_run_and_the_query() -> None:
    """Where the coarse grid is more than 2 % above the exact value (sigma 4, two steps), a
    finer grid is chosen and the value is within 1 %; where the probes already meet the
    target, no finer grid is computed; an explicit grid is kept. epsilon(delta) and
    delta(epsilon) are one curve (the same grids at every query)."""
    loose = BallsInBinsBound(_run(2, 2, 4.0))
    exact = _two_step_epsilon(1e-5, 4.0)
    assert BallsInBinsBound(_run(2, 2, 4.0), loss_discretization=COARSE).epsilon(1e-5) > (
        1.02 * exact
    )
    assert loose.loss_discretization_for(1e-5) < sampling_allocation.GRID_LADDER[1]
    assert exact - 1e-9 <= loose.epsilon(1e-5) <= 1.01 * exact
    for delta in (1e-3, 1e-5, 1e-8):
        assert loose.delta(loose.epsilon(delta)) == pytest.approx(delta, rel=1e-3)
    tight = BallsInBinsBound(_run(30, 10, 1.0))
    assert tight.loss_discretization_for(1e-5) == sampling_allocation.GRID_LADDER[1]
    fixed = BallsInBinsBound(_run(30, 10, 1.0), loss_discretization=0.02)
    assert fixed.loss_discretization_for(1e-5) == 0.02
    assert fixed.epsilon(1e-5) == pytest.approx(
        float(random_allocation_pld(1.0, 10, 3, loss_discretization=0.02)
              .get_epsilon_for_delta(1e-5)), rel=1e-12)
    with pytest.raises(ValueError, match="delta"):
        tight.loss_discretization_for(1.5)
    with pytest.raises(ValueError, match="`grid_delta`"):
        BallsInBinsBound(_run(30, 10, 1.0), grid_delta=0.0)
