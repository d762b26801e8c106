"""The per-step cost of a PrivacyMonitor recording every step of an AdamW run with
shuffled batches (the setting of ``examples/language_model_lora.py --compare``): the
standard PLD epsilon asked at every step must not rebuild the one-step PLD each step, and
the monitor's time per step late in the run must not grow like the step number."""

from __future__ import annotations

import time
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

from opacus import PrivacyEngine  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import opacus_lastiterate.accountants  # noqa: E402,F401
from opacus_lastiterate.analysis.baselines import pld_composition  # noqa: E402
from opacus_lastiterate.callbacks import PrivacyMonitor  # noqa: E402
from tests._pmf_builds import record_pmf_builds  # noqa: E402


def _train(steps: int, monitored: bool) -> list[float]:
    """CPU seconds of each step (the monitor's evaluations included) of a shuffled AdamW
    run with a linear warm-up/decay, with or without a monitor recording every step."""
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(512, 8), torch.randint(0, 2, (512,)))
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    engine = PrivacyEngine(accountant="last_iterate")
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
        data_loader=DataLoader(data, batch_size=32, shuffle=True),
        noise_multiplier=1.0, max_grad_norm=1.0, poisson_sampling=False,
    )
    warm = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warm, max(0.0, (steps - s) / (steps - warm))))
    monitor = None
    if monitored:
        monitor = PrivacyMonitor(engine, delta=1e-5, heuristic_every=1, weighted_every=1,
                                 standard_every=1, flush_every=1).attach(optimizer, model)
    loss_fn = nn.CrossEntropyLoss()
    times: list[float] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        while len(times) < steps:
            for x, y in loader:
                if len(times) >= steps:
                    break
                t = time.thread_time()
                optimizer.zero_grad(set_to_none=True)
                loss_fn(model(x), y).backward()
                optimizer.step()
                schedule.step()
                times.append(time.thread_time() - t)
    if monitor is not None:
        assert monitor.last_record is not None and monitor.last_record.step == steps
    return times


def test_standard_epsilon_every_step_builds_the_one_step_pld_once(monkeypatch):
    calls = record_pmf_builds(monkeypatch)
    pld_composition.clear_kept_compositions()
    _train(30, monitored=True)
    assert len(calls) == 1  # one (sigma, q) for the whole run, not one build per step


@pytest.mark.slow
def test_monitor_cost_per_step_does_not_grow_like_the_step_number():
    without = _train(300, monitored=False)
    with_monitor = _train(300, monitored=True)
    cost = [a - b for a, b in zip(with_monitor, without)]
    middle, late = sum(cost[100:200]) / 100, sum(cost[200:300]) / 100
    # O(T) per step would make the late third cost 250/150 = 1.67 times the middle one;
    # the standard PLD's window grows like sqrt(T) (about 1.3 times), plus timing noise.
    assert late <= 1.5 * middle + 2e-3, (middle, late)
