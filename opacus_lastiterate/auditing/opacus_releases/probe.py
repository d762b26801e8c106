"""Probe the installed Opacus's real optimizer: divisor, noise scale, empty batches, epsilon.

Works with every Opacus release from 0.9.0 to 1.6.0. This file and the two private modules
beside it that it loads (``_driver.py``: importing the release and driving its optimizer
through each API; ``_observations.py``: the audit's runs) import only the standard library,
torch, numpy and opacus (Python 3.8+), so that ``scripts/probe_opacus_versions.py`` can run
this file by path in an environment that holds one old release::

    python opacus_lastiterate/auditing/opacus_releases/probe.py probe --out probe.json
    python opacus_lastiterate/auditing/opacus_releases/probe.py audit --trials 2000 --steps 10 \
        --dimension 100 --others 99 --batch-size 10 --noise-multiplier 2 --out obs.npz

What is measured (``docs/opacus_versions.md``, "Real-code probes"): every record's clipped
per-example gradient is the unit vector e_0 of R^k (the model is ``Linear(k, 1, bias=False)``
and every input is e_0), so after ``optimizer.step()`` the gradient the wrapped optimizer
receives is ``(b e_0 + Z) / d`` for a realised batch of b records, divisor d and noise Z
(with ``loss_reduction="sum"`` the per-example weighting of the version model enters):

* noise off (sigma = 0, clip norm 1e6): the divisor is d = b / grad[0], at every step;
* noise on (sigma, clip norm C = 1): grad[1:] is pure noise, so
  ``sqrt(mean(grad[1:]^2)) * d = sigma * C`` (the noise scale);
* empty batches through the release's own Poisson sampler (crash, dropped, or a noise-only
  step), a batch larger than ``batch_size``, ``loss_reduction="sum"``, and the epsilon the
  release's own default accountant prints.

:func:`check_probe` (in :mod:`opacus_lastiterate.auditing.opacus_releases.agreement`) compares a
record with the version model :mod:`opacus_lastiterate.analysis.opacus_versions`.

Compatibility shims (applied only when ``import opacus`` fails, and recorded): 0.9.0-0.10.1
import ``torchcsprng`` at the top of ``privacy_engine.py`` (no distribution exists for current
torch; a stub module that raises if ``secure_rng=True`` is used); 0.11.0 imports
``ModuleAttributeError`` (removed in torch 1.8; aliased to ``AttributeError``). With
``PrivacyEngine(poisson=True)``, 0.14/0.15 add noise to ``p.grad`` after ``zero_grad()``,
which torch >= 2 sets to None; that one case calls the original ``zero_grad`` with
``set_to_none=False``.

:func:`audit_observations` (defined in ``_observations.py``, exported here) runs the
worst-case configuration of the empirical audit with the real optimizer (others' gradients
zero, one canary) and returns what the adversary sees at every step;
:mod:`opacus_lastiterate.auditing.opacus_releases.real_code_audit` turns it into epsilons.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any, Dict  # noqa: UP035 (Dict: this file also runs on Python 3.8)

if __package__:  # imported as a module of the package
    from . import _driver, _observations
else:  # run by path: this folder is sys.path[0], the package is not importable
    import importlib

    _driver = importlib.import_module("_driver")
    _observations = importlib.import_module("_observations")

__all__ = []

Record = Dict[str, Any]  # noqa: UP006 (this file also runs on Python 3.8)

PROBE_DELTA: float = _driver.PROBE_DELTA
"""delta at which the release's own accountant is asked for epsilon."""

PROBE_ACCOUNTANT: Record = {"dataset_size": 10_000, "batch_size": 100, "noise_multiplier": 1.1, "steps": 1000}
"""The accountant case: q = 100 / 10000 = 0.01, sigma = 1.1, 1000 steps."""

# defined in _driver.py and _observations.py (runnable by path beside this file)
import_opacus = _driver.import_opacus
installed_version = _driver.installed_version
api_generation = _driver.api_generation
audit_observations = _observations.audit_observations
STATUS_STEP = _observations.STATUS_STEP
STATUS_CRASH = _observations.STATUS_CRASH
STATUS_DROPPED = _observations.STATUS_DROPPED

