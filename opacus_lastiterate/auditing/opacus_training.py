"""A ready-made training function for the many-run runner: Opacus DP-SGD on digits.

:class:`OpacusDigitsTrainer` trains a small model (softmax regression or a one-hidden-layer
MLP) on a subset of scikit-learn's bundled 8x8 digits (no download) with
``PrivacyEngine(accountant="last_iterate")``, Poisson sampling and a fixed number of steps,
and returns the final model only. The optimizer under the ``DPOptimizer`` is torch's plain
SGD (default) or AdamW (``optimizer="adamw"``, ``docs/adaptive_optimizers.md``), at a constant
learning rate or one that decays linearly to 0 over the run (``lr_schedule="linear"``, the
Hugging Face default without warm-up); :attr:`OpacusDigitsTrainer.run` is the run with the
per-step weights the accountant records for these. Two canaries (``docs/auditing.md``, "Adversaries"):

* ``"gradient"`` (default): a Dirac gradient canary of norm C = ``max_grad_norm`` added to
  the clipped gradient sum before the noise, Poisson-sampled at the training rate q (like a
  training example). Score: ``theta_0 - theta_T`` in the canary's coordinate (the
  initialisation is fixed by ``init_seed``, so the scorer knows ``theta_0``). By default the
  coordinate is a first-layer weight of a pixel that is zero on every training image, so the
  data never move it: the audit then targets the last-iterate heuristic exactly.
* ``"input"``: a mislabelled digit (a held-out image with a wrong label) added to D.
  Score: minus the model's cross-entropy loss on it.

Both are picklable top-level objects; use ``trainer`` as ``train`` and ``trainer.score`` as
``score`` for :class:`~opacus_lastiterate.auditing.runner.AuditRunner`.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from opacus_lastiterate._requires import requires

with requires("opacus_lastiterate.auditing.opacus_training", "torch", "opacus"):
    import torch
    from opacus import PrivacyEngine
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

import opacus_lastiterate.accountants  # noqa: F401  (registers accountant="last_iterate")
from opacus_lastiterate.analysis._validation import (
    check_in_interval,
    check_int,
    check_noise_multiplier,
    check_positive,
)
from opacus_lastiterate.analysis.kept_model import KeptModel
from opacus_lastiterate.analysis.last_iterate.adaptive_steps import AdaptiveStep
from opacus_lastiterate.analysis.last_iterate.adaptive_weights import AdaptiveSettings
from opacus_lastiterate.analysis.last_iterate.optimizer_weights import SGDSettings
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun

__all__ = [
    "OpacusDigitsTrainer",
]

CanaryKind = Literal["gradient", "input"]
TrainerOptimizer = Literal["sgd", "adamw"]
LearningRateSchedule = Literal["constant", "linear"]
_OPTIMIZERS: tuple[str, ...] = ("sgd", "adamw")
_SCHEDULES: tuple[str, ...] = ("constant", "linear")
_NUM_FEATURES, _NUM_CLASSES = 64, 10


@functools.lru_cache(maxsize=1)
def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """Digits features scaled to [0, 1] (a fixed, data-independent scale) and labels."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return (x / 16.0).astype(np.float32), y.astype(np.int64)


