"""scripts/adam_study.py: its Adam step is torch's, its estimator finds a known epsilon.

The study (docs/adaptive_optimizers.md, "The study") claims to run torch's Adam recursion
with its real second moment; this checks its in-place step against ``torch.optim.Adam`` on
random gradients, and its threshold estimator against the exact epsilon of a Gaussian pair.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import optimize, stats

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "adam_study.py"


def _study():
    spec = importlib.util.spec_from_file_location("adam_study", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["adam_study"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_adam_step_is_torch_adam():
    torch = pytest.importorskip("torch")
    study = _study()
    steps, runs = 25, 6
    rng = np.random.default_rng(3)
    grads = rng.standard_normal((steps, runs)) * rng.choice([0.01, 1.0, 10.0], size=(steps, 1))
    rates = study.schedule(steps, 0.2)
    beta1, beta2, eps = 0.85, 0.95, 1e-3
    p, m, v = np.zeros(runs), np.zeros(runs), np.zeros(runs)
    for i in range(steps):
        study.adam_step(p, m, v, grads[i], lr=float(rates[i]), t=i + 1, beta1=beta1,
                        beta2=beta2, eps=eps)
    param = torch.zeros(runs, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([param], lr=1.0, betas=(beta1, beta2), eps=eps)
    for i in range(steps):
        opt.param_groups[0]["lr"] = float(rates[i])
        param.grad = torch.tensor(grads[i])
        opt.step()
    np.testing.assert_allclose(p, param.detach().numpy(), rtol=1e-12, atol=1e-15)


def test_empirical_epsilon_finds_the_gaussian_pairs_epsilon():
    """N(1, 1) against N(0, 1) at delta = 0.01 (exact epsilon 2.318 from the Gaussian
    hockey-stick): over seeds the estimate at 100,000 samples per side has a standard
    deviation of about 0.05 and an upward bias of about 0.07 (the maximum over thresholds),
    so 0.2 is about 2.5 standard deviations beyond the bias; two samples of one law give
    about 0."""
    study = _study()
    mu, delta, n = 1.0, 0.01, 100_000
    rng = np.random.default_rng(11)
    ins, outs = rng.standard_normal(n) + mu, rng.standard_normal(n)

    def gaussian_delta(eps):
        return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)

    exact = optimize.brentq(lambda e: gaussian_delta(e) - delta, 0.0, 20.0)
    est = study.empirical_epsilon(ins, outs, delta)
    assert abs(est - exact) < 0.2, (est, exact)
    assert study.empirical_epsilon(outs[: n // 2], outs[n // 2 :], delta) < 0.2
