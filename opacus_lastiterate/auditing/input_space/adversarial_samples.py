"""Crafted adversarial samples: an input whose loss separates models trained with / without
the canary (``docs/input_audits.md``, "Crafted adversarial samples").

Reconstructed from Yoon, Jeung, No, *Adversarial Sample-Based Approach for Tighter Privacy
Auditing in Final Model-Only Scenarios* (arXiv 2412.01756). Given the canary (x_c, y_c) and
two populations of final models, M_i trained on D' = D + canary ("in") and M'_j trained on D
("out"), a separate input x_a (label y_c) starts at x_c and descends an objective of the
per-model losses l_i = loss(M_i(x_a), y_c) and l'_j = loss(M'_j(x_a), y_c):

* uniform expansion (:func:`uniform_expansion_objective`): ``mean_i l_i - mean_j l'_j``,
  every model pulled with the same weight, wherever its loss lies;
* adaptive expansion (:func:`adaptive_expansion_objective`):
  ``mean_i relu(l_i - mean(l') + m) + mean_j relu(mean(l) - l'_j + m)`` with margin m
  (0.4 by default) and the population means held fixed: an in-model stops pulling once its
  loss is m below the out-models' mean, an out-model once its loss is m above the
  in-models' mean, so only the overlapping parts of the two distributions move.

Three further objectives are those of the public code of Yoon et al. (which names neither
"uniform" nor "adaptive" and has no margin): ``"subtract"`` (the sum over paired in/out
models of l_i - l'_i; models paired in order, the longer population truncated),
``"fisher"`` (minus (mean l - mean l')^2 / (var l + var l')) and ``"bhattacharyya"`` (minus
the Bhattacharyya distance of two Gaussians fitted to the two loss populations); variances
are the unbiased ones, as there.

The crafted sample is then scored on *other* models (:mod:`~opacus_lastiterate.auditing.input_space.audit` checks that the
crafting and evaluation runs are disjoint), so the audit's confidence stays honest.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch import nn

from opacus_lastiterate.analysis._validation import check_in_interval, check_int, check_positive
from opacus_lastiterate.analysis.audit import ScoreAudit
from opacus_lastiterate.auditing.input_space.canaries import (
    InputCanary,
    ScoreStatistic,
    _check_statistic,
    _on_model,
    sample_scores,
)

__all__ = [
    "CRAFTING_OBJECTIVES",
    "CraftedSample",
    "craft_adversarial_sample",
]

CraftingObjective = Literal["uniform", "adaptive", "subtract", "fisher", "bhattacharyya"]
CRAFTING_OBJECTIVES: tuple[str, ...] = ("uniform", "adaptive")
#: The objectives of Yoon et al.'s public code (module docstring).
PUBLISHED_CRAFTING_OBJECTIVES: tuple[str, ...] = ("subtract", "fisher", "bhattacharyya")
ALL_CRAFTING_OBJECTIVES: tuple[str, ...] = CRAFTING_OBJECTIVES + PUBLISHED_CRAFTING_OBJECTIVES
#: Margin of the adaptive objective, in loss units (the value the paper reports using).
DEFAULT_MARGIN = 0.4


def _check_losses(in_losses: torch.Tensor, out_losses: torch.Tensor) -> None:
    for name, t in (("in_losses", in_losses), ("out_losses", out_losses)):
        if not isinstance(t, torch.Tensor) or t.ndim != 1 or t.numel() == 0:
            raise ValueError(f"`{name}` must be a non-empty 1-D tensor.")


def uniform_expansion_objective(in_losses: torch.Tensor, out_losses: torch.Tensor) -> torch.Tensor:
    """``mean(in_losses) - mean(out_losses)`` (to be minimised).

    Its gradient is ``1 / n_in`` on every in-loss and ``-1 / n_out`` on every out-loss:
    the two populations are pushed apart uniformly, including where they already separate.
    """
    _check_losses(in_losses, out_losses)
    return in_losses.mean() - out_losses.mean()


def adaptive_expansion_objective(
    in_losses: torch.Tensor, out_losses: torch.Tensor, margin: float = DEFAULT_MARGIN
) -> torch.Tensor:
    """Hinge objective acting only where the two loss populations overlap (minimised).

    ``mean_i relu(l_i - mean(l') + m) + mean_j relu(mean(l) - l'_j + m)``; both means are
    detached (reference points, not optimised). Zero, with zero gradient, once every
    in-loss is at least m below the out-mean and every out-loss m above the in-mean.
    """
    _check_losses(in_losses, out_losses)
    m = check_positive("margin", margin)
    out_mean = out_losses.mean().detach()
    in_mean = in_losses.mean().detach()
    return (
        torch.relu(in_losses - out_mean + m).mean() + torch.relu(in_mean - out_losses + m).mean()
    )


def published_objective(
    name: str, in_losses: torch.Tensor, out_losses: torch.Tensor
) -> torch.Tensor:
    """``"subtract"``, ``"fisher"`` or ``"bhattacharyya"`` of the module docstring (minimised)."""
    _check_losses(in_losses, out_losses)
    if name == "subtract":
        k = min(in_losses.numel(), out_losses.numel())
        return (in_losses[:k] - out_losses[:k]).sum()
    if in_losses.numel() < 2 or out_losses.numel() < 2:
        raise ValueError(f"the {name!r} objective needs at least 2 losses per population.")
    mi, vi = in_losses.mean(), in_losses.var()
    mo, vo = out_losses.mean(), out_losses.var()
    if name == "fisher":
        return -((mi - mo) ** 2 / (vi + vo + 1e-8))
    if name == "bhattacharyya":
        return -(0.25 * torch.log(0.25 * (vi / vo + vo / vi + 2.0))
                 + 0.25 * (mi - mo) ** 2 / (vi + vo))
    raise ValueError(f"`name` must be one of {PUBLISHED_CRAFTING_OBJECTIVES}, got {name!r}.")


class ModelPopulation:
    """Many models of one architecture evaluated together on one input.

    Uses ``torch.func.stack_module_state`` and ``vmap`` (one batched call per input) when the
    models share their parameter names and shapes, and a loop otherwise. The models are put
    in eval mode (as the scorer does); their parameters are not trained.
    """

    def __init__(self, models: Sequence[nn.Module]) -> None:
        models = list(models)
        if not models or not all(isinstance(m, nn.Module) for m in models):
            raise ValueError("`models` must be a non-empty sequence of torch.nn.Module.")
        self.size = len(models)
        self._models = [m.eval() for m in models]
        self._batched: Callable[[torch.Tensor], torch.Tensor] | None = None
        try:
            self._batched = self._stack(self._models)
        except (RuntimeError, ValueError):  # different architectures: loop
            self._batched = None

    @staticmethod
    def _stack(models: list[nn.Module]) -> Callable[[torch.Tensor], torch.Tensor]:
        from torch.func import functional_call, stack_module_state

        if len({type(m) for m in models}) != 1:
            raise ValueError("models of different types")
        params, buffers = stack_module_state(models)  # type: ignore[arg-type]
        params = {k: v.detach() for k, v in params.items()}
        base = copy.deepcopy(models[0]).to("meta").eval()

        def one(
            p: dict[str, torch.Tensor], b: dict[str, torch.Tensor], x: torch.Tensor
        ) -> torch.Tensor:
            return functional_call(base, (p, b), (x,))

        batched = torch.vmap(one, in_dims=(0, 0, None))

        def call(x: torch.Tensor) -> torch.Tensor:
            return batched(params, buffers, x)

        return call

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """``(models, batch, classes)`` outputs of every model on the batch ``x``."""
        if self._batched is not None:
            return self._batched(x)
        return torch.stack([m(x) for m in self._models])

    def scores(self, sample: torch.Tensor, label: int, statistic: ScoreStatistic) -> torch.Tensor:
        """Score of every model on one example (differentiable in ``sample``)."""
        logits = self.logits(sample[None])[:, 0]
        labels = torch.full((self.size,), label, dtype=torch.int64, device=logits.device)
        return sample_scores(logits, labels, statistic)


@dataclass(frozen=True)
class CraftedSample:
    """A crafted adversarial sample and how it was found.

    Attributes:
        sample: the crafted input with the canary's label (``kind="crafted"``).
        canary: the canary it started from.
        objective: ``"uniform"`` or ``"adaptive"``.
        selected_step: the optimisation step whose iterate was kept (0 = the canary).
        objective_history: the objective on the fitting models at every step.
        validation_auroc: AUROC of the iterates' scores on the validation models, per step
            (empty without validation models).
        num_in, num_out: crafting models used (fitting and validation together).
    """

    sample: InputCanary
    canary: InputCanary
    objective: CraftingObjective
    selected_step: int
    objective_history: tuple[float, ...] = field(repr=False)
    validation_auroc: tuple[float, ...] = field(repr=False)
    num_in: int
    num_out: int


def _split(n: int, fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Indices (fit, validation) of ``n`` models; at least one of each if validating."""
    order = rng.permutation(n)
    k = 0 if fraction == 0.0 else min(n - 1, max(1, round(fraction * n)))
    return np.sort(order[k:]), np.sort(order[:k])


def craft_adversarial_sample(
    canary: InputCanary,
    in_models: Sequence[nn.Module],
    out_models: Sequence[nn.Module],
    *,
    objective: CraftingObjective = "adaptive",
    margin: float = DEFAULT_MARGIN,
    statistic: ScoreStatistic = "loss",
    steps: int = 100,
    learning_rate: float = 0.01,
    bounds: tuple[float, float] | None = None,
    radius: float | None = None,
    validation_fraction: float = 0.25,
    seed: int = 0,
) -> CraftedSample:
    """Optimise an input x_a (label y_c, started at x_c) to separate the two populations.

    Args:
        canary: the canary (x_c, y_c).
        in_models: final models trained with the canary (crafting runs, never the ones
            that will be evaluated).
        out_models: final models trained without it.
        objective: ``"adaptive"`` (default), ``"uniform"``, or one of the published code's
            ``"subtract"``, ``"fisher"``, ``"bhattacharyya"``; see the module docstring.
        margin: margin m of the adaptive objective, in units of the loss.
        statistic: the per-model loss is minus this score: ``"loss"`` (cross-entropy) or
            ``"margin"`` (minus the logit margin); use the statistic the audit will score.
        steps: Adam steps on x_a.
        learning_rate: Adam's step size.
        bounds: ``(low, high)``: x_a is clipped into this box after every step (e.g. the
            pixel range), or None.
        radius: x_a is kept within this L-infinity distance of x_c, or None.
        validation_fraction: share of each population held out of the objective; the kept
            iterate (the canary itself included, as step 0) is the one with the highest
            validation AUROC, the earliest on ties. 0: keep the last iterate.
        seed: seed of the fit / validation split.
    """
    if not isinstance(canary, InputCanary):
        raise TypeError(f"`canary` must be an InputCanary, got {type(canary).__name__}.")
    if objective not in ALL_CRAFTING_OBJECTIVES:
        raise ValueError(
            f"`objective` must be one of {ALL_CRAFTING_OBJECTIVES}, got {objective!r}."
        )
    check_positive("margin", margin)
    _check_statistic(statistic)
    n_steps = check_int("steps", steps)
    check_positive("learning_rate", learning_rate)
    if bounds is not None:
        if len(bounds) != 2 or not float(bounds[0]) < float(bounds[1]):
            raise ValueError(f"`bounds` must be (low, high) with low < high, got {bounds!r}.")
    if radius is not None:
        check_positive("radius", radius)
    frac = check_in_interval("validation_fraction", validation_fraction, 0.0, 1.0, low_open=False)
    rng = np.random.default_rng(check_int("seed", seed))
    ins, outs = list(in_models), list(out_models)
    if len(ins) < 1 or len(outs) < 1:
        raise ValueError(
            f"`in_models` and `out_models` must be non-empty, got {len(ins)} and {len(outs)}."
        )
    if frac > 0.0 and (len(ins) < 2 or len(outs) < 2):
        raise ValueError("validation needs at least 2 in-models and 2 out-models.")
    fit_in, val_in = _split(len(ins), frac, rng)
    fit_out, val_out = _split(len(outs), frac, rng)
    pops = {
        name: ModelPopulation([models[i] for i in idx])
        for name, models, idx in (
            ("fit_in", ins, fit_in),
            ("fit_out", outs, fit_out),
            ("val_in", ins, val_in),
            ("val_out", outs, val_out),
        )
        if idx.size
    }
    validating = "val_in" in pops

    def validation_auroc(x: torch.Tensor) -> float:
        with torch.no_grad():
            a = pops["val_in"].scores(x, canary.label, statistic)
            b = pops["val_out"].scores(x, canary.label, statistic)
        return ScoreAudit(a.double().numpy(), b.double().numpy()).auroc()

    start = _on_model(canary.features, ins[0])
    x = start.clone().requires_grad_(True)
    optimiser = torch.optim.Adam([x], lr=float(learning_rate))
    history: list[float] = []
    aurocs: list[float] = [validation_auroc(x.detach())] if validating else []
    best, best_step = x.detach().clone(), 0
    low = None if radius is None else start - float(radius)
    high = None if radius is None else start + float(radius)
    for step in range(1, n_steps + 1):
        in_losses = -pops["fit_in"].scores(x, canary.label, statistic)
        out_losses = -pops["fit_out"].scores(x, canary.label, statistic)
        if objective == "uniform":
            loss = uniform_expansion_objective(in_losses, out_losses)
        elif objective in PUBLISHED_CRAFTING_OBJECTIVES:
            loss = published_objective(objective, in_losses, out_losses)
        else:
            loss = adaptive_expansion_objective(in_losses, out_losses, margin)
        history.append(float(loss.detach()))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        with torch.no_grad():
            if low is not None and high is not None:
                x.copy_(torch.maximum(torch.minimum(x, high), low))
            if bounds is not None:
                x.clamp_(float(bounds[0]), float(bounds[1]))
        if validating:
            aurocs.append(validation_auroc(x.detach()))
            if aurocs[-1] > aurocs[best_step]:
                best, best_step = x.detach().clone(), step
    if not validating:
        best, best_step = x.detach().clone(), n_steps
    return CraftedSample(
        sample=canary.with_features(best.cpu(), "crafted"),
        canary=canary,
        objective=objective,
        selected_step=best_step,
        objective_history=tuple(history),
        validation_auroc=tuple(aurocs),
        num_in=len(ins),
        num_out=len(outs),
    )
