"""BatchedDPGD trains the same mechanism as the Opacus trainer (checked against Opacus)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opacus_lastiterate.auditing import OpacusInputTrainer, blank_canary
from opacus_lastiterate.auditing.input_space.batched_training import BatchedDPGD


@pytest.mark.parametrize("reduction,init", [("sum", "pretrained"), ("mean", "random")])
def test_noiseless_runs_match_opacus(reduction: str, init: str) -> None:
    # With negligible noise both trainers are deterministic full-batch clipped GD: the final
    # parameters must agree with Opacus's per-sample clipping to float precision, in both
    # worlds, while the two worlds differ by far more.
    trainer = OpacusInputTrainer(
        canary=blank_canary((64,), 9), hidden=8, steps=5, num_examples=60,
        noise_multiplier=1e-9, learning_rate=0.05 if reduction == "sum" else 2.0,
        reduction=reduction, initialisation=init, init_examples=50, init_steps=20,  # type: ignore[arg-type]
    )
    batched = BatchedDPGD(trainer, dtype=torch.float64)(np.array([True, False]), 0)
    flat = batched.flat()
    assert float((flat[0] - flat[1]).abs().max()) > 1e-2
    for j, include in enumerate((True, False)):
        model = trainer(include, 3)
        got = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
        assert torch.allclose(got, flat[j], atol=1e-5), float((got - flat[j]).abs().max())


def test_noise_has_the_mechanism_scale() -> None:
    # Linear model, blank canary: the bias moves by lr * (clipped sum + N(0, sigma^2 C^2));
    # with many runs the spread of the final bias around its mean is lr sigma C sqrt(T).
    trainer = OpacusInputTrainer(
        canary=blank_canary((64,), 9), steps=4, num_examples=30, noise_multiplier=3.0,
        learning_rate=1e-4, reduction="sum",
    )
    runs = BatchedDPGD(trainer, linear=True, dtype=torch.float64)(np.zeros(400, bool), 1)
    sd = float(runs.b2[:, 0].std())
    want = 1e-4 * 3.0 * 1.0 * 2.0
    # the sample sd of 400 normals is within 4 standard errors (sd / sqrt(2 * 399))
    assert abs(sd - want) < 4 * want / np.sqrt(798)


def test_runs_do_not_depend_on_chunking() -> None:
    trainer = OpacusInputTrainer(canary=blank_canary((64,), 9), hidden=4, steps=3,
                                 num_examples=20, reduction="sum", learning_rate=0.01)
    inc = np.array([True, False, True, False, True])
    a = BatchedDPGD(trainer, chunk=2)(inc, 5).flat()
    b = BatchedDPGD(trainer, chunk=5)(inc, 5).flat()
    assert torch.allclose(a, b, atol=1e-6)


def test_bad_trainer() -> None:
    t = OpacusInputTrainer(canary=blank_canary((64,), 9), batch_size=7, num_examples=20)
    with pytest.raises(ValueError, match="batch_size"):
        BatchedDPGD(t)