def train_dp_sgd(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    *,
    seed: int,
    steps: int,
    batch_size: int,
    noise_multiplier: float,
    max_grad_norm: float,
    learning_rate: float,
    expected_batch_size: int | None = None,
    before_training: Callable[[torch.optim.Optimizer, nn.Module, torch.Generator], None]
    | None = None,
    optimizer: TrainerOptimizer = "sgd",
    weight_decay: float = 0.0,
    lr_schedule: LearningRateSchedule = "constant",
) -> nn.Module:
    """``steps`` steps of Opacus DP-SGD (Poisson sampling) on ``(x, y)``.

    The optimizer under the ``DPOptimizer`` is torch's ``SGD`` (no momentum; L2
    ``weight_decay``) or ``AdamW`` (torch's default betas and eps, decoupled
    ``weight_decay``); step k (from 0) uses :func:`learning_rates` of ``lr_schedule``
    (``"linear"``: through a ``LambdaLR`` stepped after every optimizer step). The batch sampling, the noise
    and ``before_training``'s generator are seeded from ``SeedSequence(seed)``; nothing
    global is drawn from. ``expected_batch_size`` overrides the divisor Opacus derives from
    ``len(x)`` (to keep it the same with and without an added canary). Returns ``model``
    (unwrapped) holding the final parameters.
    """
    _check_optimizer_options(optimizer, weight_decay, lr_schedule)
    sampling_seed, noise_seed, canary_seed = np.random.SeedSequence(seed).generate_state(3)
    sampling = torch.Generator().manual_seed(int(sampling_seed))
    noise = torch.Generator().manual_seed(int(noise_seed))
    canary_rng = torch.Generator().manual_seed(int(canary_seed))
    inner: torch.optim.Optimizer
    if optimizer == "adamw":
        inner = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=weight_decay)
    else:
        inner = torch.optim.SGD(model.parameters(), lr=learning_rate, weight_decay=weight_decay)
    factors = learning_rates(1.0, steps, lr_schedule)
    dataset = TensorDataset(torch.from_numpy(x.copy()), torch.from_numpy(y.copy()))
    loader = DataLoader(dataset, batch_size=batch_size, generator=sampling)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Secure RNG turned off")
        warnings.filterwarnings("ignore", message=".*[Ff]ull backward hook")
        engine = PrivacyEngine(accountant="last_iterate")
        private, dp_optimizer, loader = engine.make_private(
            module=model,
            optimizer=inner,
            data_loader=loader,
            noise_multiplier=noise_multiplier,
            max_grad_norm=max_grad_norm,
            poisson_sampling=True,
            noise_generator=noise,
        )
        if expected_batch_size is not None:
            dp_optimizer.expected_batch_size = expected_batch_size  # type: ignore[attr-defined]
        schedule = (
            None
            if lr_schedule == "constant"
            else torch.optim.lr_scheduler.LambdaLR(
                dp_optimizer, lambda k: float(factors[min(k, steps - 1)])
            )
        )
        if before_training is not None:
            before_training(dp_optimizer, model, canary_rng)
        criterion = nn.CrossEntropyLoss()
        taken = 0
        while taken < steps:
            for xb, yb in loader:
                dp_optimizer.zero_grad()
                criterion(private(xb), yb).backward()
                dp_optimizer.step()
                if schedule is not None:
                    schedule.step()
                taken += 1
                if taken == steps:
                    break
        private.remove_hooks()
    return model  # the unwrapped module, holding the final parameters


def _check_optimizer_options(optimizer: object, weight_decay: object, schedule: object) -> None:
    if optimizer not in _OPTIMIZERS:
        raise ValueError(f"`optimizer` must be one of {_OPTIMIZERS}, got {optimizer!r}.")
    check_in_interval("weight_decay", weight_decay, 0.0, math.inf, low_open=False)
    if schedule not in _SCHEDULES:
        raise ValueError(f"`lr_schedule` must be one of {_SCHEDULES}, got {schedule!r}.")


def learning_rates(learning_rate: float, steps: int, schedule: LearningRateSchedule) -> np.ndarray:
    """The learning rate of each of ``steps`` steps: constant, or ``"linear"``: decaying
    linearly to 0, ``learning_rate * (steps - k) / steps`` at step k = 0, ..., steps - 1 (the
    Hugging Face linear schedule without warm-up)."""
    if schedule not in _SCHEDULES:
        raise ValueError(f"`lr_schedule` must be one of {_SCHEDULES}, got {schedule!r}.")
    t = check_int("steps", steps, minimum=1)
    if schedule == "constant":
        return np.full(t, float(learning_rate))
    return float(learning_rate) * (t - np.arange(t)) / t


class ConstantRunEpsilons:
    """The epsilons of a trainer's constant (T, q, sigma) run of Poisson-sampled plain SGD,
    by the registry of privacy models (:func:`~opacus_lastiterate.analysis.privacy_models.
    privacy_model`)."""

    steps: int
    noise_multiplier: float

    @property
    def sample_rate(self) -> float:
        raise NotImplementedError

    @property
    def run(self) -> DPSGDRun:
        """The run the trainer takes: T steps at (q, sigma), Poisson-sampled, plain SGD."""
        return DPSGDRun.constant(
            steps=self.steps, sample_rate=self.sample_rate, noise_multiplier=self.noise_multiplier
        )

    def heuristic_epsilon(self, delta: float) -> float:
        """The last-iterate heuristic epsilon of this training (not a DP guarantee)."""
        return privacy_model("heuristic", self.run).epsilon(delta)

    def standard_epsilon(self, delta: float) -> float:
        """The standard composition epsilon (all iterates released): a DP upper bound."""
        return privacy_model("standard", self.run).epsilon(delta)


