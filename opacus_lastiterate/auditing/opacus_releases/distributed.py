"""Probe Opacus's distributed paths on its real code: DDP (``DistributedDPOptimizer``, hooks
or ghost clipping) and FSDP (``grad_sample_mode="ghost_fsdp"``, ``FSDPOptimizerFastGradientClipping``).

:func:`probe_rank` runs on every rank of an initialised process group (gloo on CPU is
enough) and returns what that rank saw: the optimizer class, the per-rank
``expected_batch_size``, the accountant's history, the logical steps, the monitor's records
(sinks on rank 0 only), and, with ``noise_multiplier = 0``, the divisor d of the *global*
update: the released gradient (after the all-reduce; for FSDP the gathered full tensor)
compared with the gradient of the summed per-sample losses of every rank's batch (each rank
computes its own on a plain copy of the model, then they are summed with ``all_reduce``).

Measured on Opacus 1.6.0, torch 2.13 CPU, gloo, 2 ranks, N = 60, L = 12: every rank's
``expected_batch_size`` is int(N q) / W = 6.0, the global divisor is 12 = int(N q) in all
three paths, and every rank's accountant holds the same history. FSDP on CPU fails at the
wrapped SGD step when a parameter cannot be sharded evenly (a [1, 4] weight on 2 ranks:
``RuntimeError: aten.add_.Tensor: in-place operations that require placement changes are not
supported``), so the probe's model has only evenly shardable parameters.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

from opacus_lastiterate.auditing.opacus_releases.modes import MonitorFactory

__all__ = []

DISTRIBUTED_MODES = ("ddp", "ddp_ghost", "fsdp")


def _model() -> Any:
    import torch
    from torch import nn

    class SumOutputs(nn.Module):
        def forward(self, h: Any) -> Any:
            return h.sum(-1)

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 2), SumOutputs())


def _full(t: Any) -> Any:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def probe_rank(
    mode: str,
    *,
    noise_multiplier: float = 0.0,
    max_grad_norm: float = 1e6,
    dataset_size: int = 60,
    batch_size: int = 12,
    steps: int = 3,
    accountant: str = "last_iterate",
    monitor: MonitorFactory | None = None,
) -> dict[str, Any]:
    """One rank's observation of ``steps`` training steps in ``mode`` (module docstring);
    ``monitor`` as in :func:`~opacus_lastiterate.auditing.opacus_releases.modes.probe_mode`
    (created on every rank)."""
    import torch
    import torch.distributed as dist
    from opacus import PrivacyEngine

    import opacus_lastiterate.accountants  # noqa: F401  (registers the accountants)

    if mode not in DISTRIBUTED_MODES:
        raise ValueError(f"`mode` must be one of {DISTRIBUTED_MODES}, got {mode!r}.")
    rank, world = dist.get_rank(), dist.get_world_size()
    module = _model()
    reference = copy.deepcopy(module)
    if mode == "fsdp":
        from opacus.utils.fsdp_utils import FSDP2Wrapper

        module = FSDP2Wrapper(module)
        gsm = "ghost_fsdp"
    else:
        from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP

        module = DPDDP(module)
        gsm = "ghost" if mode == "ddp_ghost" else "hooks"
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(dataset_size, 6, generator=g), torch.randn(dataset_size, generator=g)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y), batch_size=batch_size
    )
    engine = PrivacyEngine(accountant=accountant)
    criterion = torch.nn.MSELoss()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        made = engine.make_private(
            module=module, optimizer=torch.optim.SGD(module.parameters(), lr=0.0),
            data_loader=loader, noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm, criterion=criterion, grad_sample_mode=gsm,
        )
    if len(made) == 4:
        dp_module, opt, criterion, dp_loader = made
    else:
        dp_module, opt, dp_loader = made
    mon, records = monitor(engine, opt, {}) if monitor is not None else (None, [])
    divisors: list[float] = []
    physical = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        while physical < steps:
            for xb, yb in dp_loader:
                opt.zero_grad()
                criterion(dp_module(xb), yb).backward()
                opt.step()
                physical += 1
                if noise_multiplier == 0:
                    divisors.append(_global_divisor(reference, dp_module, xb, yb))
                if physical == steps:
                    break
    final = mon.finish() if mon is not None else None
    return {
        "rank": rank,
        "world_size": world,
        "optimizer": type(opt).__name__,
        "expected_batch_size": float(opt.expected_batch_size),
        "sample_rate": 1 / len(dp_loader),
        "history": [[float(s), float(q), int(n)] for s, q, n in engine.accountant.history],
        "physical_steps": physical,
        "divisors": divisors,
        "calls_sinks": None if mon is None else mon.calls_sinks,
        "records": [r.as_dict() for r in records],
        "final": None if final is None else final.as_dict(),
    }


def _global_divisor(reference: Any, dp_module: Any, xb: Any, yb: Any) -> float:
    import torch
    import torch.distributed as dist

    reference.zero_grad(set_to_none=True)
    if len(xb):
        torch.nn.functional.mse_loss(reference(xb), yb, reduction="sum").backward()
    local = torch.cat(
        [
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
            for p in reference.parameters()
        ]
    )
    dist.all_reduce(local, op=dist.ReduceOp.SUM)
    released = torch.cat([_full(p.grad).reshape(-1) for p in dp_module.parameters()])
    return float(torch.dot(local, local) / torch.dot(local, released))
