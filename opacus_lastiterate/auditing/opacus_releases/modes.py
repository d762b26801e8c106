"""Probe Opacus's training modes on its real code: ghost clipping, virtual steps, adaptive
clipping (one process; ``distributed.py`` has DDP and FSDP).

One call of :func:`probe_mode` trains a few logical steps through ``PrivacyEngine`` in one
mode and measures, at every optimizer step, what this package needs to be right about:

* **physical and logical steps**: ``optimizer.step()`` calls, and the steps the accountant
  recorded (one noisy step per logical batch);
* **the accountant's history** (sigma, q, steps), as Opacus's hook handed it over;
* **the divisor** d in ``p.grad = (sum of clipped per-sample gradients + Z) / d``: with
  ``noise_multiplier = 0`` and a clipping norm far above every gradient, the released
  gradient is compared with the gradient of the summed per-sample losses of a plain copy
  of the model (learning rate 0, so the weights never move). Two sums are fitted: of every
  batch since the last logical step, and of the last batch only; the fit with the smaller
  residual tells which records the step really released;
* **the gradient noise** (adaptive clipping): with zero per-sample gradients (zero inputs,
  no bias), ``p.grad * d`` is the noise itself; its standard deviation over many
  coordinates, divided by the clipping norm of that step, is the noise multiplier applied.

Modes (``MODES``): ``"hooks"`` (the default path), ``"ghost"`` (``grad_sample_mode="ghost"``),
``"ghost_bmm"`` / ``"bmm"`` (``BatchMemoryManager``), ``"ghost_accumulation"`` /
``"accumulation"`` (k backward passes, one ``step()``), ``"adaclip"``
(``clipping="adaptive"``). Which releases have which mode: :data:`MODE_SINCE`.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "probe_mode",
]

MonitorFactory = Callable[[Any, Any, dict[str, Any]], tuple[Any, list[Any]]]
"""``(engine, optimizer, extra monitor kwargs) -> (monitor, the list its sink appends to)``:
how a probe gets a privacy monitor without importing ``callbacks`` (a higher layer)."""

MODES = (
    "hooks", "ghost", "ghost_bmm", "ghost_accumulation", "bmm", "accumulation", "adaclip",
)
MODE_SINCE: dict[str, tuple[int, int, int]] = {
    "hooks": (1, 0, 0),
    "bmm": (1, 0, 0),
    "accumulation": (1, 0, 0),
    "adaclip": (1, 1, 3),  # optimizers/adaclipoptimizer.py first in 1.1.3
    "ghost": (1, 5, 0),
    "ghost_bmm": (1, 5, 0),
    "ghost_accumulation": (1, 5, 0),
}
"""The first Opacus release with each mode (1.x ``make_private`` API)."""


@dataclass
class ModeObservation:
    """What one :func:`probe_mode` run measured (JSON-ready through :meth:`as_dict`)."""

    mode: str
    model: str
    opacus: str
    physical_steps: int
    logical_steps: int
    history: list[tuple[float, float, int]]
    expected_batch_size: float
    divisors: list[float] = field(default_factory=list)
    released_batches: list[str] = field(default_factory=list)  # "all" or "last"
    batches_per_step: list[int] = field(default_factory=list)
    records_per_step: list[int] = field(default_factory=list)
    noise_multipliers_applied: list[float] = field(default_factory=list)
    clip_norms: list[float] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def tiny_model(kind: str) -> Any:
    """A seeded tiny model: ``"mlp"`` (5 -> 4 -> 1) or ``"transformer"`` (token embedding,
    one self-attention block of Opacus's ``DPMultiheadAttention``, layer norm, mean pooling,
    a linear head) on sequences of 4 tokens from a vocabulary of 11; ``"zero"``: one
    bias-free linear layer on 400 inputs, fed zeros (noise probe). Every model outputs one
    number per example, shape (B,): a per-example loss of shape (B, 1) would be broadcast
    against the ghost path's clipping coefficients of shape (B,) (see ``docs/opacus_versions.md``)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    if kind == "mlp":
        return nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 1), nn.Flatten(0))
    if kind == "zero":
        return nn.Sequential(nn.Linear(400, 1, bias=False), nn.Flatten(0))
    if kind != "transformer":
        raise ValueError(f"`kind` must be 'mlp', 'transformer' or 'zero', got {kind!r}.")
    from opacus.layers import DPMultiheadAttention

    class TinyTransformer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(11, 8)
            self.attn = DPMultiheadAttention(8, 2, batch_first=True)
            self.norm = nn.LayerNorm(8)
            self.head = nn.Linear(8, 1)

        def forward(self, tokens: Any) -> Any:
            h = self.embed(tokens)
            a, _ = self.attn(h, h, h, need_weights=False)
            return self.head(self.norm(h + a).mean(dim=1)).squeeze(-1)

    return TinyTransformer()


