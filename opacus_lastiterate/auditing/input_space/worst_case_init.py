"""Worst-case initialisation: model parameters chosen so that the canary's gradient stays large
while every clean example's is small (``docs/input_audits.md``, "Worst-case initialisation").

Following the idea of Annamalai, De Cristofaro, *Nearly Tight Black-Box Auditing of
Differentially Private Machine Learning* (arXiv 2405.14106): pre-train the initial parameters
on data the auditor may use (disjoint from D) so that clean examples barely move the model
during DP-SGD, and the canary's clipped gradient is what moves it. Our objective, minimised
by full-batch Adam from the given (random) initialisation, is

    mean_i CE(f(x_i), y_i) + weight * relu(C - ||grad_theta CE(f(x_c), y_c)||),

the second term pushing the canary's per-example gradient norm up to the clipping norm C (a
larger norm is clipped to C anyway). This is an *option* for audits; the default everywhere
is a plain random initialisation.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from opacus_lastiterate.analysis._validation import check_in_interval, check_int, check_positive
from opacus_lastiterate.auditing.input_space.canaries import InputCanary

__all__ = []


def canary_gradient_norm(
    model: nn.Module, canary: InputCanary, *, create_graph: bool = False
) -> torch.Tensor:
    """``||grad_theta CE(model(x_c), y_c)||``, the canary's gradient norm before clipping."""
    params = [p for p in model.parameters() if p.requires_grad]
    x, y = canary.batch(next(iter(params)).device if params else None)
    loss = nn.functional.cross_entropy(model(x), y)
    grads = torch.autograd.grad(loss, params, create_graph=create_graph)
    return torch.sqrt(sum((g * g).sum() for g in grads))  # type: ignore[arg-type]


def worst_case_initialisation(
    model: nn.Module,
    features: Any,
    labels: Any,
    canary: InputCanary,
    *,
    clipping_norm: float,
    steps: int = 300,
    learning_rate: float = 0.01,
    weight: float = 1.0,
) -> nn.Module:
    """A copy of ``model`` pre-trained into a worst-case initialisation (module docstring).

    Args:
        model: the random initialisation to start from (not modified).
        features, labels: clean examples the auditor may use, *not* D.
        canary: the canary whose gradient must stay large.
        clipping_norm: C of the DP-SGD run to come.
        steps: full-batch Adam steps.
        learning_rate: Adam's step size.
        weight: weight of the canary's gradient-norm hinge (0: plain pre-training on the
            clean examples, the canary's gradient left as it comes).
    """
    if not isinstance(canary, InputCanary):
        raise TypeError(f"`canary` must be an InputCanary, got {type(canary).__name__}.")
    c = check_positive("clipping_norm", clipping_norm)
    n_steps = check_int("steps", steps)
    check_positive("learning_rate", learning_rate)
    w = check_in_interval("weight", weight, 0.0, float("inf"), low_open=False)
    x = torch.as_tensor(features, dtype=torch.float32)
    y = torch.as_tensor(labels, dtype=torch.int64)
    if x.shape[0] != y.shape[0] or y.ndim != 1 or y.numel() == 0:
        raise ValueError(
            "`features` must have shape (n, ...) and `labels` shape (n,) with n >= 1, got "
            f"{tuple(x.shape)} and {tuple(y.shape)}."
        )
    out = copy.deepcopy(model).train()
    optimiser = torch.optim.Adam(out.parameters(), lr=float(learning_rate))
    for _ in range(n_steps):
        clean = nn.functional.cross_entropy(out(x), y)
        loss = clean
        if w > 0.0:
            loss = clean + w * torch.relu(c - canary_gradient_norm(out, canary, create_graph=True))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return out
