"""The crafting objectives do what they claim, on synthetic loss populations and models."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from opacus_lastiterate.analysis.audit import ScoreAudit
from opacus_lastiterate.auditing import InputCanary, InputScore, craft_adversarial_sample
from opacus_lastiterate.auditing.input_space.adversarial_samples import (
    ModelPopulation,
    adaptive_expansion_objective,
    uniform_expansion_objective,
)


def _grads(objective, in_losses: np.ndarray, out_losses: np.ndarray, **kw):
    a = torch.tensor(in_losses, requires_grad=True)
    b = torch.tensor(out_losses, requires_grad=True)
    value = objective(a, b, **kw)
    value.backward()
    return float(value.detach()), a.grad.numpy(), b.grad.numpy()


def test_uniform_objective_pulls_every_model_equally() -> None:
    rng = np.random.default_rng(0)
    ins, outs = rng.normal(0.5, 0.3, 7), rng.normal(0.8, 0.3, 5)
    value, g_in, g_out = _grads(uniform_expansion_objective, ins, outs)
    assert value == pytest.approx(ins.mean() - outs.mean())
    np.testing.assert_allclose(g_in, np.full(7, 1 / 7))
    np.testing.assert_allclose(g_out, np.full(5, -1 / 5))
    # also on populations that already separate: it keeps pulling
    _, g_in, g_out = _grads(uniform_expansion_objective, ins - 10.0, outs + 10.0)
    assert np.all(g_in > 0) and np.all(g_out < 0)


def test_adaptive_objective_acts_only_on_the_overlap() -> None:
    rng = np.random.default_rng(1)
    ins, outs = rng.normal(0.5, 0.4, 40), rng.normal(0.9, 0.4, 30)
    m = 0.4
    value, g_in, g_out = _grads(adaptive_expansion_objective, ins, outs, margin=m)
    # independent numpy version of the formula
    active_in = ins > outs.mean() - m
    active_out = outs < ins.mean() + m
    expected = (np.maximum(ins - outs.mean() + m, 0).mean()
                + np.maximum(ins.mean() - outs + m, 0).mean())
    assert value == pytest.approx(expected)
    np.testing.assert_allclose(g_in, active_in / 40.0)
    np.testing.assert_allclose(g_out, -(active_out / 30.0))
    assert 0 < active_in.sum() < 40 and 0 < active_out.sum() < 30  # some of each, not all
    # separated by more than the margin: nothing to do
    value, g_in, g_out = _grads(adaptive_expansion_objective, ins - 5.0, outs + 5.0, margin=m)
    assert value == 0.0 and not g_in.any() and not g_out.any()
    with pytest.raises(ValueError, match="margin"):
        adaptive_expansion_objective(torch.zeros(2), torch.zeros(2), margin=0.0)
    with pytest.raises(ValueError, match="in_losses"):
        uniform_expansion_objective(torch.zeros(0), torch.zeros(2))


def _descend(objective, ins: np.ndarray, outs: np.ndarray, steps: int, lr: float):
    """Gradient descent on the losses themselves (each loss a free parameter)."""
    a = torch.tensor(ins, requires_grad=True)
    b = torch.tensor(outs, requires_grad=True)
    for _ in range(steps):
        value = objective(a, b)
        a.grad = b.grad = None
        value.backward()
        with torch.no_grad():
            a -= lr * a.grad * a.numel()
            b -= lr * b.grad * b.numel()
    return a.detach().numpy(), b.detach().numpy()


def test_descent_on_synthetic_populations() -> None:
    rng = np.random.default_rng(2)
    ins, outs = rng.normal(1.0, 0.5, 200), rng.normal(1.3, 0.5, 200)
    auroc0 = ScoreAudit(-ins, -outs).auroc()
    # uniform: a rigid shift of each population, spread and overlap in rank terms unchanged
    u_in, u_out = _descend(uniform_expansion_objective, ins, outs, 50, 0.01)
    np.testing.assert_allclose(u_in - ins, -0.5)
    np.testing.assert_allclose(u_out - outs, 0.5)
    # adaptive: the overlap is removed, and losses that were already beyond the band
    # (mean of the other population -/+ margin) have not moved
    a_in, a_out = _descend(adaptive_expansion_objective, ins, outs, 400, 0.01)
    assert float(adaptive_expansion_objective(torch.tensor(a_in), torch.tensor(a_out))) < 1e-9
    assert ScoreAudit(-a_in, -a_out).auroc() == 1.0 > auroc0
    untouched_in = ins <= outs.mean() - 0.4
    untouched_out = outs >= ins.mean() + 0.4
    assert untouched_in.any() and untouched_out.any()
    np.testing.assert_array_equal(a_in[untouched_in], ins[untouched_in])
    np.testing.assert_array_equal(a_out[untouched_out], outs[untouched_out])
    # spread inside a population is not inflated: the in-losses only move down to the band
    assert a_in.max() <= a_out.mean() - 0.4 + 1e-6


# ------------------------------------------------------------------ crafting on synthetic models


def _models(n: int, shift: float, rng: np.random.Generator) -> list[nn.Module]:
    """Linear 4 -> 2 models: class-1 weight = shift * e_3 + noise, class 0 = noise.

    The "canary" moved the weight of the class-1 logit along coordinate 3 (which the start
    point of crafting does not use), so only an input with x_3 != 0 separates the worlds.
    """
    out = []
    for _ in range(n):
        m = nn.Linear(4, 2)
        w = rng.normal(0.0, 0.3, (2, 4))
        w[1, 3] += shift
        with torch.no_grad():
            m.weight.copy_(torch.tensor(w, dtype=torch.float32))
            m.bias.zero_()
        out.append(m)
    return out


def _held_out_auroc(sample: InputCanary, seed: int) -> float:
    rng = np.random.default_rng(seed)
    ins, outs = _models(300, 1.0, rng), _models(300, 0.0, rng)
    score = InputScore(sample)
    return ScoreAudit([score(m) for m in ins], [score(m) for m in outs]).auroc()


@pytest.mark.parametrize("objective", ["uniform", "adaptive"])
def test_crafting_finds_a_separating_input_that_generalises(objective: str) -> None:
    rng = np.random.default_rng(3)
    ins, outs = _models(60, 1.0, rng), _models(60, 0.0, rng)
    canary = InputCanary(torch.tensor([1.0, 0.0, 0.0, 0.0]), 1)
    crafted = craft_adversarial_sample(
        canary, ins, outs, objective=objective, steps=60, learning_rate=0.1,
        bounds=(-2.0, 2.0), validation_fraction=0.25,
    )
    x = crafted.sample.features
    assert crafted.sample.kind == "crafted" and crafted.sample.label == 1
    assert float(x.abs().max()) <= 2.0
    assert float(x[3]) > 0.5  # it found the coordinate the canary moved
    before, after = _held_out_auroc(canary, 10), _held_out_auroc(crafted.sample, 10)
    assert before < 0.6 and after > 0.75  # on fresh models, not the crafting ones
    assert crafted.validation_auroc[crafted.selected_step] == max(crafted.validation_auroc)
    assert crafted.num_in == 60 and len(crafted.objective_history) == 60


def test_crafting_options() -> None:
    rng = np.random.default_rng(4)
    ins, outs = _models(10, 1.0, rng), _models(10, 0.0, rng)
    canary = InputCanary(torch.tensor([1.0, 0.0, 0.0, 0.0]), 1)
    near = craft_adversarial_sample(canary, ins, outs, steps=30, learning_rate=0.5, radius=0.2,
                                    validation_fraction=0.0)
    assert near.selected_step == 30 and not near.validation_auroc
    assert float((near.sample.features - canary.features).abs().max()) <= 0.2 + 1e-6
    nothing = craft_adversarial_sample(canary, ins, outs, steps=0)
    assert nothing.selected_step == 0 and nothing.sample.features.equal(canary.features)
    with pytest.raises(ValueError, match="objective"):
        craft_adversarial_sample(canary, ins, outs, objective="both")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bounds"):
        craft_adversarial_sample(canary, ins, outs, bounds=(1.0, 0.0))
    with pytest.raises(ValueError, match="validation"):
        craft_adversarial_sample(canary, ins[:1], outs, validation_fraction=0.5)


def test_model_population_batched_equals_loop() -> None:
    rng = np.random.default_rng(5)
    models = _models(5, 0.5, rng)
    mlp = [nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)) for _ in range(3)]
    x = torch.tensor([[0.3, -1.0, 2.0, 0.5]])
    for group in (models, mlp):
        pop = ModelPopulation(group)
        assert pop._batched is not None
        torch.testing.assert_close(pop.logits(x), torch.stack([m(x) for m in group]))
    mixed = ModelPopulation([models[0], mlp[0]])  # different architectures: a loop
    assert mixed._batched is None
    torch.testing.assert_close(mixed.logits(x), torch.stack([models[0](x), mlp[0](x)]))