def _data(kind: str, n: int) -> Any:
    import torch

    g = torch.Generator().manual_seed(1)
    y = torch.randn(n, generator=g)
    if kind == "transformer":
        return torch.randint(0, 11, (n, 4), generator=g), y
    if kind == "zero":
        return torch.zeros(n, 400), torch.zeros(n)
    return torch.randn(n, 5, generator=g), y


def _flat_grad(module: Any) -> Any:
    import torch

    return torch.cat([p.grad.reshape(-1) for p in module.parameters() if p.requires_grad])


def _fit(target: Any, released: Any) -> tuple[float, float]:
    """d with released ~ target / d, and the relative residual of that fit."""
    import torch

    dot = float(torch.dot(target, released))
    if dot == 0.0:
        return float("nan"), float("inf")
    d = float(torch.dot(target, target)) / dot
    residual = float(torch.linalg.vector_norm(target / d - released))
    return d, residual / max(float(torch.linalg.vector_norm(released)), 1e-30)


def _summed_gradient(reference: Any, batches: list[tuple[Any, Any]]) -> Any:
    import torch

    reference.zero_grad(set_to_none=True)
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    if len(x):
        torch.nn.functional.mse_loss(reference(x), y, reduction="sum").backward()
        return _flat_grad(reference)
    return torch.cat([torch.zeros_like(p).reshape(-1) for p in reference.parameters()])


def probe_mode(
    mode: str,
    *,
    model: str = "mlp",
    accountant: str = "last_iterate",
    noise_multiplier: float = 0.0,
    max_grad_norm: float = 1e6,
    dataset_size: int = 60,
    batch_size: int = 12,
    logical_steps: int = 3,
    physical_batch_size: int = 5,
    accumulation: int = 2,
    poisson: bool | None = None,
    monitor: MonitorFactory | None = None,
    prepare: Callable[[Any, Any], dict[str, Any] | None] | None = None,
    adaclip: dict[str, float] | None = None,
    seed: int = 0,
    device: str = "cpu",
) -> ModeObservation:
    """Train ``logical_steps`` noisy steps in ``mode`` (module docstring) and measure them.

    ``noise_multiplier = 0`` measures divisors (the epsilons are then inf); with a positive
    one the monitor's records carry the epsilons to check: ``monitor(engine, optimizer,
    extra)`` attaches one (a :class:`~opacus_lastiterate.callbacks.PrivacyMonitor`; this
    layer does not import callbacks) and returns it with the list its sink fills.
    ``prepare(engine, optimizer)`` runs after ``make_private`` (to configure a ``"feasgm"``
    or ``"asgm"`` accountant, or call ``use_public_divisor``); what it returns is passed to
    the monitor as extra keyword arguments (e.g. ``corrected_accountant``).
    ``poisson`` defaults to True, except for plain ``"accumulation"`` (Opacus forbids it).
    ``device``: where the model and the batches live (``"cuda"`` for the GPU check).
    """
    import torch
    from opacus import PrivacyEngine

    if accountant not in ("rdp", "prv", "gdp"):  # this package's: registered on import
        import opacus_lastiterate.accountants  # noqa: F401

    if mode not in MODES:
        raise ValueError(f"`mode` must be one of {MODES}, got {mode!r}.")
    ghost = mode.startswith("ghost")
    bmm = mode.endswith("bmm")
    k = accumulation if mode.endswith("accumulation") else 1
    if poisson is None:
        poisson = mode != "accumulation"
    torch.manual_seed(seed)
    if mode == "adaclip":
        model = "zero" if noise_multiplier > 0 and model == "mlp" else model
    module = tiny_model(model).to(device)
    reference = copy.deepcopy(module)
    x, y = _data(model, dataset_size)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=batch_size
    )
    optimizer = torch.optim.SGD(module.parameters(), lr=0.0)
    engine = PrivacyEngine(accountant=accountant)
    criterion = torch.nn.MSELoss()
    kwargs: dict[str, Any] = {}
    if ghost:
        kwargs.update(grad_sample_mode="ghost", criterion=criterion)
    if mode == "adaclip":
        kwargs.update(clipping="adaptive", **(adaclip or ADACLIP_DEFAULTS))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        made = engine.make_private(
            module=module, optimizer=optimizer, data_loader=loader,
            noise_multiplier=noise_multiplier, max_grad_norm=max_grad_norm,
            poisson_sampling=poisson, **kwargs,
        )
    if ghost:
        dp_module, dp_opt, criterion, dp_loader = made
    else:
        dp_module, dp_opt, dp_loader = made
    extra = prepare(engine, dp_opt) if prepare is not None else None
    records: list[Any] = []
    mon = None
    if monitor is not None:
        mon, records = monitor(engine, dp_opt, extra or {})
    obs = ModeObservation(
        mode=mode, model=model, opacus=_version(), physical_steps=0, logical_steps=0,
        history=[], expected_batch_size=float(dp_opt.expected_batch_size),
    )
    batches: list[tuple[Any, Any]] = []
    measure_noise = model == "zero"

    def after_step() -> None:
        steps = sum(s for _, _, s in engine.accountant.history)
        if steps == obs.logical_steps:
            return  # a skipped (virtual) step
        obs.logical_steps = steps
        released = _flat_grad(dp_module)
        if measure_noise:
            noise = released.double().cpu() * float(dp_opt.expected_batch_size)
            obs.noise_multipliers_applied.append(float(noise.std()) / obs.clip_norms[-1])
        elif noise_multiplier == 0:
            d_all, r_all = _fit(_summed_gradient(reference, batches), released)
            d_last, r_last = _fit(_summed_gradient(reference, batches[-1:]), released)
            use_all = r_all <= r_last
            obs.divisors.append(d_all if use_all else d_last)
            obs.released_batches.append("all" if use_all else "last")
        obs.batches_per_step.append(len(batches))
        obs.records_per_step.append(sum(len(b[0]) for b in batches))
        batches.clear()

    def one_backward(xb: Any, yb: Any) -> None:
        xb, yb = xb.to(device), yb.to(device)
        batches.append((xb, yb))
        loss = criterion(dp_module(xb), yb)
        loss.backward()

    def step() -> None:
        obs.clip_norms.append(float(dp_opt.max_grad_norm))
        dp_opt.step()
        obs.physical_steps += 1
        after_step()

    def batches_forever() -> Any:
        while True:
            yield from dp_loader

    source = batches_forever()
    with warnings.catch_warnings():
        # noise 0 measures divisors: the accountants' zero-noise warning is expected
        warnings.filterwarnings("ignore", message=".*noise_multiplier=0.*")
        if bmm:
            from opacus.utils.batch_memory_manager import BatchMemoryManager

            while obs.logical_steps < logical_steps:
                with BatchMemoryManager(
                    data_loader=dp_loader, max_physical_batch_size=physical_batch_size,
                    optimizer=dp_opt,
                ) as memory_loader:
                    for xb, yb in memory_loader:
                        dp_opt.zero_grad()
                        one_backward(xb, yb)
                        step()
                        if obs.logical_steps >= logical_steps and not batches:
                            break
        else:
            while obs.logical_steps < logical_steps:
                dp_opt.zero_grad()
                for _ in range(k):
                    one_backward(*next(source))
                step()
    if mon is not None:
        mon.finish()
    obs.history = [(float(s), float(q), int(n)) for s, q, n in engine.accountant.history]
    obs.records = [r.as_dict() for r in records]
    return obs