@dataclass(frozen=True)
class OpacusDigitsTrainer(ConstantRunEpsilons):
    """DP-SGD (Opacus, last-iterate accountant) on digits, with an optional canary.

    Attributes:
        canary: ``"gradient"`` (Dirac gradient canary) or ``"input"`` (mislabelled digit).
        steps: T, optimizer steps.
        batch_size: expected batch size B; the sample rate is ``1 / ceil(N / B)`` as in Opacus.
        num_examples: N, size of D (a subset of the 1797 digits chosen by ``data_seed``).
        noise_multiplier: sigma.
        max_grad_norm: clipping norm C (also the gradient canary's norm).
        learning_rate: the optimizer's (peak) learning rate.
        hidden: hidden units (0: softmax regression).
        init_seed: seed of the fixed initialisation (the same in every run).
        data_seed: seed of the choice of D and of the input canary.
        canary_coordinate: flat index into the first layer's weight for the gradient canary;
            None picks the weight of class 0 from the first pixel that is zero on all of D.
        optimizer: ``"sgd"`` (torch's SGD, no momentum) or ``"adamw"`` (torch's AdamW with
            its default betas (0.9, 0.999) and eps 1e-8).
        weight_decay: lambda >= 0 (SGD: L2 added to the gradient; AdamW: decoupled).
        lr_schedule: ``"constant"`` or ``"linear"`` (decay to 0 over the T steps,
            :func:`learning_rates`).
    """

    canary: CanaryKind = "gradient"
    steps: int = 50
    batch_size: int = 64
    num_examples: int = 400
    noise_multiplier: float = 1.0
    max_grad_norm: float = 1.0
    learning_rate: float = 0.5
    hidden: int = 0
    init_seed: int = 0
    data_seed: int = 0
    canary_coordinate: int | None = None
    optimizer: TrainerOptimizer = "sgd"
    weight_decay: float = 0.0
    lr_schedule: LearningRateSchedule = "constant"

    def __post_init__(self) -> None:
        if self.canary not in ("gradient", "input"):
            raise ValueError(f"`canary` must be 'gradient' or 'input', got {self.canary!r}.")
        check_int("steps", self.steps, minimum=1)
        check_int("batch_size", self.batch_size, minimum=1)
        n = check_int("num_examples", self.num_examples, minimum=1)
        total = len(digits_arrays()[1])
        if n > total - 1:
            raise ValueError(f"`num_examples` must be in [1, {total - 1}], got {n}.")
        check_noise_multiplier(self.noise_multiplier)
        check_positive("max_grad_norm", self.max_grad_norm)
        check_positive("learning_rate", self.learning_rate)
        check_int("hidden", self.hidden)
        check_int("init_seed", self.init_seed)
        check_int("data_seed", self.data_seed)
        _check_optimizer_options(self.optimizer, self.weight_decay, self.lr_schedule)
        width = (self.hidden or _NUM_CLASSES) * _NUM_FEATURES
        if self.canary_coordinate is not None:
            c = check_int("canary_coordinate", self.canary_coordinate)
            if c >= width:
                raise ValueError(f"`canary_coordinate` must be in [0, {width - 1}], got {c}.")
        # Opacus derives q and the expected batch size from len(D): they must not change when
        # the input canary is added, or the two worlds would differ by more than one record.
        if self.canary == "input" and self._loader_constants(n) != self._loader_constants(n + 1):
            raise ValueError(
                f"`num_examples` ({n}) and `batch_size` ({self.batch_size}) give D and "
                "D' = D + canary different sample rates or expected batch sizes in Opacus; "
                "choose num_examples not divisible by batch_size."
            )

    # ------------------------------------------------------------------ data and model

    def _loader_constants(self, n: int) -> tuple[float, int]:
        q = 1.0 / math.ceil(n / self.batch_size)
        return q, int(n * q)

    @property
    def sample_rate(self) -> float:
        """q = 1 / ceil(N / B), the Poisson sampling rate Opacus uses."""
        return self._loader_constants(self.num_examples)[0]

    def optimizer_steps(self) -> list[tuple[SGDSettings | AdaptiveStep, int]]:
        """The optimizer's settings of every step, run-length encoded ``(settings, steps)``,
        as ``LastIterateAccountant``'s hook records them: ``SGDSettings``, or for AdamW an
        ``AdaptiveStep`` (its settings and the noise sigma C / B of the averaged gradient,
        B = ``int(N q)``, Opacus's expected batch size)."""
        rates = learning_rates(self.learning_rate, self.steps, self.lr_schedule)
        if self.optimizer == "adamw":
            batch = self._loader_constants(self.num_examples)[1]
            std = self.noise_multiplier * self.max_grad_norm / batch
            return [
                (AdaptiveStep(AdaptiveSettings("adamw", float(lr), weight_decay=self.weight_decay), std), 1)
                for lr in rates
            ]  # fmt: skip
        return [(SGDSettings(float(lr), 0.0, 0.0, False, self.weight_decay), 1) for lr in rates]

    @property
    def run(self) -> DPSGDRun:
        """The run the trainer takes, T steps at (q, sigma), Poisson-sampled, with the
        weights the kept model (:class:`~opacus_lastiterate.analysis.kept_model.KeptModel`)
        gives :meth:`optimizer_steps`: none for constant-rate plain SGD, the schedule's and
        weight decay's otherwise, AdamW's frozen-second-moment weights
        (``docs/adaptive_optimizers.md``) for AdamW."""
        constant = DPSGDRun.constant(
            steps=self.steps, sample_rate=self.sample_rate, noise_multiplier=self.noise_multiplier
        )
        return KeptModel.from_run(constant, self.optimizer_steps()).run

    def _split(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        x, y = digits_arrays()
        order = np.random.default_rng(self.data_seed).permutation(len(y))
        train, canary = order[: self.num_examples], int(order[self.num_examples])
        return x[train], y[train], x[canary], int((y[canary] + 1) % _NUM_CLASSES)

    def canary_example(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The input canary: a held-out digit (1 x 64) and its wrong label (1,)."""
        _, _, xc, yc = self._split()
        return torch.from_numpy(xc[None, :].copy()), torch.tensor([yc])

    def coordinate(self) -> int:
        """Flat index into the first layer's weight that the gradient canary writes to."""
        if self.canary_coordinate is not None:
            return self.canary_coordinate
        x, _, _, _ = self._split()
        zero = np.flatnonzero(np.all(x == 0.0, axis=0))
        return int(zero[0]) if zero.size else 0  # row 0 (class / unit 0), that pixel

    def initial_model(self) -> nn.Module:
        """The model at initialisation (the same in every run, seeded by ``init_seed``)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.init_seed)
            if self.hidden == 0:
                return nn.Sequential(nn.Linear(_NUM_FEATURES, _NUM_CLASSES))
            return nn.Sequential(
                nn.Linear(_NUM_FEATURES, self.hidden),
                nn.ReLU(),
                nn.Linear(self.hidden, _NUM_CLASSES),
            )

    # ------------------------------------------------------------------ train and score

    def __call__(self, include_canary: bool, seed: int) -> nn.Module:
        """Train on D (``include_canary=False``) or D'; all randomness from ``seed``."""
        if not isinstance(include_canary, bool):
            raise TypeError(f"`include_canary` must be a bool, got {include_canary!r}.")
        s = check_int("seed", seed)
        x, y, xc, yc = self._split()
        if include_canary and self.canary == "input":
            x, y = np.concatenate([x, xc[None, :]]), np.concatenate([y, [yc]])
        before = self._insert_gradient_canary if include_canary and self.canary == "gradient" else None
        return train_dp_sgd(
            self.initial_model(),
            x,
            y,
            seed=s,
            steps=self.steps,
            batch_size=self.batch_size,
            noise_multiplier=self.noise_multiplier,
            max_grad_norm=self.max_grad_norm,
            learning_rate=self.learning_rate,
            before_training=before,
            optimizer=self.optimizer,
            weight_decay=self.weight_decay,
            lr_schedule=self.lr_schedule,
        )

    def _insert_gradient_canary(
        self, optimizer: torch.optim.Optimizer, model: nn.Module, rng: torch.Generator
    ) -> None:
        """Add the Dirac canary to the clipped sum before the noise, with probability q."""
        weight = next(model.parameters())
        coord, q, c = self.coordinate(), self.sample_rate, float(self.max_grad_norm)
        add_noise = optimizer.add_noise  # type: ignore[attr-defined]

        def add_noise_with_canary() -> None:
            if torch.rand((), generator=rng).item() < q:
                weight.summed_grad.view(-1)[coord] += c  # type: ignore[attr-defined]
            add_noise()

        optimizer.add_noise = add_noise_with_canary  # type: ignore[attr-defined]

    @torch.no_grad()
    def score(self, model: nn.Module) -> float:
        """Higher = "the canary was in": coordinate drop (gradient) or minus loss (input)."""
        if self.canary == "gradient":
            coord = self.coordinate()
            start = next(self.initial_model().parameters()).reshape(-1)[coord]
            end = next(model.parameters()).reshape(-1)[coord]
            return float(start - end)
        xc, yc = self.canary_example()
        return -float(nn.functional.cross_entropy(model(xc), yc))

