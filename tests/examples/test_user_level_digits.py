"""examples/user_level_digits.py runs at user level: the accountant reports the unit "user-level
sampling" and the scheme over users, the monitor prints a row per step, and the final
heuristic of whole shuffled epochs is the Gaussian mechanism over users (closed form)."""

from __future__ import annotations

import importlib.util
import math
import re
from pathlib import Path

import pytest

from tests._gaussian import gaussian_mechanism_epsilon

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "user_level_digits.py"


def _main():
    spec = importlib.util.spec_from_file_location("user_level_digits", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.mark.slow
def test_example_trains_users_and_reports_the_users_epsilon(capsys) -> None:
    argv = ["--quick", "--sampling", "shuffled", "--users-per-step", "50", "--sigma", "2.0",
            "--canaries", "20", "--canary-users", "10", "--canary-records", "3",
            "--standard-every", "100"]
    assert _main()(argv) == 0
    out = capsys.readouterr().out
    assert "unit: user-level sampling" in out
    users = int(re.search(r"digits: (\d+) users", out).group(1))
    steps = math.ceil(users / 50)
    assert f"N = {users}, B = 50" in out
    rows = re.findall(r"^\s+(\d+)\s+([0-9.]+)\s+", out, flags=re.MULTILINE)
    assert [int(s) for s, _ in rows[:steps]] == list(range(1, steps + 1))
    # one whole epoch at a constant learning rate: mu = 1 / (sigma sqrt(T))
    final = float(re.search(r"epsilon ([0-9.]+)  \(last-iterate", out).group(1))
    mu = 1 / (2.0 * math.sqrt(steps))
    assert final == pytest.approx(gaussian_mechanism_epsilon(mu, 1e-5), abs=1e-4)
    assert "gradient canaries: 20" in out and "input canaries: 10" in out
