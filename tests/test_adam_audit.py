"""scripts/adam_audit.py: a small sweep writes the table it claims (the runner's bound, the
trainer's Adam heuristic, the standard epsilon) and flags a bound above the heuristic."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "adam_audit.py"
DELTA = 1e-5


def _script():
    spec = importlib.util.spec_from_file_location("adam_audit", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["adam_audit"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning")
def test_a_small_sweep_writes_its_table(tmp_path: Path) -> None:
    pytest.importorskip("opacus")
    import torch

    from opacus_lastiterate.auditing.runner import audit_records

    script = _script()
    out, records = tmp_path / "adam_audit", tmp_path / "records"
    argv = ["--runs", "8", "--workers", "0", "--settings", "q0.5_sigma1.5_T25", "--out", str(out),
            "--records", str(records)]  # fmt: skip
    threads = torch.get_num_threads()
    try:
        assert script.main(argv) == 0  # sets one intra-op thread, as the runner's workers
    finally:
        torch.set_num_threads(threads)
    summary = json.loads(out.with_suffix(".json").read_text())
    (row,) = summary["rows"]
    trainer = next(s for s in script.SETTINGS if s.name == "q0.5_sigma1.5_T25").trainer()
    assert trainer.optimizer == "adamw" and trainer.sample_rate == 0.5
    assert row["num_runs"] == 8 and row["num_in"] + row["num_out"] == 8
    assert (
        row["lower_bound"]
        == audit_records(records / "q0.5_sigma1.5_T25.jsonl", delta=DELTA).epsilon
    )
    assert row["lower_bound_kind"] == "bound"
    assert row["heuristic"] == trainer.heuristic_epsilon(DELTA)
    assert row["standard"] == pytest.approx(trainer.standard_epsilon(DELTA))
    assert row["heuristic"] < row["constant_rate_heuristic"] < row["standard"]
    assert row["exceeds_heuristic"] == (row["lower_bound"] > row["heuristic"])
    assert 0.0 <= row["frozen_model_bound"] <= row["heuristic"]
    assert any("steps = 25" in c for c in row["caveats"])
    text = out.with_suffix(".txt").read_text()
    assert "| 0.5 | 1.5 | 25 | 8 (" in text and "No valid lower bound exceeds" in text
