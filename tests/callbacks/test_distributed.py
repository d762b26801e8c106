"""Monitor and in-training canary audit under torch.distributed (gloo, 2 processes, CPU).

Each rank trains the same tiny linear model through Opacus's ``DistributedDPOptimizer``
(``make_private`` on a ``DifferentiallyPrivateDistributedDataParallel`` module) and writes
what it saw to a JSON file; the test compares the ranks with each other and with a
single-process run of the same canaries.
"""

from __future__ import annotations

import json
import os
import socket
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import opacus_lastiterate.accountants  # noqa: F401  (registers accountant="last_iterate")

WORLD_SIZE = 2
DELTA = 1e-5
M = 20  # canaries; the linear model has 2M inputs, the data live on the first M
N, BATCH = 200, 20  # q = 0.1; global expected batch size 20, 10 per worker
LR, CLIP = 0.1, 1.0
CANARY_STEPS = 15
MONITORED_STEPS = 6
REFUSED_STEP = 4  # the budget is the heuristic epsilon after step 3
CANARY_SEED = 7

needs_gloo = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="torch.distributed with the gloo backend is not available",
)


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.zeros(N, 2 * M)
    x[:, :M] = torch.randn(N, M, generator=g)
    return TensorDataset(x, torch.randn(N, 1, generator=g))


def _make_private(sigma: float, *, distributed: bool) -> tuple[Any, nn.Module, Any, Any]:
    from opacus import PrivacyEngine
    from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP

    torch.manual_seed(1)
    model: nn.Module = nn.Linear(2 * M, 1, bias=False)
    if distributed:
        model = DPDDP(model)  # broadcasts rank 0's parameters
    engine = PrivacyEngine(accountant="last_iterate")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optimizer, loader = engine.make_private(
            module=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=LR),
            data_loader=DataLoader(_data(), batch_size=BATCH),
            noise_multiplier=sigma,
            max_grad_norm=CLIP,
            poisson_sampling=True,
        )
    return engine, model, optimizer, loader


def _train(model: nn.Module, optimizer: Any, loader: Any, steps: int) -> None:
    taken = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        while taken < steps:
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
                taken += 1
                if taken == steps:
                    return


def _flat(model: nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def _canary_run(*, distributed: bool) -> dict[str, Any]:
    """Noise 0: the canary coordinates move by lr * C * (times sampled) / B exactly."""
    from opacus_lastiterate.callbacks import InTrainingCanaryAudit

    engine, model, optimizer, loader = _make_private(0.0, distributed=distributed)
    audit = InTrainingCanaryAudit(
        optimizer,
        num_canaries=M,
        sample_rate=1 / len(loader),
        seed=CANARY_SEED,
        accountant=engine.accountant,
        candidates=np.arange(M, 2 * M),
    )
    _train(model, optimizer, loader, CANARY_STEPS)
    world = optimizer.world_size if distributed else 1
    return {
        "rank": audit.rank,
        "coordinates": audit.coordinates.tolist(),
        "coins": audit.coins.tolist(),
        "insertions": audit.insertions().tolist(),
        "scores": audit.gradient_scores().tolist(),
        "global_batch": float(optimizer.expected_batch_size) * world,
        "steps": audit.steps,
        "params": _flat(model),
    }


def _monitored_run(rank: int, out: Path) -> dict[str, Any]:
    from opacus_lastiterate.accountants import LastIterateAccountant
    from opacus_lastiterate.callbacks import JsonlSink, PrivacyBudget, PrivacyMonitor

    engine, model, optimizer, loader = _make_private(1.0, distributed=True)
    probe = LastIterateAccountant()
    for _ in range(REFUSED_STEP - 1):
        probe.step(noise_multiplier=1.0, sample_rate=1 / len(loader))
    monitor = PrivacyMonitor(
        engine,
        delta=DELTA,
        sinks=[JsonlSink(out / f"sink{rank}.jsonl")],
        robust_every=None,
        standard_every=None,
        # the limit is eps after REFUSED_STEP - 1 steps, up to the root finder's tolerance
        # (the probe solves cold, the monitor warm; they may differ in the last digits)
        budget=PrivacyBudget(probe.get_epsilon(DELTA) * (1 + 1e-9), action="stop"),
        optimizer=optimizer,
    )
    stopped_at = None
    for step in range(1, MONITORED_STEPS + 1):
        _train(model, optimizer, loader, 1)
        if monitor.should_stop and stopped_at is None:
            stopped_at = step
    final = monitor.finish()
    assert final is not None
    return {
        "calls_sinks": monitor.calls_sinks,
        "history": [list(h) for h in engine.accountant.history],
        "epsilon": engine.get_epsilon(DELTA),
        "robust": engine.accountant.get_epsilon(DELTA, robust=True),
        "records_emitted": monitor.records_emitted,
        "final": final.as_dict(),
        "stopped_at": stopped_at,
        "stop_reason": monitor.stop_reason,
        "params": _flat(model),
    }


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=60)
    )
    try:
        out = Path(out_dir)
        result = {"monitored": _monitored_run(rank, out), "canaries": _canary_run(distributed=True)}
        (out / f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Path]:
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("distributed")
    mp.spawn(_worker, args=(_free_port(), str(out)), nprocs=WORLD_SIZE, join=True)
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD_SIZE)]
    return results, out


