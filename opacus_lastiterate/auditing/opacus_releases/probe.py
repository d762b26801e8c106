"""Probe the installed Opacus's real optimizer: divisor, noise scale, empty batches, epsilon.

Works with every Opacus release from 0.9.0 to 1.6.0 and imports only the standard library,
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

:func:`audit_observations` runs the worst-case configuration of the empirical audit with the
real optimizer (others' gradients zero, one canary) and returns what the adversary sees at
every step; :mod:`opacus_lastiterate.auditing.opacus_releases.real_code_audit` turns it into epsilons.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import sys
import time
import types
import warnings
from collections.abc import Callable
from typing import Any, Dict  # noqa: UP035 (Dict: this file also runs on Python 3.8)

__all__ = [
    "PROBE_ACCOUNTANT",
    "PROBE_DELTA",
    "api_generation",
    "audit_observations",
    "import_opacus",
    "installed_version",
    "run_probe",
]

Record = Dict[str, Any]  # noqa: UP006 (this file also runs on Python 3.8)

PROBE_DELTA = 1e-5
"""delta at which the release's own accountant is asked for epsilon."""

PROBE_ACCOUNTANT: Record = {"dataset_size": 10_000, "batch_size": 100, "noise_multiplier": 1.1, "steps": 1000}
"""The accountant case: q = 100 / 10000 = 0.01, sigma = 1.1, 1000 steps."""

_NOISE_SIGMA = 2.0
_WIDTH = 256  # k: coordinates of the probe model (k - 1 carry pure noise)
_OPACUS_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
# 0.9-0.11 have no default orders; their examples pass this list (0.9.0 examples/mnist.py)


# -- importing Opacus -----------------------------------------------------------------------


def _stub_torchcsprng() -> None:
    stub = types.ModuleType("torchcsprng")

    def unavailable(*args: object, **kwargs: object) -> None:
        raise NotImplementedError("torchcsprng stub: secure_rng=True is not available")

    stub.create_random_device_generator = unavailable  # type: ignore[attr-defined]
    stub.create_mt19937_generator = unavailable  # type: ignore[attr-defined]
    sys.modules["torchcsprng"] = stub


def _alias_module_attribute_error() -> None:
    import torch.nn.modules.module as module

    if not hasattr(module, "ModuleAttributeError"):
        module.ModuleAttributeError = AttributeError  # type: ignore[attr-defined]


def _drop_opacus_modules() -> None:
    for name in [m for m in sys.modules if m == "opacus" or m.startswith("opacus.")]:
        del sys.modules[name]


def import_opacus() -> tuple[Any, list[str], list[str]]:
    """Import opacus, applying a shim only after the matching import error.

    Returns (the opacus module, shims applied, the import errors that made them necessary).
    """
    shims: list[str] = []
    errors: list[str] = []
    for _ in range(3):
        try:
            import opacus

            return opacus, shims, errors
        except ImportError as exc:  # ModuleNotFoundError included
            text = f"{type(exc).__name__}: {exc}"
            _drop_opacus_modules()
            if "torchcsprng" in str(exc) and "torchcsprng" not in shims:
                _stub_torchcsprng()
                shims.append("torchcsprng")
            elif "ModuleAttributeError" in str(exc) and "ModuleAttributeError" not in shims:
                _alias_module_attribute_error()
                shims.append("ModuleAttributeError")
            else:
                raise
            errors.append(text)
    raise ImportError("opacus does not import: " + "; ".join(errors))


def installed_version(opacus: Any) -> str:
    """The version from package metadata (0.9.x has no ``opacus.__version__``)."""
    from importlib import metadata

    try:
        return str(metadata.version("opacus"))
    except metadata.PackageNotFoundError:
        return str(opacus.__version__)


def _version_key(version: str) -> tuple[int, int, int]:
    # the version model has the same helper; this file must not import the package
    parts = []
    for part in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    while len(parts) < 3:
        parts.append(0)
    return parts[0], parts[1], parts[2]


def api_generation(version: str) -> str:
    """Which API to drive: ``"engine-fixed"`` (0.9-0.11: ``PrivacyEngine(module, batch_size,
    sample_size, alphas, ...)``), ``"engine"`` (0.12-0.15: keyword-only, Poisson sampler) or
    ``"make_private"`` (1.x)."""
    key = _version_key(version)
    if key >= (1, 0, 0):
        return "make_private"
    return "engine" if key >= (0, 12, 0) else "engine-fixed"


# -- one training step ----------------------------------------------------------------------


def _number(x: float) -> Any:
    """JSON-safe float: non-finite values as the strings "inf", "-inf", "nan"."""
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


