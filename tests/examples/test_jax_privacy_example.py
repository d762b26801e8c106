"""examples/jax_privacy_dpsgd.py: DP-SGD trained with jax_privacy 2.0 and accounted through
the package's dp_accounting accountant gives, step by step, the numbers of the Opacus route
for the same run description, and those numbers are right by independent computations.

Runs where jax and jax_privacy are installed (the light CI job, ``make test-light``, installs
them with the extra ``jax``; there a skip is an error, tests/conftest.py); skipped elsewhere.
The committed log (docs/results/jax_privacy_dpsgd.jsonl) is checked without jax.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import dp_accounting
import pytest

from opacus_lastiterate.analysis import BallsInBins, DPSGDRun
from opacus_lastiterate.analysis.privacy_models import privacy_model
from tests._gaussian import gaussian_mechanism_epsilon
from tests.analysis._reference import weighted_heuristic_quadrature

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "jax_privacy_dpsgd.py"
LOG = REPO / "docs" / "results" / "jax_privacy_dpsgd.jsonl"


def _run_example(tmp_path: Path, *args: str) -> tuple[list[dict], dict]:
    pytest.importorskip("jax")
    pytest.importorskip("jax_privacy")
    log = tmp_path / "log.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
           "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--quick", "--log", str(log), *args],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return [r for r in records if not r.get("final")], records[-1]


def _check_equal_to_the_opacus_route(steps: list[dict], final: dict) -> None:
    for record in steps:
        assert record["heuristic_epsilon"] == pytest.approx(
            record["opacus_route_heuristic_epsilon"], rel=1e-12)
        assert record["standard_rdp_epsilon"] == pytest.approx(
            record["opacus_route_standard_rdp_epsilon"], rel=1e-12)
    assert final["standard_pld_epsilon"] == pytest.approx(
        final["opacus_route_standard_epsilon"], rel=1e-9)


def test_poisson_run_logs_the_opacus_routes_numbers_and_they_are_right(tmp_path: Path) -> None:
    steps, final = _run_example(tmp_path, "--sampler", "poisson")
    assert [r["step"] for r in steps] == list(range(1, 41)) and final["step"] == 40
    _check_equal_to_the_opacus_route(steps, final)
    q, sigma, delta = steps[0]["sample_rate"], steps[0]["noise_multiplier"], steps[0]["delta"]
    # the heuristic by 2^t enumeration and quadrature (tests/analysis/_reference.py)
    for record in steps[:8]:
        t = record["step"]
        reference = weighted_heuristic_quadrature([1.0] * t, q, sigma, delta)
        assert record["heuristic_epsilon"] == pytest.approx(reference, rel=2e-3)
    # the standard numbers by dp_accounting's own accountants, composed here
    for record in steps[::13]:
        event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
        rdp = dp_accounting.rdp.RdpAccountant().compose(event, record["step"])
        assert record["standard_rdp_epsilon"] == pytest.approx(rdp.get_epsilon(delta), rel=1e-9)
    # Poisson batches: mean batch size qN within 4 standard errors; training learns
    sizes = [r["batch_size"] for r in steps]
    n = 2000  # the example's default --dataset-size
    mean, sd = q * n, math.sqrt(q * (1 - q) * n / len(sizes))
    assert abs(sum(sizes) / len(sizes) - mean) < 4 * sd
    assert steps[-1]["loss"] < steps[0]["loss"] and final["train_accuracy"] > 0.8


def test_balls_in_bins_run_uses_each_record_once_per_epoch_and_its_heuristic(tmp_path: Path) -> None:
    steps, final = _run_example(tmp_path, "--sampler", "balls-in-bins")
    _check_equal_to_the_opacus_route(steps, final)
    sigma, delta, k = steps[0]["noise_multiplier"], steps[0]["delta"], 20
    assert steps[0]["sample_rate"] == pytest.approx(1 / k)
    # each record in exactly one step of each epoch: an epoch's batch sizes sum to N
    assert sum(r["batch_size"] for r in steps[:k]) == 2000
    assert sum(r["batch_size"] for r in steps[k : 2 * k]) == 2000
    # after e whole epochs the canary is in exactly e steps: the Gaussian mechanism with
    # mu = e / (sigma sqrt(T)) (tests/_gaussian.py, scipy only)
    for record in (steps[k - 1], steps[2 * k - 1]):
        t = record["step"]
        mu = (t // k) / (sigma * math.sqrt(t))
        assert record["heuristic_epsilon"] == pytest.approx(
            gaussian_mechanism_epsilon(mu, delta), rel=2e-3)


def test_the_committed_log_is_the_opacus_routes_numbers() -> None:
    records = [json.loads(line) for line in LOG.read_text().splitlines()]
    steps, final = [r for r in records if not r.get("final")], records[-1]
    assert final["final"] and len(steps) == final["step"] >= 100
    _check_equal_to_the_opacus_route(steps, final)
    first = steps[0]
    for record in steps[:: max(1, len(steps) // 5)]:
        run = DPSGDRun.constant(
            steps=record["step"], sample_rate=first["sample_rate"],
            noise_multiplier=first["noise_multiplier"],
            sampling=BallsInBins(round(1 / first["sample_rate"]))
            if first["sampler"] == "balls-in-bins" else None,
        )
        assert record["heuristic_epsilon"] == pytest.approx(
            privacy_model("heuristic", run).epsilon(first["delta"]), rel=1e-9)


def test_the_committed_log_equals_opacus_last_iterate_accountant_on_the_same_steps() -> None:
    """The Opacus route itself: ``LastIterateAccountant`` (Opacus's accountant interface) fed
    the logged steps gives the logged heuristic (where torch and Opacus are installed)."""
    pytest.importorskip("opacus")
    from opacus_lastiterate import LastIterateAccountant

    records = [json.loads(line) for line in LOG.read_text().splitlines()]
    steps = [r for r in records if not r.get("final")]
    assert steps[0]["sampler"] == "poisson"
    accountant = LastIterateAccountant()
    for record in steps:
        accountant.step(noise_multiplier=record["noise_multiplier"],
                        sample_rate=record["sample_rate"])
        if record["step"] % 50 == 1 or record is steps[-1]:
            assert accountant.get_epsilon(record["delta"]) == pytest.approx(
                record["heuristic_epsilon"], rel=1e-12)
