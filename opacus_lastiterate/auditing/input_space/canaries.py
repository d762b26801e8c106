"""Input-space canaries for final-model audits: the example the adversary adds, and its score.

In the input space the adversary cannot write gradients; it adds one example (x, y) to the
training set and, after training, queries the final model. ``docs/input_audits.md``,
"Canary types":

- :func:`in_distribution_canary`: a real example, correctly labelled, that is not in D;
- :func:`mislabelled_canary`: a real example with a wrong label (label flip);
- :func:`blank_canary`: an all-zero input;
- :func:`clip_backdoor_canary`: an input along the direction of least variance of the data,
  scaled to the data's mean norm (ClipBKD of Jagielski, Ullman, Oprea, *Auditing
  Differentially Private Machine Learning: How Private is Private SGD?*, arXiv 2006.07709);
- :class:`InputCanary` itself for a user-supplied example.

Scores (:class:`InputScore`, higher = "the canary was in"): minus the final model's
cross-entropy loss on a sample, or its logit margin ``z_y - max_{j != y} z_j``. The sample is
the canary itself or a crafted adversarial sample (:mod:`~opacus_lastiterate.auditing.input_space.adversarial_samples`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from opacus_lastiterate.analysis._validation import check_int, check_positive

__all__ = [
    "InputCanary",
    "InputScore",
    "blank_canary",
    "clip_backdoor_canary",
    "in_distribution_canary",
    "least_likely_label",
    "mislabelled_canary",
]

CanaryType = Literal[
    "in-distribution", "mislabelled", "blank", "clip-backdoor", "user", "crafted"
]
CANARY_TYPES: tuple[str, ...] = (
    "in-distribution",
    "mislabelled",
    "blank",
    "clip-backdoor",
    "user",
    "crafted",
)
ScoreStatistic = Literal["loss", "margin"]
SCORE_STATISTICS: tuple[str, ...] = ("loss", "margin")


def _as_features(name: str, value: Any) -> torch.Tensor:
    """A finite, non-empty floating tensor (a detached, private copy on the CPU)."""
    try:
        t = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(f"`{name}` must be a tensor or an array, got {type(value).__name__}.") from exc
    if t.numel() == 0:
        raise ValueError(f"`{name}` must not be empty, got shape {tuple(t.shape)}.")
    if not torch.is_floating_point(t):
        t = t.to(torch.float32)
    t = t.detach().to("cpu").clone().contiguous()
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"`{name}` must be finite.")
    return t


@dataclass(frozen=True, eq=False)
class InputCanary:
    """One example (x, y) that the adversary adds to D, or queries the final model with.

    Attributes:
        features: the input x, one example without the batch axis (e.g. ``(64,)`` or
            ``(1, 8, 8)``); stored as a private CPU copy.
        label: its class y (an integer >= 0).
        kind: how it was made, one of :data:`CANARY_TYPES` (``"user"`` when supplied).

    Two canaries are equal when kind, label and features are (the ``digest``, a SHA-256 of
    the features' bytes, shape and dtype, stands for the features in ``repr``, so that a run
    record file tells canaries apart).
    """

    features: torch.Tensor
    label: int
    kind: CanaryType = "user"

    def __post_init__(self) -> None:
        object.__setattr__(self, "features", _as_features("features", self.features))
        object.__setattr__(self, "label", check_int("label", self.label))
        if self.kind not in CANARY_TYPES:
            raise ValueError(f"`kind` must be one of {CANARY_TYPES}, got {self.kind!r}.")

    @property
    def digest(self) -> str:
        """First 16 hex digits of the SHA-256 of the features (dtype, shape, bytes)."""
        h = hashlib.sha256()
        h.update(f"{self.features.dtype}|{tuple(self.features.shape)}|".encode())
        h.update(self.features.numpy().tobytes())
        return h.hexdigest()[:16]

    def __repr__(self) -> str:
        return (
            f"InputCanary(kind={self.kind!r}, label={self.label}, "
            f"shape={tuple(self.features.shape)}, digest={self.digest!r})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, InputCanary):
            return NotImplemented
        return (self.kind, self.label, self.digest) == (other.kind, other.label, other.digest)

    def __hash__(self) -> int:
        return hash((self.kind, self.label, self.digest))

    def batch(self, device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x[None], tensor([y]))``: the example as a batch of one."""
        x = self.features[None]
        y = torch.tensor([self.label], dtype=torch.int64)
        if device is not None:
            x, y = x.to(device), y.to(device)
        return x, y

    def with_features(self, features: Any, kind: CanaryType = "crafted") -> InputCanary:
        """A sample with the same label and other features (e.g. a crafted one)."""
        return InputCanary(features, self.label, kind)

    @torch.no_grad()
    def score(self, model: nn.Module, statistic: ScoreStatistic = "loss") -> float:
        """Higher = "in": minus the loss of ``model`` on (x, y), or its logit margin."""
        if not isinstance(model, nn.Module):
            raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}.")
        _check_statistic(statistic)
        x, y = self.batch()
        x, y = _on_model(x, model), _on_model(y, model)
        was_training = model.training
        model.eval()
        try:
            logits = model(x)
        finally:
            model.train(was_training)
        return float(sample_scores(logits, y, statistic)[0])


def _on_model(t: torch.Tensor, model: nn.Module) -> torch.Tensor:
    """``t`` on the device of ``model``'s parameters (and in their dtype, if floating)."""
    p = next(iter(model.parameters()), None)
    if p is None:
        return t
    return t.to(p.device, dtype=p.dtype) if torch.is_floating_point(t) else t.to(p.device)


