"""examples/language_model_lora.py: the LoRA recipe runs end to end on the Hugging Face
Trainer and on Lightning, with AdamW and the linear warm-up/decay by default, logs one record
per step (shuffled batches) with the adaptive heuristic and no fallback of the accountant to
the constant-rate formula; ghost clipping and the overhead comparison run too. The committed
log (docs/results/language_model_lora.jsonl) is checked against independent computations.

The runs need ``transformers``, ``peft`` (and ``lightning``); each trains for 10 steps in a
fresh process (about 10-30 s on a shared CPU), so they are slow tests.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._gaussian import gaussian_mechanism_epsilon

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "language_model_lora.py"
LOG = REPO / "docs" / "results" / "language_model_lora.jsonl"
ADAPTIVE = "heuristic; adaptive second moment treated as fixed"
QUICK_STEPS, QUICK_N, QUICK_BATCH, PEAK_LR = 10, 512, 32, 1e-2


def _linear_warmup_decay(steps: int, warmup: int, peak: float) -> list[float]:
    """The Hugging Face linear schedule, written out: step k (0-based) of ``steps``."""
    return [peak * k / warmup if k < warmup else peak * (steps - k) / (steps - warmup)
            for k in range(steps)]


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[dict], dict]:
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
           "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--quick", "--out", str(out), *args],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [json.loads(line) for line in (out / "privacy.jsonl").read_text().splitlines()]
    return result, rows, json.loads((out / "summary.json").read_text())


def _check_quick_run(result: subprocess.CompletedProcess, rows: list[dict], summary: dict) -> None:
    text = result.stdout + result.stderr
    assert "OptimizerTraceWarning" not in text and "falls back" not in text
    assert [r["step"] for r in rows] == list(range(1, QUICK_STEPS + 1))  # one row per step
    assert [r["final"] for r in rows] == [False] * (QUICK_STEPS - 1) + [True]
    assert {r["sampling"] for r in rows} == {"shuffled"}
    assert all(r["sample_rate"] == QUICK_BATCH / QUICK_N for r in rows)
    expected = _linear_warmup_decay(QUICK_STEPS, math.ceil(0.1 * QUICK_STEPS), PEAK_LR)
    assert [r["lr"] for r in rows] == pytest.approx(expected, rel=1e-9)
    # step 1 runs at learning rate 0: the model after it does not depend on the data
    assert rows[0]["heuristic_epsilon"] == 0.0
    assert all(r["heuristic_epsilon"] > 0 for r in rows[1:])
    # the first epoch of shuffled batches uses each sentence once: one Gaussian mechanism
    gaussian = gaussian_mechanism_epsilon(1.0, 1e-5)
    assert all(r["standard_epsilon"] == pytest.approx(gaussian, rel=1e-3) for r in rows)
    assert summary["heuristic_label"] == ADAPTIVE
    assert f"accountant {ADAPTIVE!r}" in result.stdout
    assert "wiring check passed on 4 LoRA tensors" in result.stdout


@pytest.mark.slow
def test_trainer_adamw_default_logs_the_adaptive_heuristic_every_step(tmp_path: Path) -> None:
    result, rows, summary = _run(tmp_path)
    _check_quick_run(result, rows, summary)
    assert summary["loop"] == "hf" and summary["optimizer"] == "adamw"


@pytest.mark.slow
def test_lightning_adamw_logs_the_same_records(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    result, rows, summary = _run(tmp_path, "--loop", "lightning")
    _check_quick_run(result, rows, summary)
    assert summary["loop"] == "lightning"


@pytest.mark.slow
def test_ghost_clipping_on_the_trainer(tmp_path: Path) -> None:
    result, rows, summary = _run(tmp_path, "--ghost")
    _check_quick_run(result, rows, summary)
    assert "ghost clipping (C = 1.0)" in result.stdout and summary["ghost"] is True


@pytest.mark.slow
def test_ghost_clipping_on_lightning(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    result, rows, summary = _run(tmp_path, "--ghost", "--loop", "lightning")
    _check_quick_run(result, rows, summary)


@pytest.mark.slow
def test_sgd_option_and_the_overhead_comparison(tmp_path: Path) -> None:
    result, rows, summary = _run(tmp_path, "--optimizer", "sgd", "--compare")
    assert [r["step"] for r in rows] == list(range(1, QUICK_STEPS + 1))
    assert summary["heuristic_label"] == "heuristic" and summary["optimizer"] == "sgd"
    expected = _linear_warmup_decay(QUICK_STEPS, 1, 2.0)
    assert [r["lr"] for r in rows] == pytest.approx(expected, rel=1e-9)
    compare = summary["compare"]
    assert compare["ratio"] == pytest.approx(
        compare["seconds_per_step_with"] / compare["seconds_per_step_without"])
    assert "ratio" in result.stdout
    # same seed, same updates: the monitor only observes
    assert compare["loss_after_without"] == pytest.approx(summary["loss_after"], abs=1e-6)


def _load_example():
    spec = importlib.util.spec_from_file_location("language_model_lora", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks the module up
    spec.loader.exec_module(module)
    return module


def test_sizes_and_defaults_of_the_command_line() -> None:
    example = _load_example()
    quick = example.parse(["--quick", "--device", "cpu"])
    assert (quick.steps, quick.n, quick.batch_size, quick.lr) == (10, QUICK_N, QUICK_BATCH, PEAK_LR)
    assert quick.optimizer == "adamw" and quick.loop == "hf" and quick.warmup_steps == 1
    gpu = example.parse(["--size", "gpu", "--device", "cpu", "--optimizer", "sgd"])
    assert gpu.arch["n_layer"] == 4 and 256 <= gpu.arch["n_embd"] <= 512
    assert 64 <= gpu.length <= 128 and gpu.batch_size == 64 and gpu.steps >= 200
    assert gpu.lr == 2.0 and gpu.warmup_steps == math.ceil(0.1 * gpu.steps)
    for bad in (["--steps", "0"], ["--warmup-ratio", "1"]):
        with pytest.raises(SystemExit):
            example.parse(bad)


def test_toy_language_and_build_model_keep_their_signatures() -> None:
    """lm-ddp and the canary recipe import these two: ``build_model(rank)`` still works."""
    pytest.importorskip("peft")
    example = _load_example()
    data = example.ToyLanguage(8, seed=1)
    assert data.tokens.shape == (8, example.LENGTH)
    steps = (data.tokens[:, 1] - data.tokens[:, 0]) % example.VOCAB
    assert set(steps.tolist()) <= {1, 2, 3, 5}
    assert ((data.tokens[:, 1:] - data.tokens[:, :-1]) % example.VOCAB == steps[:, None]).all()
    model = example.build_model(4)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert sum(p.numel() for n, p in model.named_parameters() if n in trainable) == 2 * (64 * 4 + 4 * 192)


def test_committed_log_is_one_adamw_record_per_step() -> None:
    """docs/results/language_model_lora.jsonl: the default CPU run (100 steps of 64 from
    2,048 sentences, AdamW, 10 warm-up steps)."""
    rows = [json.loads(line) for line in LOG.read_text().splitlines()]
    steps = len(rows)
    assert [r["step"] for r in rows] == list(range(1, steps + 1)) and rows[-1]["final"]
    assert {r["sampling"] for r in rows} == {"shuffled"}
    assert [r["lr"] for r in rows] == pytest.approx(
        _linear_warmup_decay(steps, math.ceil(0.1 * steps), PEAK_LR), rel=1e-9)
    assert rows[0]["heuristic_epsilon"] == 0.0 and all(r["heuristic_epsilon"] for r in rows[1:])
    epoch = 2048 // 64
    gaussian = gaussian_mechanism_epsilon(1.0, 1e-5)
    assert all(r["standard_epsilon"] == pytest.approx(gaussian, rel=1e-3) for r in rows[:epoch])
    assert rows[-1]["standard_epsilon"] > rows[epoch]["standard_epsilon"] > gaussian
