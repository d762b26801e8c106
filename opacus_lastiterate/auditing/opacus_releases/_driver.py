"""Drive the installed Opacus release's real optimizer (private; ``probe.py`` exports its
public names).

What ``probe.py`` and ``_observations.py`` share: importing the release (a compatibility
shim only after the matching import error), its version and API generation, a model and
optimizer wrapped through each of the three APIs, one training step, and the epsilon the
release's own accountant prints. Like ``probe.py``, this file imports only the standard
library, torch, numpy and opacus (Python 3.8+): it is loaded beside ``probe.py`` when that
file runs by path in an environment that holds one old release. The names its siblings use
carry no underscore, so that they read the same when loaded by path (outside the package);
they are private to the package's users all the same.
"""

from __future__ import annotations

import math
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any, Dict  # noqa: UP035 (Dict: this file also runs on Python 3.8)

Record = Dict[str, Any]  # noqa: UP006 (this file also runs on Python 3.8)

PROBE_DELTA = 1e-5
"""delta at which the release's own accountant is asked for epsilon."""

WIDTH = 256  # k: coordinates of the probe model (k - 1 carry pure noise)
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


def version_key(version: str) -> tuple[int, int, int]:
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
    key = version_key(version)
    if key >= (1, 0, 0):
        return "make_private"
    return "engine" if key >= (0, 12, 0) else "engine-fixed"



# -- one training step ----------------------------------------------------------------------


def json_number(x: float) -> Any:
    """JSON-safe float: non-finite values as the strings "inf", "-inf", "nan"."""
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


def seed_generators(seed: int) -> None:
    """torch's and numpy's global generators (0.14/0.15 draw empty-batch counts with scipy)."""
    import numpy
    import torch

    torch.manual_seed(seed)
    numpy.random.seed(seed % 2**32)


def unit_inputs(n: int, k: int) -> Any:
    import torch

    x = torch.zeros(n, k)
    x[:, 0] = 1.0
    return x


def train_step(model: Any, weight: Any, optimizer: Any, x: Any, reduction: str) -> Record:
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
        "g0": json_number(float(g[0])),
        "rest_sq": json_number(float((rest * rest).sum())) if finite else "nan",
        "rest_max": json_number(float(rest.abs().max())) if finite else "nan",
        "k": int(rest.numel()),
    }


def guarded(steps: list[Record], b: int, run: Callable[[], Record]) -> None:
    try:
        steps.append(run())
    except Exception as exc:  # a crash is a measurement
        steps.append({"b": b, "error": error_text(exc)})



# -- the three APIs ---------------------------------------------------------------------------


class Setup:
    """A model, its weight, an optimizer wrapped by the release, and a batch iterator."""

    def __init__(self, model: Any, weight: Any, optimizer: Any, batches: Any, engine: Any) -> None:
        self.model, self.weight, self.optimizer = model, weight, optimizer
        self.batches, self.engine = batches, engine


def make_1x(
    n: int, batch_size: int, sigma: float, clip: float, *, poisson: bool = True,
    reduction: str = "mean", k: int = WIDTH, data: Any = None,
) -> Setup:
    import torch
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    x = unit_inputs(n, k) if data is None else data
    model = torch.nn.Linear(k, 1, bias=False)
    weight = model.weight
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    engine = PrivacyEngine()
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=optimizer, data_loader=DataLoader(TensorDataset(x), batch_size=batch_size),
        noise_multiplier=sigma, max_grad_norm=clip, poisson_sampling=poisson, loss_reduction=reduction,
    )
    return Setup(model, weight, optimizer, loader, engine)


def engine_0x(
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


def make_0x(
    api: str, n: int, batch_size: int, sigma: float, clip: float, *, reduction: str = "mean",
    poisson_engine: bool | None = None, k: int = WIDTH, data: Any = None,
    sample_rate: float | None = None,
) -> Setup:
    """0.9-0.11: the user's shuffled DataLoader; 0.12-0.15: ``UniformWithReplacementSampler``
    at q = ``sample_rate`` (default batch_size / n)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    x = unit_inputs(n, k) if data is None else data
    model = torch.nn.Linear(k, 1, bias=False)
    engine = engine_0x(
        model, api, n, batch_size, sigma, clip, reduction, poisson_engine, sample_rate
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    engine.attach(optimizer)
    if poisson_engine and _zero_grad_sets_none():
        # torch >= 2: zero_grad() sets grads to None; the inserted noise-only steps add to them
        optimizer.original_zero_grad = lambda set_to_none=False: (  # type: ignore[attr-defined]
            torch.optim.Optimizer.zero_grad(optimizer, set_to_none=False)
        )
        SHIMS_USED.append("zero_grad(set_to_none=False)")
    if api == "engine-fixed":
        loader = DataLoader(TensorDataset(x), batch_size=batch_size, shuffle=True)
    else:
        from opacus.utils.uniform_sampler import UniformWithReplacementSampler

        q = batch_size / n if sample_rate is None else sample_rate
        sampler = UniformWithReplacementSampler(num_samples=len(x), sample_rate=q)
        loader = DataLoader(TensorDataset(x), batch_sampler=sampler)
    return Setup(model, model.weight, optimizer, loader, engine)


SHIMS_USED: list[str] = []  # shims applied by a probe case (not at import)


def _zero_grad_sets_none() -> bool:
    import inspect

    import torch

    parameter = inspect.signature(torch.optim.Optimizer.zero_grad).parameters.get("set_to_none")
    return parameter is not None and parameter.default is True


def make_setup(api: str, n: int, batch_size: int, sigma: float, clip: float, **kw: Any) -> Setup:
    if api == "make_private":
        kw.pop("poisson_engine", None)
        return make_1x(n, batch_size, sigma, clip, **kw)
    kw.pop("poisson", None)
    return make_0x(api, n, batch_size, sigma, clip, **kw)


# -- the release's own accountant -----------------------------------------------------------


def accountant_history(api: str, engine: Any) -> list[list[float]]:
    """[(sigma, q, steps), ...] as the release's accountant recorded them."""
    if api != "make_private":
        return [[float(engine.noise_multiplier), float(engine.sample_rate), int(engine.steps)]]
    acc = engine.accountant
    history = getattr(acc, "history", None)
    if history is None:  # 1.0.x: RDPAccountant.steps is the list
        history = acc.steps
    return [[float(h[0]), float(h[1]), int(h[2])] for h in history]


def engine_epsilon(api: str, engine: Any) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if api == "make_private":
            return float(engine.get_epsilon(PROBE_DELTA))
        return float(engine.get_privacy_spent(PROBE_DELTA)[0])
