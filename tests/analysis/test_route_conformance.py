"""Every route from a run to its heuristic epsilon gives the chooser's number.

For one run description per sampling scheme (Poisson at a constant rate, Poisson under
momentum and a cosine schedule, shuffled batches, balls-in-bins), the routes are

* the registry: ``privacy_model(name, run)`` (:func:`~opacus_lastiterate.analysis.
  privacy_models.choose` picks the model);
* the kept model, fed the steps one by one (:class:`~opacus_lastiterate.analysis.kept_model.
  KeptModel`);
* the accountant after replaying the steps (``LastIterateAccountant.get_epsilon``);
* the CLI's ``epsilon`` command (``--sampling``, ``--lr-schedule``, ``--momentum``);
* calibration's inverse: the noise multiplier for the epsilon found is the run's own.

Each number is also held against an independent computation written here: the exact pair
P = (canary's weighted count) + N(0, s^2), Q = N(0, s^2) enumerated by brute force (every
subset of steps, or every epoch's Bernoulli), and delta(eps) by a root search on the
likelihood ratio (numpy/scipy only). The pairs of a scheme and of Poisson sampling, and with
and without the weights, differ by far more than the tolerances: a route that skipped the
scheme or the weights fails (``test_each_case_tells_scheme_and_weights_apart``).
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass

import numpy as np
import pytest
from scipy import optimize, stats

from opacus_lastiterate.accountants import LastIterateAccountant
from opacus_lastiterate.analysis.calibration import calibrate_noise_multiplier
from opacus_lastiterate.analysis.kept_model import KeptModel
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import SGDSettings
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.analysis.sampling import BallsInBins, ShuffledBatches
from opacus_lastiterate.cli import main

DELTA = 1e-5
ACCURACY = 1e-3  # the weighted heuristic: an upper bound within 1e-3 relative
ROOT = 1e-9  # the constant-rate routes agree to their root finders' tolerance


# -- the independent computation ---------------------------------------------------------------


def _pair_delta(shifts: np.ndarray, probs: np.ndarray, s: float, eps: float) -> float:
    """max(H_{e^eps}(P, Q), H_{e^eps}(Q, P)) for P = sum_j probs_j N(shifts_j, s^2),
    Q = N(0, s^2), shifts >= 0 (the likelihood ratio p/q increases in x)."""
    a = math.exp(eps)

    def log_ratio(x: float) -> float:  # log p(x)/q(x)
        z = (2 * shifts * x - shifts**2) / (2 * s * s)
        m = z.max()
        return float(m + math.log(np.sum(probs * np.exp(z - m))))

    def bracket_root(f, level: float) -> float:
        lo, hi = -1.0, 1.0
        while f(lo) > level:
            lo *= 2
        while f(hi) < level:
            hi *= 2
        return optimize.brentq(lambda x: f(x) - level, lo, hi, xtol=1e-14, rtol=1e-15)

    # H(P, Q) = P(X > x) - a Q(X > x) at log p/q = eps
    x = bracket_root(log_ratio, eps)
    p_tail = float(np.sum(probs * stats.norm.sf(x, loc=shifts, scale=s)))
    h_pq = p_tail - a * stats.norm.sf(x, scale=s)
    # H(Q, P) = Q(X < y) - a P(X < y) at log q/p = eps; 0 when q/p < e^eps everywhere
    # (q/p rises to 1 / P(shift 0) as x -> -inf)
    at_zero = float(np.sum(probs[shifts == 0]))
    if at_zero > 0 and math.log(at_zero) >= -eps:
        return max(h_pq, 0.0)
    y = bracket_root(log_ratio, -eps)
    p_head = float(np.sum(probs * stats.norm.cdf(y, loc=shifts, scale=s)))
    h_qp = stats.norm.cdf(y, scale=s) - a * p_head
    return max(h_pq, h_qp, 0.0)


def _pair_epsilon(shifts: np.ndarray, probs: np.ndarray, s: float, delta: float) -> float:
    """The smallest eps with :func:`_pair_delta` <= delta (bisection to 1e-12)."""
    lo, hi = 0.0, 1.0
    while _pair_delta(shifts, probs, s, hi) > delta:
        hi *= 2
    return optimize.brentq(
        lambda e: _pair_delta(shifts, probs, s, e) - delta, lo, hi, xtol=1e-12, rtol=1e-13
    )


def _subset_sum_law(w: np.ndarray, q: float) -> tuple[np.ndarray, np.ndarray]:
    """The law of sum_t w_t Bernoulli(q), by enumerating every subset of steps."""
    shifts, probs = [], []
    for pattern in itertools.product((0, 1), repeat=w.size):
        b = np.asarray(pattern)
        shifts.append(float(w @ b))
        probs.append(q ** b.sum() * (1 - q) ** (w.size - b.sum()))
    return np.asarray(shifts), np.asarray(probs)


def _heavy_ball_weights(lr: np.ndarray, beta: float) -> np.ndarray:
    """w_t = sum_{s >= t} lr_s beta^(s - t): the weight of step t's gradient in the final
    model of torch SGD with momentum beta (no dampening), written out."""
    t = lr.size
    return np.array([sum(lr[s] * beta ** (s - i) for s in range(i, t)) for i in range(t)])


def _cosine(steps: int) -> np.ndarray:
    """CosineAnnealingLR over ``steps`` steps from base rate 1 to 0 (torch's closed form)."""
    return 0.5 * (1 + np.cos(np.pi * np.arange(steps) / steps))


# -- the cases ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    steps: int
    sample_rate: float
    sigma: float
    sampling: ShuffledBatches | BallsInBins | None = None
    lrs: np.ndarray | None = None  # per-step learning rates (None: constant)
    momentum: float = 0.0

    @property
    def weights(self) -> np.ndarray | None:
        if self.lrs is None and self.momentum == 0.0:
            return None
        lrs = np.ones(self.steps) if self.lrs is None else self.lrs
        return _heavy_ball_weights(lrs, self.momentum)

    def run(self, *, weights: bool = True, scheme: bool = True) -> DPSGDRun:
        return DPSGDRun.from_history(
            [(self.sigma, self.sample_rate, self.steps)],
            weights=self.weights if weights else None,
            sampling=self.sampling if scheme else None,
        )

    def settings(self) -> list[SGDSettings]:
        lrs = np.full(self.steps, 0.1) if self.lrs is None else self.lrs
        return [SGDSettings(float(lr), self.momentum, 0.0, False, 0.0) for lr in lrs]

    def law(self) -> tuple[np.ndarray, np.ndarray, float]:
        """(shifts, probabilities, s) of the exact pair, computed here (module docstring)."""
        w = self.weights
        w = np.ones(self.steps) if w is None else w
        s = self.sigma * math.sqrt(float(np.sum(w**2)))
        if self.sampling is None:
            shifts, probs = _subset_sum_law(w, self.sample_rate)
            return shifts, probs, s
        # epoch schemes, equal weights: one Bernoulli per epoch with the mass of its steps
        k = self.sampling.steps_per_epoch
        masses = [min(k, self.steps - e) / k for e in range(0, self.steps, k)]
        law = {0.0: 1.0}
        for m in masses:
            new: dict[float, float] = {}
            for x, p in law.items():
                new[x + 1] = new.get(x + 1, 0.0) + p * m
                new[x] = new.get(x, 0.0) + p * (1 - m)
            law = new
        return np.array(list(law)), np.array(list(law.values())), s


CASES = [
    Case("poisson", steps=12, sample_rate=0.2, sigma=1.0),
    Case("poisson_momentum_cosine", steps=12, sample_rate=0.2, sigma=1.0,
         lrs=_cosine(12), momentum=0.9),
    # 100 records, batches of 10: 10 steps an epoch, 2.5 epochs
    Case("shuffled", steps=25, sample_rate=0.1, sigma=1.0,
         sampling=ShuffledBatches(dataset_size=100, batch_size=10)),
    Case("balls_in_bins", steps=25, sample_rate=0.1, sigma=1.0,
         sampling=BallsInBins(steps_per_epoch=10)),
]


def _tolerance(case: Case) -> float:
    return ACCURACY if case.weights is not None else ROOT


@pytest.fixture(params=CASES, ids=[c.name for c in CASES])
def case(request: pytest.FixtureRequest) -> Case:
    return request.param


# -- the routes --------------------------------------------------------------------------------


def _registry(case: Case) -> float:
    return privacy_model("heuristic", case.run()).epsilon(DELTA)


def _kept(case: Case) -> float:
    kept = KeptModel(sampling=case.sampling)
    for st in case.settings():
        kept.append(case.sigma, case.sample_rate, 1, st)
    return kept.epsilon(DELTA)


def _accountant(case: Case) -> float:
    acc = LastIterateAccountant()
    if case.sampling is not None:
        acc.declare_sampling(case.sampling)
    for st in case.settings():
        acc.replay_step(case.sigma, case.sample_rate, st)
    return acc.get_epsilon(DELTA, check_monotone=False)


def _cli(case: Case, capsys: pytest.CaptureFixture[str]) -> float:
    argv = ["epsilon", "--steps", str(case.steps), "--sample-rate", str(case.sample_rate),
            "--noise-multiplier", str(case.sigma), "--delta", str(DELTA), "--json"]
    if case.lrs is not None:
        argv += ["--lr-schedule", "cosine"]
    if case.momentum:
        argv += ["--momentum", str(case.momentum)]
    if isinstance(case.sampling, ShuffledBatches):
        argv += ["--sampling", "shuffled", "--dataset-size", str(case.sampling.dataset_size)]
    elif isinstance(case.sampling, BallsInBins):
        argv += ["--sampling", "balls-in-bins"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    return out["weighted_heuristic"] if case.weights is not None else out["heuristic"]


# -- the tests ---------------------------------------------------------------------------------


def test_registry_matches_the_independent_pair(case: Case) -> None:
    shifts, probs, s = case.law()
    exact = _pair_epsilon(shifts, probs, s, DELTA)
    got = _registry(case)
    assert got >= exact * (1 - ROOT)  # an upper bound where it rounds (the weighted one)
    assert got == pytest.approx(exact, rel=_tolerance(case))


def test_each_case_tells_scheme_and_weights_apart(case: Case) -> None:
    """The number without the scheme or without the weights is off by far more than the
    tolerance: a route that skips either fails the route tests."""
    got = _registry(case)
    if case.sampling is not None:
        poisson = privacy_model("heuristic", case.run(scheme=False)).epsilon(DELTA)
        assert abs(poisson - got) > 100 * _tolerance(case) * got
    if case.weights is not None:
        plain = privacy_model("heuristic", case.run(weights=False)).epsilon(DELTA)
        assert abs(plain - got) > 100 * _tolerance(case) * got


def test_kept_model_gives_the_registry_number(case: Case) -> None:
    assert _kept(case) == pytest.approx(_registry(case), rel=_tolerance(case))


def test_accountant_after_replaying_gives_the_registry_number(case: Case) -> None:
    acc = _accountant(case)
    assert acc == pytest.approx(_registry(case), rel=_tolerance(case))
    shifts, probs, s = case.law()
    assert acc >= _pair_epsilon(shifts, probs, s, DELTA) * (1 - ROOT)


def test_cli_gives_the_registry_number(case: Case, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(case, capsys) == pytest.approx(_registry(case), rel=_tolerance(case))


def test_calibration_inverts_the_registry_number(case: Case) -> None:
    if case.weights is not None:
        pytest.skip("calibration is for runs at a constant learning rate")
    eps = _registry(case)
    rtol = 1e-4
    sigma = calibrate_noise_multiplier(
        eps, DELTA, steps=case.steps, sample_rate=case.sample_rate, sampling=case.sampling,
        rtol=rtol,
    )
    assert case.sigma * (1 - 1e-9) <= sigma <= case.sigma * (1 + 2 * rtol)


def test_standard_bound_is_the_same_by_registry_kept_model_and_accountant(case: Case) -> None:
    kept = KeptModel(sampling=case.sampling)
    for st in case.settings():
        kept.append(case.sigma, case.sample_rate, 1, st)
    registry = privacy_model("standard", case.run()).epsilon(DELTA)
    assert kept.epsilon(DELTA, "standard") == registry
    acc = LastIterateAccountant()
    if case.sampling is not None:
        acc.declare_sampling(case.sampling)
    for st in case.settings():
        acc.replay_step(case.sigma, case.sample_rate, st)
    assert acc.kept_model.epsilon(DELTA, "standard") == registry
    assert registry >= _registry(case)  # the bound for every iterate is above the heuristic


def test_cli_calibration_inverts_the_registry_number(
    case: Case, capsys: pytest.CaptureFixture[str]
) -> None:
    if case.weights is not None:
        pytest.skip("calibration is for runs at a constant learning rate")
    argv = ["epsilon", "--steps", str(case.steps), "--sample-rate", str(case.sample_rate),
            "--delta", str(DELTA), "--target-epsilon", repr(_registry(case)),
            "--calibrate", "heuristic", "--json"]
    if isinstance(case.sampling, ShuffledBatches):
        argv += ["--sampling", "shuffled", "--dataset-size", str(case.sampling.dataset_size)]
    elif isinstance(case.sampling, BallsInBins):
        argv += ["--sampling", "balls-in-bins"]
    assert main(argv) == 0
    row = json.loads(capsys.readouterr().out)["calibrations"][0]
    assert case.sigma * (1 - 1e-9) <= row["noise_multiplier"] <= case.sigma * (1 + 2e-4)