_NOISE_SIGMA = 2.0


# -- running the loader ----------------------------------------------------------------------


def _run(setup: _driver.Setup, steps: int, reduction: str = "mean") -> list[Record]:
    """``steps`` batches of the loader (epochs repeat); a batch that raises while loading or
    stepping is recorded as an error."""
    out: list[Record] = []
    idle = 0
    while len(out) < steps:
        it = iter(setup.batches)
        yielded = 0
        while len(out) < steps:
            try:
                (x,) = next(it)
            except StopIteration:
                break
            except Exception as exc:  # 0.12/0.13: default_collate of an empty index list
                out.append({"b": 0, "error": _driver.error_text(exc), "where": "loader"})
                continue
            yielded += 1
            _driver.guarded(out, len(x), functools.partial(_driver.train_step, setup.model, setup.weight, setup.optimizer, x, reduction))
        idle = idle + 1 if yielded == 0 else 0
        if idle > 100:
            raise RuntimeError("the loader yielded nothing in 100 epochs")
    return out


# -- cases -----------------------------------------------------------------------------------


def _divisor_configs(api: str) -> list[dict[str, Any]]:
    if api == "make_private":
        return [
            {"dataset_size": 200, "batch_size": 30, "poisson": True, "steps": 8},
            {"dataset_size": 147, "batch_size": 3, "poisson": True, "steps": 8},
            {"dataset_size": 9300, "batch_size": 100, "poisson": True, "steps": 3, "k": 16},
            {"dataset_size": 49, "batch_size": 1, "poisson": True, "steps": 3},
            {"dataset_size": 200, "batch_size": 30, "poisson": False, "steps": 7},
        ]
    if api == "engine-fixed":
        return [{"dataset_size": 200, "batch_size": 30, "poisson": False, "steps": 7}]
    return [
        {"dataset_size": 200, "batch_size": 30, "poisson": True, "steps": 8},
        {"dataset_size": 60, "batch_size": 3, "poisson": True, "steps": 8},
    ]


def _case(name: str, config: dict[str, Any], run: Callable[[], Any]) -> Record:
    start = time.perf_counter()
    record: Record = {"case": name, "config": dict(config)}
    try:
        record["steps"] = run()
    except Exception as exc:
        record["error"] = _driver.error_text(exc)
    record["seconds"] = round(time.perf_counter() - start, 3)
    return record


def _divisor_cases(api: str, seed: int) -> list[Record]:

    out = []
    for cfg in _divisor_configs(api):
        def run(cfg: dict[str, Any] = cfg) -> list[Record]:
            _driver.seed_generators(seed)
            setup = _driver.make_setup(
                api, cfg["dataset_size"], cfg["batch_size"], 0.0, 1e6,
                poisson=cfg["poisson"], k=cfg.get("k", _driver.WIDTH),
            )
            return _run(setup, cfg["steps"])

        out.append(_case("divisor", dict(cfg, noise_multiplier=0.0, max_grad_norm=1e6), run))
    return out


def _noise_case(api: str, seed: int) -> Record:
    """sigma = 2, C = 1 at (N, L) = (200, 30) for 8 steps, then the release's own epsilon."""

    cfg: Record = {"dataset_size": 200, "batch_size": 30, "noise_multiplier": _NOISE_SIGMA,
           "max_grad_norm": 1.0, "steps": 8, "poisson": api != "engine-fixed"}

    def run() -> list[Record]:
        _driver.seed_generators(seed)
        setup = _driver.make_setup(api, 200, 30, _NOISE_SIGMA, 1.0)
        steps = _run(setup, cfg["steps"])
        steps.append({"reported_epsilon": _driver.json_number(_driver.engine_epsilon(api, setup.engine)),
                      "accountant_history": _driver.accountant_history(api, setup.engine)})
        return steps

    return _case("noise", cfg, run)


