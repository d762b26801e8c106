"""What the adversary sees when the installed release's real optimizer runs the worst case
of the empirical audit (private; ``probe.py`` exports its public names).

:func:`audit_observations` runs ``trials`` runs of the real optimizer (others' gradients
zero, one canary) and returns what the adversary sees at every step;
:mod:`opacus_lastiterate.auditing.opacus_releases.real_code_audit` turns it into epsilons.
Like ``probe.py``, this file imports only the standard library, torch, numpy and opacus
(Python 3.8+): it is loaded beside ``probe.py`` when that file runs by path.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

if __package__:  # imported as a module of the package
    from . import _driver
else:  # run by path (probe.py): this folder is sys.path[0], the package is not importable
    import importlib

    _driver = importlib.import_module("_driver")

STATUS_STEP, STATUS_CRASH, STATUS_DROPPED = 0, 1, 2
"""Per-step status codes of :func:`audit_observations`: an update was released; the step
raised (empty batch); the release's sampler dropped an empty draw."""


def audit_observations(
    *, with_canary: bool, trials: int, steps: int, dimension: int, others: int,
    noise_multiplier: float, seed: int, batch_size: int | None = None,
    sample_rate: float | None = None,
) -> dict[str, Any]:
    """What the adversary sees in ``trials`` runs of ``steps`` steps of the real optimizer.

    The worst case of ``docs/opacus_versions.md``, "Empirical audit of real Opacus code":
    ``others`` records with zero gradient plus, with the canary, one record whose gradient
    is e_0 in R^d (C = 1). 1.x: ``make_private`` on a DataLoader with ``batch_size`` (the
    divisor and q follow from the data set size, as in training); 0.12-0.15: the release's
    Poisson sampler at ``sample_rate`` (the same with and without the canary) and the
    realised-batch divisor; a trial is then ``steps / int(1 / q)`` epochs of the sampler.
    Returns u[t, s] = grad[0], v[t, s] = sum of grad[1:]^2 and status[t, s] (lists), the
    accountant's sample rate and the release's own epsilon for one run.
    """
    import torch

    opacus, shims, _ = _driver.import_opacus()
    version = _driver.installed_version(opacus)
    api = _driver.api_generation(version)
    if api == "engine-fixed":
        raise ValueError("0.9-0.11 have no Poisson sampler: audit 0.12-0.15 or 1.x.")
    _driver.seed_generators(seed)
    torch.set_num_threads(1)
    n = others + (1 if with_canary else 0)
    x = torch.zeros(n, dimension)
    if with_canary:
        x[-1, 0] = 1.0
    u = [[math.nan] * steps for _ in range(trials)]
    v = [[math.nan] * steps for _ in range(trials)]
    status = [[STATUS_STEP] * steps for _ in range(trials)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if api == "make_private":
            if batch_size is None:
                raise ValueError("1.x: give `batch_size`.")
            setup = _driver.make_1x(n, batch_size, noise_multiplier, 1.0, data=x, k=dimension)
            draws = _endless(setup.batches)
        else:
            if sample_rate is None:
                raise ValueError("0.12-0.15: give `sample_rate`.")
            setup = _driver.make_0x(
                api, n, max(1, round(sample_rate * n)), noise_multiplier, 1.0, data=x,
                k=dimension, sample_rate=sample_rate,
            )
            per_epoch = len(setup.batches.batch_sampler)
            if steps % per_epoch:
                raise ValueError(f"`steps` must be a multiple of int(1 / q) = {per_epoch}.")
            draws = _epoch_draws(setup.batches)
        for t in range(trials):
            for s in range(steps):
                x_b = next(draws)
                if x_b is None:
                    status[t][s] = STATUS_DROPPED
                    continue
                try:
                    r = _driver.train_step(setup.model, setup.weight, setup.optimizer, x_b, "mean")
                except Exception:
                    status[t][s] = STATUS_CRASH
                    continue
                u[t][s] = float(r["g0"])
                v[t][s] = float(r["rest_sq"])
        rate, reported = _release_epsilon(api, setup.engine, noise_multiplier, steps)
    return {"opacus": version, "shims": shims, "u": u, "v": v, "status": status,
            "accountant_rate": rate, "reported_epsilon": reported}


def _release_epsilon(api: str, engine: Any, sigma: float, steps: int) -> tuple[float, float]:
    """(q, epsilon at PROBE_DELTA) that the release's own default accountant gives one run of
    ``steps`` steps at the sample rate its engine uses (0.14/0.15 count only the non-empty
    steps; ``steps`` drawn batches is an upper bound on what they print)."""
    q = _driver.accountant_history(api, engine)[-1][1]
    if api == "make_private":
        from opacus import PrivacyEngine

        fresh = PrivacyEngine()
        for _ in range(steps):
            fresh.accountant.step(noise_multiplier=sigma, sample_rate=q)
        return q, _driver.engine_epsilon(api, fresh)
    engine.steps = steps
    return q, _driver.engine_epsilon(api, engine)


def _endless(loader: Any) -> Any:
    while True:
        for (x,) in loader:
            yield x


def _epoch_draws(loader: Any) -> Any:
    """The sampler's draws, one epoch at a time; None for each draw it dropped or that
    failed to load (0.12/0.13 empty batches)."""
    while True:
        draws = len(loader.batch_sampler)
        it = iter(loader)
        got = 0
        while True:
            try:
                (x,) = next(it)
            except StopIteration:
                break
            except Exception:
                got += 1
                yield None
                continue
            got += 1
            yield x
        for _ in range(draws - got):
            yield None
