"""``opacus-lastiterate epsilon --optimizer adamw ...``: the adaptive heuristic of an AdamW run
with a cosine schedule, against a numpy AdamW with the second moment frozen driven by unit
impulses (learning rates from torch's own CosineAnnealingLR); usage errors name the option."""

from __future__ import annotations

import json

import pytest
import torch

from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.cli import main
from tests.analysis._reference import frozen_adamw_weights

T, Q, SIGMA, DELTA = 40, 0.05, 1.0, 1e-5


def _torch_cosine(steps: int, base: float) -> list[float]:
    param = torch.nn.Parameter(torch.zeros(()))
    opt = torch.optim.SGD([param], lr=base)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    rates = []
    for _ in range(steps):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return rates


def test_adamw_cosine_matches_a_numpy_adamw(capsys: pytest.CaptureFixture[str]) -> None:
    lr, b1, b2, eps, wd, std = 0.05, 0.8, 0.95, 0.01, 2.0, 0.02
    argv = ["epsilon", "--steps", str(T), "--sample-rate", str(Q), "--noise-multiplier",
            str(SIGMA), "--delta", str(DELTA), "--lr-schedule", "cosine", "--optimizer", "adamw",
            "--lr", str(lr), "--beta1", str(b1), "--beta2", str(b2), "--adam-eps", str(eps),
            "--weight-decay", str(wd), "--noise-std", str(std), "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    w = frozen_adamw_weights(_torch_cosine(T, lr), beta1=b1, beta2=b2, eps=eps, weight_decay=wd,
                             noise_std=std)
    run = DPSGDRun.from_history([(SIGMA, Q, T)], weights=w)
    expected = privacy_model("heuristic", run).epsilon(DELTA)
    assert out["weighted_heuristic"] == pytest.approx(expected, rel=2e-3)
    assert "adaptive second moment treated as fixed" in out["labels"]["weighted_heuristic"]
    assert out["optimizer"]["name"] == "adamw" and out["optimizer"]["weight_decay"] == wd
    # the decay matters at this lr x weight_decay: without it the number differs
    w0 = frozen_adamw_weights(_torch_cosine(T, lr), beta1=b1, beta2=b2, eps=eps, noise_std=std)
    other = privacy_model("heuristic", DPSGDRun.from_history([(SIGMA, Q, T)], weights=w0))
    assert abs(other.epsilon(DELTA) - expected) > 1e-2 * expected


@pytest.mark.parametrize("extra, message", [
    (["--weight-decay", "0.1"], "--weight-decay: options of an adaptive optimizer"),
    (["--optimizer", "adam", "--momentum", "0.9"], "--momentum, --dampening and --nesterov"),
    (["--optimizer", "adam", "--beta2", "1.5"], "beta2"),
    (["--optimizer", "adagrad", "--beta1", "0.5"], "not options of adagrad"),
])
def test_bad_optimizer_options_are_usage_errors(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["epsilon", "--steps", "10", "--sample-rate", "0.1", "--noise-multiplier", "1",
            "--delta", "1e-5", *extra]
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


def test_the_table_prints_the_adaptive_label_beside_the_adamw_heuristic(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The text table: the weighted row of an AdamW run is labelled as the adaptive heuristic
    (and its value is the one --json gives); the constant-rate rows keep their own labels."""
    argv = ["epsilon", "--steps", str(T), "--sample-rate", str(Q), "--noise-multiplier",
            str(SIGMA), "--delta", str(DELTA), "--lr-schedule", "cosine", "--optimizer", "adamw",
            "--weight-decay", "0.1"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    weighted = [line for line in lines if line.strip().startswith("weighted")]
    assert len(weighted) == 1
    assert "heuristic; adaptive second moment treated as fixed" in weighted[0]
    assert "optimizer adamw" in weighted[0]
    assert main([*argv, "--json"]) == 0
    value = json.loads(capsys.readouterr().out)["weighted_heuristic"]
    assert f"{value:10.4f}" in weighted[0]
    plain = [line for line in lines if line.strip().startswith("heuristic ")]
    assert len(plain) == 1 and "adaptive second moment" not in plain[0]


def test_target_epsilon_with_adamw_calibrates_the_adaptive_heuristic(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--target-epsilon --optimizer adamw --lr-schedule cosine``: the sigma printed, fed to the
    from-scratch heuristic with the numpy AdamW's weights (C / B = 1: noise std sigma), meets
    the target within 3e-3 relative (kept engine and from-scratch model each within 1e-3,
    sigma to 1e-4); the table labels it as the adaptive heuristic."""
    lr, wd = 0.05, 2.0
    argv = ["epsilon", "--steps", str(T), "--sample-rate", str(Q), "--delta", str(DELTA),
            "--target-epsilon", "2", "--lr-schedule", "cosine", "--optimizer", "adamw",
            "--lr", str(lr), "--weight-decay", str(wd)]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (row,) = out["calibrations"]
    sigma = row["noise_multiplier"]
    w = frozen_adamw_weights(_torch_cosine(T, lr), weight_decay=wd, noise_std=sigma)
    run = DPSGDRun.from_history([(sigma, Q, T)], weights=w)
    assert privacy_model("heuristic", run).epsilon(DELTA) == pytest.approx(2.0, rel=3e-3)
    assert "adaptive second moment treated as fixed" in out["labels"]["heuristic"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert f"sigma = {sigma:10.4f}" in text and "adaptive second moment treated as fixed" in text
    with pytest.raises(SystemExit) as stop:
        main([*argv, "--noise-std", "0.1"])
    assert stop.value.code == 2 and "--noise-std" in capsys.readouterr().err
