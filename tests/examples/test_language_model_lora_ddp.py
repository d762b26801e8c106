"""examples/language_model_lora_ddp.py under torchrun: 2 CPU processes, gloo, ``--quick``.

One launch (about 15 s of CPU): the run writes exactly one privacy log (rank 0's), one row
per step; its epsilons are those of one process accounting the same steps at the global
sample rate, computed here independently (the standard epsilon by dp_accounting's PLD for
Poisson sampling; the AdamW heuristic from weights of a numpy AdamW on one coordinate, second
moment frozen at its expectation under the noise sigma C / B of the global batch B); rank 0
prints one audit report; both ranks end with the same parameters (each saved its own).
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")
pytest.importorskip("peft")
pytest.importorskip("transformers")
import torch.distributed as dist  # noqa: E402

from opacus_lastiterate.analysis.privacy_models import privacy_model  # noqa: E402
from opacus_lastiterate.analysis.run import DPSGDRun  # noqa: E402
from tests.analysis._reference import frozen_adamw_weights  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "language_model_lora_ddp.py"
WORLD = 2
# --quick: 10 steps, N = 512, global batch 32 (q = 1/16), sigma = C = 1, AdamW lr 5e-3,
# weight decay 0.01, torch's betas (0.9, 0.999) and eps 1e-8
STEPS, N, BATCH, SIGMA, CLIP = 10, 512, 32, 1.0, 1.0
LR, WD, BETAS, EPS = 5e-3, 0.01, (0.9, 0.999), 1e-8
DELTA = 1e-5

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (dist.is_available() and dist.is_gloo_available()),
        reason="torch.distributed with the gloo backend is not available",
    ),
]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("lm_ddp")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path[1:]]),
           "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc_per_node={WORLD}", str(EXAMPLE), "--quick", "--dump-params",
         "--out", str(out)],
        capture_output=True, text=True, cwd=out, env=env, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return {"out": out, "stdout": result.stdout,
            "summary": json.loads((out / "summary.json").read_text())}


@functools.cache
def _pld(steps: int, q: float, sigma: float) -> float:
    """Standard epsilon of ``steps`` Poisson-subsampled Gaussian steps, dp_accounting's PLD."""
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
    return float(acc.get_epsilon(DELTA))


def test_one_log_one_row_per_step(run: dict[str, Any]) -> None:
    out = run["out"]
    assert sorted(p.name for p in out.rglob("*.jsonl")) == ["privacy.jsonl"]
    rows = [json.loads(line) for line in (out / "privacy.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert [r["final"] for r in rows] == [False] * (STEPS - 1) + [True]
    assert {r["sampling"] for r in rows} == {"poisson"}


def test_the_accountant_sees_the_global_batch(run: dict[str, Any]) -> None:
    s = run["summary"]
    assert s["world_size"] == WORLD and s["backend"] == "gloo" and s["steps"] == STEPS
    q = BATCH / N
    assert s["sample_rate"] == q
    assert s["history"] == [[SIGMA, q, STEPS]]
    assert s["per_rank_expected_batch_size"] == BATCH / WORLD
    # the noise the adaptive heuristic models is on the average over the global batch
    assert s["adaptive_noise_std"] == [pytest.approx(SIGMA * CLIP / BATCH, rel=1e-12)]
    # 10 Poisson global batches of mean 32: their mean is within 6 standard errors of 32
    assert abs(s["mean_realised_global_batch"] - BATCH) < 6 * math.sqrt(BATCH / STEPS)


def test_epsilons_are_those_of_one_process_at_the_global_rate(run: dict[str, Any]) -> None:
    rows = [json.loads(line) for line in (run["out"] / "privacy.jsonl").read_text().splitlines()]
    q = BATCH / N
    for r in rows:
        t = r["step"]
        assert r["sample_rate"] == q and r["noise_multiplier"] == SIGMA
        assert r["standard_epsilon"] == pytest.approx(_pld(t, q, SIGMA), rel=1e-9)
        weights = frozen_adamw_weights([LR] * t, noise_std=SIGMA * CLIP / BATCH, beta1=BETAS[0],
                                       beta2=BETAS[1], eps=EPS, weight_decay=WD)  # the run that ends at step t
        run_t = DPSGDRun(DPSGDRun.constant(steps=t, sample_rate=q, noise_multiplier=SIGMA)
                         .segments, weights=weights)
        expected = privacy_model("heuristic", run_t).epsilon(DELTA)
        assert r["heuristic_epsilon"] == pytest.approx(expected, rel=2e-3)
    final = run["summary"]["final"]
    assert final["step"] == STEPS and final["heuristic_epsilon"] == rows[-1]["heuristic_epsilon"]


def test_one_audit_report_from_rank_zero(run: dict[str, Any]) -> None:
    assert run["stdout"].count("In-training canary audit") == 1
    audit = run["summary"]["audit"]
    assert audit["steps"] == STEPS and audit["sample_rate"] == BATCH / N
    (gradient,) = audit["audits"]
    assert gradient["canaries"] == "gradient" and gradient["num_canaries"] == 200
    assert 0 < gradient["num_included"] < 200
    assert audit["standard_epsilon"] == pytest.approx(_pld(STEPS, BATCH / N, SIGMA), rel=1e-9)


def test_ranks_end_with_identical_parameters(run: dict[str, Any]) -> None:
    out = run["out"]
    zero, one = (torch.load(out / f"params_rank{r}.pt") for r in range(WORLD))
    assert zero.shape == one.shape == (4096,)
    assert torch.equal(zero, one)
    assert run["summary"]["parameters_identical_across_ranks"] is True
    # trained: the LoRA B matrices start at zero and moved (the A matrices are random)
    assert int((zero != 0).sum()) > 1024
