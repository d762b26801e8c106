"""Opacus DP-SGD on scikit-learn's digits with an input canary, for input-space audits.

:class:`OpacusInputTrainer` is a ``train(include_canary, seed) -> model`` function for
:class:`~opacus_lastiterate.auditing.runner.AuditRunner`: a small MLP or CNN trained with
``PrivacyEngine(accountant="last_iterate")``, Poisson sampling, plain SGD and a fixed number
of steps on D (a subset of the 1797 digits, never containing the canary's input) or on
D' = D + the canary (any :class:`~opacus_lastiterate.auditing.input_space.canaries.InputCanary`).
Full batch (``batch_size=None``: q = 1) or minibatches (q = 1 / ceil(N / B)). The divisor
of the clipped sum is the expected batch size of D in both worlds, so D and D' differ by
the one record only. The initialisation is the same in every run: random (seeded by
``init_seed``, default) or worst-case (:mod:`~opacus_lastiterate.auditing.input_space.worst_case_init`, pre-trained on digits
outside D).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import nn

from opacus_lastiterate.analysis._validation import (
    check_int,
    check_noise_multiplier,
    check_positive,
)
from opacus_lastiterate.auditing.input_space.canaries import InputCanary
from opacus_lastiterate.auditing.input_space.worst_case_init import worst_case_initialisation
from opacus_lastiterate.auditing.opacus_training import (
    ConstantRunEpsilons,
    digits_arrays,
    train_dp_sgd,
)

__all__ = [
    "OpacusInputTrainer",
    "digits_data",
]

Architecture = Literal["mlp", "cnn"]
Initialisation = Literal["random", "worst-case", "pretrained"]
Reduction = Literal["mean", "sum"]
_NUM_FEATURES, _NUM_CLASSES = 64, 10


def digits_data() -> tuple[torch.Tensor, torch.Tensor]:
    """All 1797 digits: features ``(1797, 64)`` in [0, 1] (pixel / 16) and labels."""
    x, y = digits_arrays()
    return torch.from_numpy(x.copy()), torch.from_numpy(y.copy())


@dataclass(frozen=True)
class OpacusInputTrainer(ConstantRunEpsilons):
    """DP-SGD (Opacus) on digits, with an input canary added when ``include_canary``.

    Attributes:
        canary: the example added to D' (its input must have 64 features).
        architecture: ``"mlp"`` (64 - hidden - 10, ReLU) or ``"cnn"`` (3x3 convolution with
            ``hidden`` channels on the 8x8 image, ReLU, 2x2 average pooling, linear).
        hidden: hidden units (MLP) or channels (CNN).
        steps: T, optimizer steps.
        batch_size: expected batch size B, or None for full batch (q = 1).
        num_examples: N, size of D.
        noise_multiplier: sigma.
        max_grad_norm: clipping norm C.
        learning_rate: SGD step size.
        initialisation: ``"random"`` (default) or ``"worst-case"``.
        init_seed: seed of the random initialisation (the same in every run).
        data_seed: seed of the choice of D (and of the worst-case initialisation's data).
        init_examples: digits outside D used by the worst-case initialisation.
        init_steps: Adam steps of the worst-case (or pre-trained) initialisation.
        reduction: ``"mean"`` (default): the clipped sum is divided by the expected batch
            size of D; ``"sum"``: it is not (the summed gradients of the published
            full-batch audits; the learning rate then applies to the sum).

    ``initialisation="pretrained"`` pre-trains on ``init_examples`` digits outside D with
    the clean cross-entropy only (full-batch Adam, ``init_steps``): the worst-case
    initialisation of Annamalai and De Cristofaro's public code, which pre-trains on the half
    of the data that is not D. ``"worst-case"`` adds our canary-gradient hinge.
    """

    canary: InputCanary
    architecture: Architecture = "mlp"
    hidden: int = 32
    steps: int = 50
    batch_size: int | None = None
    num_examples: int = 200
    noise_multiplier: float = 1.0
    max_grad_norm: float = 1.0
    learning_rate: float = 2.0
    initialisation: Initialisation = "random"
    init_seed: int = 0
    data_seed: int = 0
    init_examples: int = 500
    init_steps: int = 300
    reduction: Reduction = "mean"

    def __post_init__(self) -> None:
        if not isinstance(self.canary, InputCanary):
            raise TypeError(f"`canary` must be an InputCanary, got {type(self.canary).__name__}.")
        if self.canary.features.numel() != _NUM_FEATURES:
            raise ValueError(
                f"`canary` must have {_NUM_FEATURES} features (an 8x8 digit), got shape "
                f"{tuple(self.canary.features.shape)}."
            )
        if not 0 <= self.canary.label < _NUM_CLASSES:
            raise ValueError(f"`canary.label` must be in [0, {_NUM_CLASSES - 1}], got {self.canary.label}.")
        if self.architecture not in ("mlp", "cnn"):
            raise ValueError(f"`architecture` must be 'mlp' or 'cnn', got {self.architecture!r}.")
        check_int("hidden", self.hidden, minimum=1)
        check_int("steps", self.steps, minimum=1)
        n = check_int("num_examples", self.num_examples, minimum=1)
        check_noise_multiplier(self.noise_multiplier)
        check_positive("max_grad_norm", self.max_grad_norm)
        check_positive("learning_rate", self.learning_rate)
        if self.initialisation not in ("random", "worst-case", "pretrained"):
            raise ValueError(
                "`initialisation` must be 'random', 'worst-case' or 'pretrained', got "
                f"{self.initialisation!r}."
            )
        if self.reduction not in ("mean", "sum"):
            raise ValueError(f"`reduction` must be 'mean' or 'sum', got {self.reduction!r}.")
        check_int("init_seed", self.init_seed)
        check_int("data_seed", self.data_seed)
        check_int("init_examples", self.init_examples, minimum=1)
        check_int("init_steps", self.init_steps)
        available = len(self._pool())
        needed = n + (self.init_examples if self.initialisation != "random" else 0)
        if needed > available:
            raise ValueError(
                f"`num_examples` (+ `init_examples` for a worst-case initialisation) must be at "
                f"most {available} (digits other than the canary's input), got {needed}."
            )
        if self.batch_size is not None:
            b = check_int("batch_size", self.batch_size, minimum=1)
            # Opacus derives q = 1 / ceil(len / B) from the data set: D and D' need the same.
            if math.ceil(n / b) != math.ceil((n + 1) / b):
                raise ValueError(
                    f"`num_examples` ({n}) and `batch_size` ({b}) give D and D' = D + canary "
                    "different sample rates in Opacus; choose num_examples not divisible by "
                    "batch_size."
                )

    # ------------------------------------------------------------------ data and model

    @property
    def sample_rate(self) -> float:
        """q: 1 for full batch, else 1 / ceil(N / B) as Opacus computes it."""
        if self.batch_size is None:
            return 1.0
        return 1.0 / math.ceil(self.num_examples / self.batch_size)

    @property
    def expected_batch_size(self) -> int:
        """The divisor of the clipped sum, int(N q) of D (the same for D')."""
        return int(self.num_examples * self.sample_rate)

    def _pool(self) -> np.ndarray:
        """Indices of the digits whose input differs from the canary's, in a seeded order."""
        x, _ = digits_arrays()
        same = np.all(x == self.canary.features.reshape(-1).numpy()[None, :], axis=1)
        order = np.random.default_rng(self.data_seed).permutation(len(x))
        return order[~same[order]]

    def training_indices(self) -> np.ndarray:
        """Indices (into :func:`digits_data`) of D."""
        return self._pool()[: self.num_examples]

    def init_indices(self) -> np.ndarray:
        """Indices of the digits the worst-case initialisation is fitted on (outside D)."""
        return self._pool()[self.num_examples : self.num_examples + self.init_examples]

    def _architecture(self) -> nn.Module:
        h = self.hidden
        if self.architecture == "mlp":
            return nn.Sequential(
                nn.Linear(_NUM_FEATURES, h), nn.ReLU(), nn.Linear(h, _NUM_CLASSES)
            )
        return nn.Sequential(
            nn.Unflatten(1, (1, 8, 8)),
            nn.Conv2d(1, h, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.AvgPool2d(2),
            nn.Flatten(),
            nn.Linear(h * 16, _NUM_CLASSES),
        )

    def random_initial_model(self) -> nn.Module:
        """The seeded random initialisation (``init_seed``)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.init_seed)
            return self._architecture()

    def initial_model(self) -> nn.Module:
        """The model at initialisation, the same in every run (a fresh copy per call)."""
        model = self._architecture()
        model.load_state_dict(_initial_state(self))
        return model

    # ------------------------------------------------------------------ train

    def __call__(self, include_canary: bool, seed: int) -> nn.Module:
        """Train on D (``include_canary=False``) or D'; all randomness from ``seed``."""
        if not isinstance(include_canary, bool):
            raise TypeError(f"`include_canary` must be a bool, got {include_canary!r}.")
        s = check_int("seed", seed)
        x_all, y_all = digits_arrays()
        idx = self.training_indices()
        x, y = x_all[idx], y_all[idx]
        if include_canary:
            xc = self.canary.features.reshape(1, -1).numpy().astype(np.float32)
            x, y = np.concatenate([x, xc]), np.concatenate([y, [self.canary.label]])
        batch = self.num_examples + 1 if self.batch_size is None else self.batch_size
        return train_dp_sgd(
            self.initial_model(),
            x,
            y,
            seed=s,
            steps=self.steps,
            batch_size=batch,
            noise_multiplier=self.noise_multiplier,
            max_grad_norm=self.max_grad_norm,
            learning_rate=self.learning_rate,
            expected_batch_size=self.expected_batch_size if self.reduction == "mean" else 1,
        )



@functools.lru_cache(maxsize=8)
def _initial_state(trainer: OpacusInputTrainer) -> dict[str, torch.Tensor]:
    """State of the initial model (computed once per process and configuration)."""
    model = trainer.random_initial_model()
    if trainer.initialisation in ("worst-case", "pretrained"):
        x, y = digits_arrays()
        idx = trainer.init_indices()
        model = worst_case_initialisation(
            model,
            torch.from_numpy(x[idx]),
            torch.from_numpy(y[idx]),
            trainer.canary,
            clipping_norm=trainer.max_grad_norm,
            steps=trainer.init_steps,
            weight=1.0 if trainer.initialisation == "worst-case" else 0.0,
        )
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
