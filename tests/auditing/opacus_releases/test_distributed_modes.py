"""DDP (hooks and ghost clipping) and FSDP through ``PrivacyEngine``, 2 gloo processes on CPU.

Each rank runs ``auditing.opacus_releases.distributed.probe_rank`` twice per mode: with
noise 0 (the divisor of the global update, against the summed per-sample gradients of both
ranks' batches) and with noise 1 and a monitor on every rank (its records against the
independent epsilons of ``_independent.py``). Expected, by hand: N = 60, L = 12, so
len(loader) = 5, q = 0.2, int(N q) = 12; each rank divides by 12 / 2 = 6, the global
divisor is 12; every rank's accountant and monitor hold the same history and final record;
only rank 0 calls the sinks. About 60 s on one core: ``slow``.
"""

from __future__ import annotations

import json
import os
import socket
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")
import torch.distributed as dist  # noqa: E402

from opacus_lastiterate.analysis.opacus_modes import distributed_divisors  # noqa: E402
from opacus_lastiterate.analysis.opacus_releases import installed_release  # noqa: E402
from tests.auditing.opacus_releases._independent import (  # noqa: E402
    check_records,
    monitor_factory,
)

WORLD = 2
N, L, Q, STEPS = 60, 12, 0.2, 3
REL = installed_release()
MODES = ["ddp", "ddp_ghost", "fsdp"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (dist.is_available() and dist.is_gloo_available()),
        reason="torch.distributed with the gloo backend is not available",
    ),
    pytest.mark.skipif(
        REL is None or REL.key < (1, 6, 0), reason="FSDP and ghost DDP need Opacus 1.6.0"
    ),
]


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=120))
    try:
        from opacus_lastiterate.auditing.opacus_releases.distributed import probe_rank

        warnings.simplefilter("ignore")
        result: dict[str, Any] = {}
        for mode in MODES:
            result[mode] = {
                "divisor": probe_rank(mode, noise_multiplier=0.0, dataset_size=N,
                                      batch_size=L, steps=STEPS),
                "epsilon": probe_rank(mode, noise_multiplier=1.0, max_grad_norm=1.0,
                                      dataset_size=N, batch_size=L, steps=STEPS,
                                      monitor=monitor_factory),
            }
        (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("modes")
    mp.spawn(_worker, args=(_free_port(), str(out)), nprocs=WORLD, join=True)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.parametrize("mode", MODES)
def test_divisor_per_rank_and_global(ranks: list[dict[str, Any]], mode: str) -> None:
    per_rank, global_divisor = distributed_divisors("1.6.0", N, L, WORLD)
    assert (per_rank, global_divisor) == (6.0, 12.0)  # int(60 / 5) / 2, int(60 / 5)
    expected_class = {
        "ddp": "DistributedDPOptimizer",
        "ddp_ghost": "DistributedDPOptimizerFastGradientClipping",
        "fsdp": "FSDPOptimizerFastGradientClipping",
    }[mode]
    for r in ranks:
        obs = r[mode]["divisor"]
        assert obs["optimizer"] == expected_class
        assert obs["expected_batch_size"] == per_rank
        assert obs["divisors"] == pytest.approx([global_divisor] * STEPS, rel=1e-5)
        assert obs["history"] == [[0.0, Q, STEPS]]


@pytest.mark.parametrize("mode", MODES)
def test_every_rank_accounts_the_same_and_rank_zero_logs(
    ranks: list[dict[str, Any]], mode: str
) -> None:
    zero, one = (r[mode]["epsilon"] for r in ranks)
    assert zero["history"] == one["history"] == [[1.0, Q, STEPS]]
    assert zero["final"] == one["final"] and zero["final"]["step"] == STEPS
    assert zero["calls_sinks"] is True and one["calls_sinks"] is False
    assert one["records"] == []
    check_records(zero["records"], Q, 1.0, corrected=False)
    assert [x["step"] for x in zero["records"]] == [*range(1, STEPS + 1), STEPS]