def _seed(seed: int) -> None:
    """torch's and numpy's global generators (0.14/0.15 draw empty-batch counts with scipy)."""
    import numpy
    import torch

    torch.manual_seed(seed)
    numpy.random.seed(seed % 2**32)


def _data(n: int, k: int) -> Any:
    import torch

    x = torch.zeros(n, k)
    x[:, 0] = 1.0
    return x


def _step(model: Any, weight: Any, optimizer: Any, x: Any, reduction: str) -> Record:
    """zero_grad, forward, backward, step; what the wrapped optimizer received."""
    optimizer.zero_grad()
    out = model(x)
    loss = out.sum() if reduction == "sum" else out.sum() / max(len(x), 1)
    loss.backward()
    optimizer.step()
    g = weight.grad.detach().double().flatten()
    rest = g[1:]
    finite = bool(rest.isfinite().all())
    return {
        "b": len(x),
        "g0": _number(float(g[0])),
        "rest_sq": _number(float((rest * rest).sum())) if finite else "nan",
        "rest_max": _number(float(rest.abs().max())) if finite else "nan",
        "k": int(rest.numel()),
    }


def _guarded(steps: list[Record], b: int, run: Callable[[], Record]) -> None:
    try:
        steps.append(run())
    except Exception as exc:  # a crash is a measurement
        steps.append({"b": b, "error": _error(exc)})


# -- the three APIs ---------------------------------------------------------------------------


class _Setup:
    """A model, its weight, an optimizer wrapped by the release, and a batch iterator."""

    def __init__(self, model: Any, weight: Any, optimizer: Any, batches: Any, engine: Any) -> None:
        self.model, self.weight, self.optimizer = model, weight, optimizer
        self.batches, self.engine = batches, engine


def _make_1x(
    n: int, batch_size: int, sigma: float, clip: float, *, poisson: bool = True,
    reduction: str = "mean", k: int = _WIDTH, data: Any = None,
) -> _Setup:
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    x = _data(n, k) if data is None else data
    model = torch.nn.Linear(k, 1, bias=False)
    weight = model.weight
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    engine = PrivacyEngine()
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=optimizer, data_loader=DataLoader(TensorDataset(x), batch_size=batch_size),
        noise_multiplier=sigma, max_grad_norm=clip, poisson_sampling=poisson, loss_reduction=reduction,
    )
    return _Setup(model, weight, optimizer, loader, engine)


def _engine_0x(
    model: Any, api: str, n: int, batch_size: int, sigma: float, clip: float,
    reduction: str, poisson: bool | None = None, sample_rate: float | None = None,
) -> Any:
    """A 0.x PrivacyEngine. Its constructor seeds torch's global generator from os.urandom;
    it is re-seeded from the generator's state before construction through the engine's own
    ``_set_seed`` (0.x's way to make a run deterministic), so that probes reproduce."""
    import torch
    from opacus import PrivacyEngine

    seed = int(torch.randint(0, 2**62, (1,)).item())
    if api == "engine-fixed":
        engine = PrivacyEngine(
            model, batch_size, n, _OPACUS_ORDERS, sigma, clip, loss_reduction=reduction
        )
    else:
        kw: dict[str, Any] = {"sample_size": n}
        if sample_rate is None:
            kw["batch_size"] = batch_size
        else:
            kw["sample_rate"] = sample_rate
        if poisson is not None:
            kw["poisson"] = poisson
        engine = PrivacyEngine(
            model, noise_multiplier=sigma, max_grad_norm=clip, loss_reduction=reduction, **kw
        )
    engine.random_number_generator = engine._set_seed(seed)
    return engine