@needs_gloo
def test_only_rank_zero_calls_the_sinks(ranks: tuple[list[dict[str, Any]], Path]) -> None:
    results, out = ranks
    zero, one = (r["monitored"] for r in results)
    assert zero["calls_sinks"] and not one["calls_sinks"]
    lines = (out / "sink0.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]  # one row per step
    assert json.loads(lines[-1])["final"] is True
    assert (out / "sink1.jsonl").read_text() == ""  # created by the sink, never written
    assert zero["records_emitted"] == one["records_emitted"] == 4  # rank 1 built them too


@needs_gloo
def test_accountants_and_budget_agree_across_ranks(
    ranks: tuple[list[dict[str, Any]], Path],
) -> None:
    zero, one = (r["monitored"] for r in ranks[0])
    assert zero["history"] == one["history"] == [[1.0, 0.1, REFUSED_STEP - 1]]
    for key in ("epsilon", "robust", "final", "stopped_at", "stop_reason"):
        assert zero[key] == one[key], key
    assert zero["stopped_at"] == REFUSED_STEP
    assert f"step {REFUSED_STEP} would bring" in zero["stop_reason"]
    assert zero["params"] == one["params"]  # the refused steps were skipped on both ranks


@needs_gloo
def test_canaries_identical_across_ranks_and_counted_once(
    ranks: tuple[list[dict[str, Any]], Path],
) -> None:
    zero, one = (r["canaries"] for r in ranks[0])
    assert (zero["rank"], one["rank"]) == (0, 1)
    for key in ("coordinates", "coins", "insertions", "steps", "params", "scores"):
        assert zero[key] == one[key], key
    single = _canary_run(distributed=False)
    assert single["rank"] is None
    for key in ("coordinates", "coins", "insertions", "steps"):
        assert zero[key] == single[key], key
    counts = np.asarray(zero["insertions"])
    coins = np.asarray(zero["coins"])
    assert counts[coins].sum() > 0 and np.all(counts[~coins] == 0)
    assert zero["global_batch"] == pytest.approx(single["global_batch"]) == BATCH
    # once in the global sum, divided by the global expected batch size: not world_size times
    expected = LR * CLIP * counts / BATCH
    np.testing.assert_allclose(zero["scores"], expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(zero["scores"], single["scores"], rtol=1e-5, atol=1e-7)


# -- without a process group -------------------------------------------------------------------


def _bare(cls: type, rank: int = 0) -> Any:
    """An instance of an Opacus optimizer class without running its constructor (which
    needs a process group): enough for the type checks."""
    opt = cls.__new__(cls)
    opt.rank, opt.world_size = rank, 2
    return opt


def test_distributed_optimizers_supported_or_refused_with_the_reason() -> None:
    from opacus.optimizers import (
        DistributedDPOptimizer,
        DistributedDPOptimizerFastGradientClipping,
        FSDPOptimizerFastGradientClipping,
        SimpleDistributedPerLayerOptimizer,
    )
    from opacus.optimizers.ddp_perlayeroptimizer import DistributedPerLayerOptimizer

    from opacus_lastiterate.callbacks.canary_audit import _distributed_rank

    assert _distributed_rank(_bare(DistributedDPOptimizer, 1)) == 1
    refused = {
        SimpleDistributedPerLayerOptimizer: "per-layer clipping",
        DistributedPerLayerOptimizer: "per parameter in backward hooks",
        DistributedDPOptimizerFastGradientClipping: "ghost clipping",
        FSDPOptimizerFastGradientClipping: "ghost clipping",
    }
    for cls, reason in refused.items():
        with pytest.raises(TypeError, match=reason):
            _distributed_rank(_bare(cls))

    class Custom(DistributedDPOptimizer):
        def reduce_gradients(self) -> None:  # pragma: no cover - never called
            pass

    with pytest.raises(TypeError, match="overrides reduce_gradients"):
        _distributed_rank(_bare(Custom))


def test_sink_rank_without_a_process_group() -> None:
    from opacus_lastiterate.callbacks import PrivacyMonitor
    from tests.callbacks.conftest import make_dp, train

    assert not dist.is_initialized()
    for sink_rank, called in ((0, True), (None, True), (1, False)):
        engine, model, opt, loader = make_dp()
        records: list[Any] = []
        monitor = PrivacyMonitor(
            engine, delta=DELTA, sinks=[records.append], optimizer=opt, sink_rank=sink_rank,
            flush_every=1,
        )
        assert monitor.rank == 0 and monitor.calls_sinks is called
        train(model, opt, loader, 2)
        assert monitor.records_emitted == 2 and len(records) == (2 if called else 0)
    for bad in (-1, 1.0, True):
        with pytest.raises(ValueError, match="`sink_rank`"):
            PrivacyMonitor(engine, delta=DELTA, sink_rank=bad)  # type: ignore[arg-type]