def _accountant_case(api: str) -> Record:
    """The release's default accountant at q = 0.01, sigma = 1.1, 1000 steps."""
    import torch

    cfg = dict(PROBE_ACCOUNTANT)
    n, b, sigma, steps = cfg["dataset_size"], cfg["batch_size"], cfg["noise_multiplier"], cfg["steps"]

    def run() -> list[Record]:
        if api == "make_private":
            from opacus import PrivacyEngine

            engine = PrivacyEngine()
            for _ in range(steps):
                engine.accountant.step(noise_multiplier=sigma, sample_rate=b / n)
            accountant = type(engine.accountant).__name__
        else:
            engine = _driver.engine_0x(torch.nn.Linear(2, 1), api, n, b, sigma, 1.0, "mean")
            engine.steps = steps
            accountant = "PrivacyEngine.get_privacy_spent"
        return [{"reported_epsilon": _driver.json_number(_driver.engine_epsilon(api, engine)), "accountant": accountant,
                 "sample_rate": b / n}]

    return _case("accountant", cfg, run)


def _empty_case(api: str, seed: int) -> Record:
    """Empty batches through the release's own sampling (sigma = 1, C = 1)."""

    if api == "engine-fixed":  # no Poisson sampler: an explicit 0-row batch
        cfg: Record = {"dataset_size": 10, "batch_size": 1, "steps": 1, "explicit": True}

        def run() -> list[Record]:
            setup = _driver.make_setup(api, 10, 1, 1.0, 1.0)
            out: list[Record] = []
            _driver.guarded(out, 0, lambda: _driver.train_step(setup.model, setup.weight, setup.optimizer, _driver.unit_inputs(0, _driver.WIDTH), "mean"))
            return out

        return _case("empty", dict(cfg, noise_multiplier=1.0, max_grad_norm=1.0), run)
    cfg = {"dataset_size": 10, "batch_size": 1, "steps": 30, "explicit": False}

    def run_sampler() -> list[Record]:
        _driver.seed_generators(seed)
        setup = _driver.make_setup(api, 10, 1, 1.0, 1.0)
        if api == "make_private":
            return _run(setup, cfg["steps"])
        out: list[Record] = []
        for _ in range(3):  # 3 epochs of int(1 / 0.1) = 10 draws
            before = len(out)
            out.extend(_run_epoch(setup))
            out.append({"epoch_draws": len(setup.batches.batch_sampler),
                        "epoch_batches": len(out) - before})
        return out

    return _case("empty", dict(cfg, noise_multiplier=1.0, max_grad_norm=1.0), run_sampler)


def _run_epoch(setup: _driver.Setup) -> list[Record]:
    out: list[Record] = []
    it = iter(setup.batches)
    while True:
        try:
            (x,) = next(it)
        except StopIteration:
            return out
        except Exception as exc:
            out.append({"b": 0, "error": _driver.error_text(exc), "where": "loader"})
            continue
        _driver.guarded(out, len(x), functools.partial(_driver.train_step, setup.model, setup.weight, setup.optimizer, x, "mean"))


def _oversize_case(api: str) -> Record:
    """A batch of batch_size + 1 records (0.x; 0.9-0.11 raise ValueError)."""
    cfg: Record = {"dataset_size": 200, "batch_size": 30, "fed": 31}

    def run() -> list[Record]:
        setup = _driver.make_setup(api, 200, 30, 0.0, 1e6)
        out: list[Record] = []
        _driver.guarded(out, 31, lambda: _driver.train_step(setup.model, setup.weight, setup.optimizer, _driver.unit_inputs(31, _driver.WIDTH), "mean"))
        return out

    return _case("oversize", cfg, run)


def _sum_cases(api: str, seed: int) -> list[Record]:
    """loss_reduction="sum": noise off with no clipping (C = 1e6), then sigma = 2 with C = 1."""

    out = []
    for sigma, clip in ((0.0, 1e6), (_NOISE_SIGMA, 1.0)):
        cfg: Record = {"dataset_size": 200, "batch_size": 30, "steps": 4, "poisson": api != "engine-fixed",
               "noise_multiplier": sigma, "max_grad_norm": clip, "loss_reduction": "sum"}

        def run(sigma: float = sigma, clip: float = clip) -> list[Record]:
            _driver.seed_generators(seed)
            setup = _driver.make_setup(api, 200, 30, sigma, clip, reduction="sum")
            return _run(setup, 4, reduction="sum")

        out.append(_case("sum", cfg, run))
    return out