def _make_0x(
    api: str, n: int, batch_size: int, sigma: float, clip: float, *, reduction: str = "mean",
    poisson_engine: bool | None = None, k: int = _WIDTH, data: Any = None,
    sample_rate: float | None = None,
) -> _Setup:
    """0.9-0.11: the user's shuffled DataLoader; 0.12-0.15: ``UniformWithReplacementSampler``
    at q = ``sample_rate`` (default batch_size / n)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    x = _data(n, k) if data is None else data
    model = torch.nn.Linear(k, 1, bias=False)
    engine = _engine_0x(
        model, api, n, batch_size, sigma, clip, reduction, poisson_engine, sample_rate
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    engine.attach(optimizer)
    if poisson_engine and _zero_grad_sets_none():
        # torch >= 2: zero_grad() sets grads to None; the inserted noise-only steps add to them
        optimizer.original_zero_grad = lambda set_to_none=False: (  # type: ignore[attr-defined]
            torch.optim.Optimizer.zero_grad(optimizer, set_to_none=False)
        )
        _SHIMS_USED.append("zero_grad(set_to_none=False)")
    if api == "engine-fixed":
        loader = DataLoader(TensorDataset(x), batch_size=batch_size, shuffle=True)
    else:
        from opacus.utils.uniform_sampler import UniformWithReplacementSampler

        q = batch_size / n if sample_rate is None else sample_rate
        sampler = UniformWithReplacementSampler(num_samples=len(x), sample_rate=q)
        loader = DataLoader(TensorDataset(x), batch_sampler=sampler)
    return _Setup(model, model.weight, optimizer, loader, engine)


_SHIMS_USED: list[str] = []  # shims applied by a probe case (not at import)


def _zero_grad_sets_none() -> bool:
    import inspect

    import torch

    parameter = inspect.signature(torch.optim.Optimizer.zero_grad).parameters.get("set_to_none")
    return parameter is not None and parameter.default is True


def _make(api: str, n: int, batch_size: int, sigma: float, clip: float, **kw: Any) -> _Setup:
    if api == "make_private":
        kw.pop("poisson_engine", None)
        return _make_1x(n, batch_size, sigma, clip, **kw)
    kw.pop("poisson", None)
    return _make_0x(api, n, batch_size, sigma, clip, **kw)


def _run(setup: _Setup, steps: int, reduction: str = "mean") -> list[Record]:
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
                out.append({"b": 0, "error": _error(exc), "where": "loader"})
                continue
            yielded += 1
            _guarded(out, len(x), functools.partial(_step, setup.model, setup.weight, setup.optimizer, x, reduction))
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
        record["error"] = _error(exc)
    record["seconds"] = round(time.perf_counter() - start, 3)
    return record


def _divisor_cases(api: str, seed: int) -> list[Record]:

    out = []
    for cfg in _divisor_configs(api):
        def run(cfg: dict[str, Any] = cfg) -> list[Record]:
            _seed(seed)
            setup = _make(
                api, cfg["dataset_size"], cfg["batch_size"], 0.0, 1e6,
                poisson=cfg["poisson"], k=cfg.get("k", _WIDTH),
            )
            return _run(setup, cfg["steps"])

        out.append(_case("divisor", dict(cfg, noise_multiplier=0.0, max_grad_norm=1e6), run))
    return out


def _noise_case(api: str, seed: int) -> Record:
    """sigma = 2, C = 1 at (N, L) = (200, 30) for 8 steps, then the release's own epsilon."""

    cfg: Record = {"dataset_size": 200, "batch_size": 30, "noise_multiplier": _NOISE_SIGMA,
           "max_grad_norm": 1.0, "steps": 8, "poisson": api != "engine-fixed"}

    def run() -> list[Record]:
        _seed(seed)
        setup = _make(api, 200, 30, _NOISE_SIGMA, 1.0)
        steps = _run(setup, cfg["steps"])
        steps.append({"reported_epsilon": _number(_epsilon(api, setup.engine)),
                      "accountant_history": _accountant_history(api, setup.engine)})
        return steps

    return _case("noise", cfg, run)


def _accountant_history(api: str, engine: Any) -> list[list[float]]:
    """[(sigma, q, steps), ...] as the release's accountant recorded them."""
    if api != "make_private":
        return [[float(engine.noise_multiplier), float(engine.sample_rate), int(engine.steps)]]
    acc = engine.accountant
    history = getattr(acc, "history", None)
    if history is None:  # 1.0.x: RDPAccountant.steps is the list
        history = acc.steps
    return [[float(h[0]), float(h[1]), int(h[2])] for h in history]


def _epsilon(api: str, engine: Any) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if api == "make_private":
            return float(engine.get_epsilon(PROBE_DELTA))
        return float(engine.get_privacy_spent(PROBE_DELTA)[0])


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
            engine = _engine_0x(torch.nn.Linear(2, 1), api, n, b, sigma, 1.0, "mean")
            engine.steps = steps
            accountant = "PrivacyEngine.get_privacy_spent"
        return [{"reported_epsilon": _number(_epsilon(api, engine)), "accountant": accountant,
                 "sample_rate": b / n}]

    return _case("accountant", cfg, run)


def _empty_case(api: str, seed: int) -> Record:
    """Empty batches through the release's own sampling (sigma = 1, C = 1)."""

    if api == "engine-fixed":  # no Poisson sampler: an explicit 0-row batch
        cfg: Record = {"dataset_size": 10, "batch_size": 1, "steps": 1, "explicit": True}

        def run() -> list[Record]:
            setup = _make(api, 10, 1, 1.0, 1.0)
            out: list[Record] = []
            _guarded(out, 0, lambda: _step(setup.model, setup.weight, setup.optimizer, _data(0, _WIDTH), "mean"))
            return out

        return _case("empty", dict(cfg, noise_multiplier=1.0, max_grad_norm=1.0), run)
    cfg = {"dataset_size": 10, "batch_size": 1, "steps": 30, "explicit": False}

    def run_sampler() -> list[Record]:
        _seed(seed)
        setup = _make(api, 10, 1, 1.0, 1.0)
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


