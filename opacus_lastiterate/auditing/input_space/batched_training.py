"""Many full-batch DP-GD runs at once, for input-space audits that need thousands of models.

:class:`BatchedDPGD` trains R runs of the digits MLP (or the linear model, ``hidden=0``) of
:class:`~opacus_lastiterate.auditing.input_space.training.OpacusInputTrainer` together, with
the same mechanism as that trainer with ``batch_size=None`` (full batch, q = 1): every step,
the per-example gradients of the cross-entropy are clipped to C, summed, Gaussian noise of
standard deviation sigma C is added, the sum is divided by the trainer's divisor (1 for
``reduction="sum"``, the size of D for ``"mean"``) and SGD takes a step. The per-example
gradients of a one-hidden-layer network are written out by hand (backpropagation of one
example is two outer products), so no per-example autograd is needed and all runs share
one batched matrix product per layer. ``tests/auditing/input_space/test_batched_training.py``
checks the final parameters against Opacus itself.

Runs ``include[r] = True`` train on D' = D + canary. The noise of run r is drawn from a
generator seeded by ``(seed, r)``, so a run's model does not depend on the chunking.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from opacus_lastiterate.analysis._validation import check_int
from opacus_lastiterate.auditing.input_space.canaries import InputCanary
from opacus_lastiterate.auditing.input_space.training import OpacusInputTrainer
from opacus_lastiterate.auditing.input_space.worst_case_init import worst_case_initialisation
from opacus_lastiterate.auditing.opacus_training import digits_arrays

__all__ = [
    "BatchedDPGD",
]


@dataclass(frozen=True)
class BatchedModels:
    """Final parameters of R runs: ``w1 (R, h, 64), b1 (R, h), w2 (R, 10, h), b2 (R, 10)``
    (``w1``/``b1`` empty and ``w2 (R, 10, 64)`` for the linear model) and the coins."""

    w1: torch.Tensor
    b1: torch.Tensor
    w2: torch.Tensor
    b2: torch.Tensor
    include: np.ndarray

    @property
    def linear(self) -> bool:
        return self.w1.numel() == 0

    def __len__(self) -> int:
        return int(self.include.size)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """``(R, n, 10)`` outputs of every run on inputs ``x (n, 64)``."""
        x = x.to(self.w2.dtype)
        h = x[None].expand(len(self), -1, -1) if self.linear else torch.relu(
            torch.einsum("nd,rhd->rnh", x, self.w1) + self.b1[:, None, :]
        )
        return torch.einsum("rnh,rkh->rnk", h, self.w2) + self.b2[:, None, :]

    def loss_scores(self, sample: InputCanary) -> np.ndarray:
        """Minus the cross-entropy of every run on ``sample`` (the black-box score)."""
        with torch.no_grad():
            z = self.logits(sample.features.reshape(1, -1))[:, 0]
            return (-nn.functional.cross_entropy(
                z, torch.full((len(self),), sample.label), reduction="none"
            )).double().numpy()

    def flat(self) -> torch.Tensor:
        """``(R, P)`` all parameters of every run, in a fixed order."""
        return torch.cat([t.reshape(len(self), -1) for t in (self.w1, self.b1, self.w2, self.b2)], 1)

    def modules(self, index: Sequence[int] | np.ndarray) -> list[nn.Module]:
        """The runs ``index`` as ``nn.Sequential`` models (for crafting)."""
        out: list[nn.Module] = []
        for r in np.asarray(index, dtype=int):
            if self.linear:
                m = nn.Sequential(nn.Linear(64, 10))
                m[0].weight.data, m[0].bias.data = self.w2[r].float().clone(), self.b2[r].float().clone()
            else:
                h = self.w1.shape[1]
                m = nn.Sequential(nn.Linear(64, h), nn.ReLU(), nn.Linear(h, 10))
                m[0].weight.data, m[0].bias.data = self.w1[r].float().clone(), self.b1[r].float().clone()
                m[2].weight.data, m[2].bias.data = self.w2[r].float().clone(), self.b2[r].float().clone()
            out.append(m.eval())
        return out


@dataclass(frozen=True)
class BatchedDPGD:
    """Full-batch DP-GD of ``trainer`` (``batch_size=None``, architecture ``"mlp"``), R runs
    at once (module docstring). ``hidden=0`` in the trainer is not allowed by it; use
    ``linear=True`` for the 64 -> 10 softmax regression from the trainer's first layer
    shapes' data and seeds.

    Attributes:
        trainer: the audited training (its data, canary, steps, sigma, C, learning rate,
            divisor and initial model).
        linear: train the linear model instead of the MLP (initialised by ``init_seed``).
        chunk: runs trained together (memory).
        dtype: ``torch.float32`` (default) or ``torch.float64``.
    """

    trainer: OpacusInputTrainer
    linear: bool = False
    chunk: int = 512
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        if not isinstance(self.trainer, OpacusInputTrainer):
            raise TypeError(f"`trainer` must be an OpacusInputTrainer, got {type(self.trainer).__name__}.")
        if self.trainer.batch_size is not None:
            raise ValueError("`trainer.batch_size` must be None (full batch) for BatchedDPGD.")
        if self.trainer.architecture != "mlp":
            raise ValueError(f"`trainer.architecture` must be 'mlp', got {self.trainer.architecture!r}.")
        check_int("chunk", self.chunk, minimum=1)

    def initial(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(w1, b1, w2, b2)`` at initialisation (``w1``, ``b1`` empty for the linear model)."""
        if self.linear:
            t = self.trainer
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(t.init_seed)
                lin: nn.Module = nn.Sequential(nn.Linear(64, 10))
            if t.initialisation != "random":  # pre-trained like the trainer's MLP
                x, y = digits_arrays()
                idx = t.init_indices()
                lin = worst_case_initialisation(
                    lin, torch.from_numpy(x[idx]), torch.from_numpy(y[idx]), t.canary,
                    clipping_norm=t.max_grad_norm, steps=t.init_steps,
                    weight=1.0 if t.initialisation == "worst-case" else 0.0,
                )
            e = torch.zeros(0)
            w, b = (p.detach() for p in lin.parameters())
            return e, e, w, b
        w1, b1, w2, b2 = (p.detach() for p in self.trainer.initial_model().parameters())
        return w1, b1, w2, b2

    def divisor(self) -> float:
        return float(self.trainer.expected_batch_size) if self.trainer.reduction == "mean" else 1.0

    def __call__(self, include: Sequence[bool] | np.ndarray, seed: int) -> BatchedModels:
        """Train ``len(include)`` runs; run r on D' iff ``include[r]``; noise seeded by
        ``(seed, r)``."""
        inc = np.asarray(include, dtype=bool)
        if inc.ndim != 1 or inc.size == 0:
            raise ValueError("`include` must be a non-empty 1-D sequence of bools.")
        s = check_int("seed", seed)
        parts = [self._train(inc[i : i + self.chunk], s, i) for i in range(0, inc.size, self.chunk)]
        w1, b1, w2, b2 = (torch.cat([p[k] for p in parts]) for k in range(4))
        return BatchedModels(w1, b1, w2, b2, inc)

    def _train(self, inc: np.ndarray, seed: int, first: int) -> tuple[torch.Tensor, ...]:
        t, dt = self.trainer, self.dtype
        x_all, y_all = digits_arrays()
        idx = t.training_indices()
        x = torch.from_numpy(x_all[idx]).to(dt)
        y = nn.functional.one_hot(torch.from_numpy(y_all[idx]).long(), 10).to(dt)
        xc = t.canary.features.reshape(1, -1).to(dt)
        yc = nn.functional.one_hot(torch.tensor([t.canary.label]), 10).to(dt)
        r = inc.size
        mask = torch.from_numpy(inc).to(dt)  # canary's weight per run
        init = self.initial()
        w1, b1, w2, b2 = (p.to(dt)[None].repeat(r, *([1] * p.ndim)) for p in init)
        gens = [torch.Generator().manual_seed(int(np.random.SeedSequence([seed, first + j])
                                                  .generate_state(1)[0])) for j in range(r)]
        c, sigma, lr, div = t.max_grad_norm, t.noise_multiplier, t.learning_rate, self.divisor()
        xsq, xcsq = (x * x).sum(1) + 1.0, float((xc * xc).sum()) + 1.0
        for _ in range(t.steps):
            grads = [torch.zeros_like(p) for p in (w1, b1, w2, b2)]
            for xs, ys, sq, weight in ((x, y, xsq, None), (xc, yc, torch.tensor([xcsq], dtype=dt), mask)):
                if self.linear:
                    z = torch.einsum("nd,rkd->rnk", xs, w2) + b2[:, None]
                    d2 = torch.softmax(z, -1) - ys[None]
                    norm = torch.sqrt((d2 * d2).sum(-1) * sq[None])
                    f = torch.clamp(c / (norm + 1e-12), max=1.0)
                    if weight is not None:
                        f = f * weight[:, None]
                    d2 = d2 * f[..., None]
                    grads[2] += torch.einsum("rnk,nd->rkd", d2, xs)
                    grads[3] += d2.sum(1)
                    continue
                z1 = torch.einsum("nd,rhd->rnh", xs, w1) + b1[:, None]
                h = torch.relu(z1)
                z2 = torch.einsum("rnh,rkh->rnk", h, w2) + b2[:, None]
                d2 = torch.softmax(z2, -1) - ys[None]
                d1 = torch.einsum("rnk,rkh->rnh", d2, w2) * (z1 > 0).to(dt)
                norm = torch.sqrt((d2 * d2).sum(-1) * ((h * h).sum(-1) + 1.0)
                                  + (d1 * d1).sum(-1) * sq[None])
                f = torch.clamp(c / (norm + 1e-12), max=1.0)
                if weight is not None:
                    f = f * weight[:, None]
                d2, d1 = d2 * f[..., None], d1 * f[..., None]
                grads[0] += torch.einsum("rnh,nd->rhd", d1, xs)
                grads[1] += d1.sum(1)
                grads[2] += torch.einsum("rnk,rnh->rkh", d2, h)
                grads[3] += d2.sum(1)
            params = (w1, b1, w2, b2)
            for k in (range(2, 4) if self.linear else range(4)):
                noise = torch.stack([
                    torch.randn(params[k].shape[1:], generator=g, dtype=torch.float64)
                    for g in gens
                ]).to(dt)
                params[k].sub_(lr * (grads[k] + sigma * c * noise) / div)
        return w1, b1, w2, b2