ADACLIP_DEFAULTS: dict[str, float] = {
    "target_unclipped_quantile": 0.5,
    "clipbound_learning_rate": 0.2,
    "max_clipbound": 10.0,
    "min_clipbound": 0.1,
    "unclipped_num_std": 2.0,
}
"""The adaptive-clipping arguments of :func:`probe_mode` (``unclipped_num_std`` sigma_u)."""


def _version() -> str:
    import opacus

    return str(opacus.__version__)


def summary(obs: ModeObservation) -> dict[str, Any]:
    """The observation without the per-step records (for the probe's JSON)."""
    out = obs.as_dict()
    out.pop("records")
    out["divisors"] = [float(np.round(d, 6)) for d in obs.divisors]
    return out


def probe_release(seed: int = 0) -> dict[str, Any]:
    """Every mode the installed release has (:data:`MODE_SINCE`), with Opacus's own
    ``"rdp"`` accountant (so this file runs by path where only torch, numpy and opacus are
    installed, as ``scripts/probe_opacus_versions.py`` runs it): the divisor probes of
    ``"mlp"`` (noise off) and the adaptive-clipping noise probe (sigma = 1, sigma_u = 2)."""
    version = _version()
    key = tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in version.split("+")[0].split(".")[:3])
    key = key + (0,) * (3 - len(key))
    out: dict[str, Any] = {"opacus": version, "modes": {}, "failed": {}}
    for mode in MODES:
        if key < MODE_SINCE[mode]:
            continue
        try:
            if mode == "adaclip":
                obs = probe_mode(mode, accountant="rdp", noise_multiplier=1.0, max_grad_norm=1.0,
                                 dataset_size=58, logical_steps=2, seed=seed)
            else:
                obs = probe_mode(mode, accountant="rdp", dataset_size=58, logical_steps=3, seed=seed)
            out["modes"][mode] = summary(obs)
        except Exception as exc:  # a release without the mode's API: record why
            out["failed"][mode] = f"{type(exc).__name__}: {exc}"[:300]
    return out


def _main(argv: list[str] | None = None) -> None:
    import argparse
    import json
    import sys

    parser = argparse.ArgumentParser(description=probe_release.__doc__)
    parser.add_argument("--out", help="write the JSON here (default: stdout)")
    args = parser.parse_args(argv)
    text = json.dumps(probe_release(), indent=1, allow_nan=False)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        sys.stdout.write(text + "\n")


if __name__ == "__main__":
    _main()