def _check_statistic(statistic: object) -> None:
    if statistic not in SCORE_STATISTICS:
        raise ValueError(f"`statistic` must be one of {SCORE_STATISTICS}, got {statistic!r}.")


def sample_scores(
    logits: torch.Tensor, labels: torch.Tensor, statistic: ScoreStatistic = "loss"
) -> torch.Tensor:
    """Per-row score of ``logits`` (shape ``(n, classes)``): ``-cross_entropy`` or margin.

    The margin is ``z_y - max_{j != y} z_j``. Differentiable (used by the crafting loop).
    """
    _check_statistic(statistic)
    if statistic == "loss":
        return -nn.functional.cross_entropy(logits, labels, reduction="none")
    true = logits.gather(1, labels[:, None])[:, 0]
    others = logits.scatter(1, labels[:, None], float("-inf"))
    return true - others.max(dim=1).values


@dataclass(frozen=True)
class InputScore:
    """``score(model) -> float`` for the runner: the final model's score on ``sample``.

    Attributes:
        sample: the canary, or a crafted sample.
        statistic: ``"loss"`` (minus cross-entropy, default) or ``"margin"`` (logit margin).
    """

    sample: InputCanary
    statistic: ScoreStatistic = "loss"

    def __post_init__(self) -> None:
        if not isinstance(self.sample, InputCanary):
            raise TypeError(f"`sample` must be an InputCanary, got {type(self.sample).__name__}.")
        _check_statistic(self.statistic)

    def __call__(self, model: nn.Module) -> float:
        return self.sample.score(model, self.statistic)


# ------------------------------------------------------------------------------ constructors


def _example(features: Any, labels: Any, index: int) -> tuple[torch.Tensor, int]:
    x = torch.as_tensor(features)
    y = torch.as_tensor(labels)
    if y.ndim != 1 or x.ndim < 2 or x.shape[0] != y.shape[0]:
        raise ValueError(
            "`features` must have shape (n, ...) and `labels` shape (n,), got "
            f"{tuple(x.shape)} and {tuple(y.shape)}."
        )
    i = check_int("index", index)
    if i >= y.shape[0]:
        raise ValueError(f"`index` must be in [0, {y.shape[0] - 1}], got {i}.")
    return x[i], int(y[i])


def in_distribution_canary(features: Any, labels: Any, index: int) -> InputCanary:
    """Example ``index`` of ``(features, labels)``, correctly labelled.

    Take it from data that is not in D (a held-out split): otherwise it is in D whatever the
    coin.
    """
    x, y = _example(features, labels, index)
    return InputCanary(x, y, "in-distribution")


def mislabelled_canary(
    features: Any, labels: Any, index: int, *, num_classes: int, shift: int = 1
) -> InputCanary:
    """Example ``index`` relabelled to ``(y + shift) mod num_classes`` (a label flip)."""
    k = check_int("num_classes", num_classes, minimum=2)
    s = check_int("shift", shift, minimum=1)
    if s >= k:
        raise ValueError(f"`shift` must be in [1, {k - 1}], got {s}.")
    x, y = _example(features, labels, index)
    if y >= k:
        raise ValueError(f"label {y} of example {index} is not in [0, {k}).")
    return InputCanary(x, (y + s) % k, "mislabelled")


def blank_canary(shape: tuple[int, ...], label: int) -> InputCanary:
    """An all-zero input of ``shape`` (one example, no batch axis) with class ``label``."""
    if not isinstance(shape, tuple) or not shape or any(
        not isinstance(d, int) or d < 1 for d in shape
    ):
        raise ValueError(f"`shape` must be a non-empty tuple of positive ints, got {shape!r}.")
    return InputCanary(torch.zeros(shape), label, "blank")


def clip_backdoor_canary(features: Any, label: int, *, norm: float | None = None) -> InputCanary:
    """An input along the direction of least variance of ``features`` (shape ``(n, ...)``).

    The direction is the last right singular vector of the centred data matrix (sign fixed
    so that its largest-magnitude entry is positive), scaled to ``norm`` (default: the mean
    L2 norm of the examples). Pass data the auditor may use (a public or held-out split),
    not D itself.
    """
    x = np.asarray(torch.as_tensor(features).detach().cpu().numpy(), dtype=np.float64)
    if x.ndim < 2 or x.shape[0] < 2:
        raise ValueError(f"`features` must have shape (n >= 2, ...), got {x.shape}.")
    flat = x.reshape(x.shape[0], -1)
    if not np.all(np.isfinite(flat)):
        raise ValueError("`features` must be finite.")
    # Full SVD: with fewer examples than dimensions the null space holds the least variance.
    _, _, vt = np.linalg.svd(flat - flat.mean(axis=0), full_matrices=True)
    direction = vt[-1]
    direction = direction * np.sign(direction[np.argmax(np.abs(direction))])
    scale = (
        float(np.linalg.norm(flat, axis=1).mean())
        if norm is None
        else check_positive("norm", norm)
    )
    return InputCanary(
        torch.from_numpy((scale * direction).reshape(x.shape[1:]).astype(np.float32)),
        label,
        "clip-backdoor",
    )


@torch.no_grad()
def least_likely_label(model: nn.Module, features: Any) -> int:
    """``argmin_j model(x)_j``: the class ``model`` finds least likely for one input x.

    A label choice for blank and backdoor canaries (taken from the initial model, which the
    adversary knows): the canary then has a large loss, hence a large gradient.
    """
    x = _on_model(_as_features("features", features)[None], model)
    was_training = model.training
    model.eval()
    try:
        out = model(x)
    finally:
        model.train(was_training)
    return int(out[0].argmin())