def _poisson_engine_case(seed: int) -> Record:
    """0.14/0.15 ``PrivacyEngine(poisson=True)``: noise off, (N, L) = (200, 30)."""

    cfg: Record = {"dataset_size": 200, "batch_size": 30, "steps": 6, "poisson": True,
           "noise_multiplier": 0.0, "max_grad_norm": 1e6, "poisson_engine": True}

    def run() -> list[Record]:
        _driver.seed_generators(seed)
        setup = _driver.make_setup("engine", 200, 30, 0.0, 1e6, poisson_engine=True)
        return _run(setup, cfg["steps"])

    return _case("poisson_engine", cfg, run)


def run_probe(seed: int = 0) -> Record:
    """Every probe case against the importable Opacus; a JSON-serialisable record."""
    start = time.perf_counter()
    opacus, shims, errors = _driver.import_opacus()
    import numpy
    import torch

    version = _driver.installed_version(opacus)
    api = _driver.api_generation(version)
    logging.getLogger("opacus").setLevel(logging.ERROR)
    logging.getLogger().setLevel(logging.ERROR)
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = _divisor_cases(api, seed)
        cases.append(_noise_case(api, seed))
        cases.append(_accountant_case(api))
        cases.append(_empty_case(api, seed))
        cases.extend(_sum_cases(api, seed))
        if api != "make_private":
            cases.append(_oversize_case(api))
        if api == "engine" and _driver.version_key(version) >= (0, 14, 0):
            cases.append(_poisson_engine_case(seed))
    return {
        "opacus": version,
        "api": api,
        "python": sys.version.split()[0],
        "torch": str(torch.__version__),
        "numpy": str(numpy.__version__),
        "shims": shims + sorted(set(_driver.SHIMS_USED)),
        "import_errors_without_shims": errors,
        "seed": seed,
        "cases": cases,
        "seconds": round(time.perf_counter() - start, 2),
    }



# -- command line ------------------------------------------------------------------------------


def _main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("probe", help="run every probe case, write JSON")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    a = sub.add_parser("audit", help="observations of the worst-case audit, write .npz")
    a.add_argument("--out", required=True)
    a.add_argument("--trials", type=int, required=True)
    a.add_argument("--steps", type=int, required=True)
    a.add_argument("--dimension", type=int, required=True)
    a.add_argument("--others", type=int, required=True)
    a.add_argument("--batch-size", type=int, default=None, help="1.x")
    a.add_argument("--sample-rate", type=float, default=None, help="0.12-0.15")
    a.add_argument("--noise-multiplier", type=float, required=True)
    a.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "probe":
        record = run_probe(args.seed)
        with open(args.out, "w") as fh:
            json.dump(record, fh, indent=1, allow_nan=False)
        return
    import numpy as np

    arrays: dict[str, Any] = {}
    for world, with_canary in (("with", True), ("without", False)):
        obs = _observations.audit_observations(
            with_canary=with_canary, trials=args.trials, steps=args.steps,
            dimension=args.dimension, others=args.others, batch_size=args.batch_size,
            sample_rate=args.sample_rate, noise_multiplier=args.noise_multiplier, seed=args.seed + (1 if with_canary else 0),
        )
        for key in ("u", "v", "status"):
            arrays[f"{world}_{key}"] = np.asarray(obs[key])
        arrays[f"{world}_accountant_rate"] = np.asarray(obs["accountant_rate"])
        arrays[f"{world}_reported_epsilon"] = np.asarray(obs["reported_epsilon"])
        arrays["opacus"] = np.asarray(obs["opacus"])
        arrays["shims"] = np.asarray(",".join(obs["shims"]))
    np.savez_compressed(args.out, **arrays)


if __name__ == "__main__":
    _main()