def _run_epoch(setup: _Setup) -> list[Record]:
    out: list[Record] = []
    it = iter(setup.batches)
    while True:
        try:
            (x,) = next(it)
        except StopIteration:
            return out
        except Exception as exc:
            out.append({"b": 0, "error": _error(exc), "where": "loader"})
            continue
        _guarded(out, len(x), functools.partial(_step, setup.model, setup.weight, setup.optimizer, x, "mean"))


def _oversize_case(api: str) -> Record:
    """A batch of batch_size + 1 records (0.x; 0.9-0.11 raise ValueError)."""
    cfg: Record = {"dataset_size": 200, "batch_size": 30, "fed": 31}

    def run() -> list[Record]:
        setup = _make(api, 200, 30, 0.0, 1e6)
        out: list[Record] = []
        _guarded(out, 31, lambda: _step(setup.model, setup.weight, setup.optimizer, _data(31, _WIDTH), "mean"))
        return out

    return _case("oversize", cfg, run)


def _sum_cases(api: str, seed: int) -> list[Record]:
    """loss_reduction="sum": noise off with no clipping (C = 1e6), then sigma = 2 with C = 1."""

    out = []
    for sigma, clip in ((0.0, 1e6), (_NOISE_SIGMA, 1.0)):
        cfg: Record = {"dataset_size": 200, "batch_size": 30, "steps": 4, "poisson": api != "engine-fixed",
               "noise_multiplier": sigma, "max_grad_norm": clip, "loss_reduction": "sum"}

        def run(sigma: float = sigma, clip: float = clip) -> list[Record]:
            _seed(seed)
            setup = _make(api, 200, 30, sigma, clip, reduction="sum")
            return _run(setup, 4, reduction="sum")

        out.append(_case("sum", cfg, run))
    return out


def _poisson_engine_case(seed: int) -> Record:
    """0.14/0.15 ``PrivacyEngine(poisson=True)``: noise off, (N, L) = (200, 30)."""

    cfg: Record = {"dataset_size": 200, "batch_size": 30, "steps": 6, "poisson": True,
           "noise_multiplier": 0.0, "max_grad_norm": 1e6, "poisson_engine": True}

    def run() -> list[Record]:
        _seed(seed)
        setup = _make("engine", 200, 30, 0.0, 1e6, poisson_engine=True)
        return _run(setup, cfg["steps"])

    return _case("poisson_engine", cfg, run)


def run_probe(seed: int = 0) -> Record:
    """Every probe case against the importable Opacus; a JSON-serialisable record."""
    start = time.perf_counter()
    opacus, shims, errors = import_opacus()
    import numpy
    import torch

    version = installed_version(opacus)
    api = api_generation(version)
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
        if api == "engine" and _version_key(version) >= (0, 14, 0):
            cases.append(_poisson_engine_case(seed))
    return {
        "opacus": version,
        "api": api,
        "python": sys.version.split()[0],
        "torch": str(torch.__version__),
        "numpy": str(numpy.__version__),
        "shims": shims + sorted(set(_SHIMS_USED)),
        "import_errors_without_shims": errors,
        "seed": seed,
        "cases": cases,
        "seconds": round(time.perf_counter() - start, 2),
    }


# -- the audit's mechanism --------------------------------------------------------------------

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

    opacus, shims, _ = import_opacus()
    version = installed_version(opacus)
    api = api_generation(version)
    if api == "engine-fixed":
        raise ValueError("0.9-0.11 have no Poisson sampler: audit 0.12-0.15 or 1.x.")
    _seed(seed)
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
            setup = _make_1x(n, batch_size, noise_multiplier, 1.0, data=x, k=dimension)
            draws = _endless(setup.batches)
        else:
            if sample_rate is None:
                raise ValueError("0.12-0.15: give `sample_rate`.")
            setup = _make_0x(
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
                    r = _step(setup.model, setup.weight, setup.optimizer, x_b, "mean")
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
    q = _accountant_history(api, engine)[-1][1]
    if api == "make_private":
        from opacus import PrivacyEngine

        fresh = PrivacyEngine()
        for _ in range(steps):
            fresh.accountant.step(noise_multiplier=sigma, sample_rate=q)
        return q, _epsilon(api, fresh)
    engine.steps = steps
    return q, _epsilon(api, engine)


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
        obs = audit_observations(
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
