"""A set of input canaries, each included by a fair coin: the canaries of a one-run audit.

Steinke, Nasr, Jagielski, *Privacy Auditing with One (1) Training Run* (arXiv 2305.08846):
m canaries, each added to the training set by an independent fair coin recorded up front,
are scored on the final model, and the scores and coins give a one-run lower bound
(:meth:`~opacus_lastiterate.analysis.audit.ScoreAudit.from_canaries`). Each canary here is
an :class:`~opacus_lastiterate.auditing.input_space.canaries.InputCanary` of kind ``"mislabelled"`` (a real example not otherwise
in the training set, relabelled to a wrong class as by :func:`~opacus_lastiterate.auditing.input_space.canaries.mislabelled_canary`);
the set keeps them stacked so that they are scored in batches on the model's device.
:func:`make_input_canaries` draws them and augments the training set;
:func:`~opacus_lastiterate.auditing.input_space.canary_users.make_canary_users` makes
canary *users* instead (k records sharing one secret label per canary, for user-level
sampling: features with a records axis, scored by the sum or mean of the k records' losses);
:class:`~opacus_lastiterate.callbacks.InTrainingCanaryAudit` audits them in training.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn
from torch.utils.data import ConcatDataset, Dataset, TensorDataset

from opacus_lastiterate.analysis._validation import check_int
from opacus_lastiterate.auditing.input_space.canaries import InputCanary

__all__ = [
    "InputCanaries",
    "fair_coins",
    "make_input_canaries",
]

_REDUCTIONS = ("sum", "mean")


def fair_coins(seed: int, num: int, salt: int) -> NDArray[np.bool_]:
    """``num`` fair coins (True = "in") from a generator of their own:
    ``default_rng(SeedSequence(seed, spawn_key=(salt,))).random(num) < 0.5``; ``salt``
    separates the draws of one seed (the kinds of canaries of one audit)."""
    s = check_int("seed", seed)
    n = check_int("num", num)
    k = check_int("salt", salt)
    rng = np.random.default_rng(np.random.SeedSequence(s, spawn_key=(k,)))
    return rng.random(n) < 0.5


def _per_example_cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(output, target, reduction="none")


@dataclass(frozen=True, eq=False)
class InputCanaries:
    """Input canaries and their coins (built by :func:`make_input_canaries`, or by
    :func:`~opacus_lastiterate.auditing.input_space.canary_users.make_canary_users` for
    canary users).

    A canary is one record (``reduction=None``: mislabelled examples), or a canary *user*
    of k records that share one label, its secret (``reduction="sum"`` or ``"mean"``): the
    features then carry a records axis and the canary's loss is the sum or the mean of its
    records' losses, as :func:`~opacus_lastiterate.user_samplers.per_user_loss` reduces a
    user's loss.

    Attributes:
        features: every canary's input, included or not, shape ``(m, ...)``, or
            ``(m, k, ...)`` for canary users.
        labels: their labels (a wrong class, or a canary user's secret), shape ``(m,)``.
        included: the fair coins, True = added to the training set.
        source_indices: index of each canary's example in the source data set (shape
            ``(m, k)`` for canary users: one per record).
        reduction: None (one record per canary), or how a canary user's k record losses
            make its loss, ``"sum"`` or ``"mean"``.

    Raises:
        ValueError: ``reduction`` not None, ``"sum"`` or ``"mean"``, or canary users whose
            features lack the records axis or whose coins are not one per user.
    """

    features: torch.Tensor = field(repr=False)
    labels: torch.Tensor = field(repr=False)
    included: NDArray[np.bool_] = field(repr=False)
    source_indices: NDArray[np.int64] = field(repr=False)
    reduction: Literal["sum", "mean"] | None = None

    def __post_init__(self) -> None:
        if self.reduction is None:
            return
        if self.reduction not in _REDUCTIONS:
            raise ValueError(
                f"`reduction` must be None, 'sum' or 'mean', got {self.reduction!r}."
            )
        f = self.features
        if not isinstance(f, torch.Tensor) or f.dim() < 2 or f.shape[1] < 1:
            raise ValueError(
                "`features` of canary users must have shape (m, k, ...) with k >= 1, got "
                f"{tuple(getattr(f, 'shape', ()))}."
            )
        if tuple(self.labels.shape) != (f.shape[0],) or np.shape(self.included) != (f.shape[0],):
            raise ValueError(
                f"`labels` and `included` must hold one entry per canary user ({f.shape[0]}), "
                f"got shapes {tuple(self.labels.shape)} and {np.shape(self.included)}."
            )

    @property
    def num_canaries(self) -> int:
        """m, the canaries with a coin (included or not)."""
        return int(self.included.size)

    @property
    def records_per_canary(self) -> int:
        """k, the records of a canary: 1, or the length of a canary user's records axis."""
        return 1 if self.reduction is None else int(self.features.shape[1])

    def canary(self, index: int) -> InputCanary:
        """Canary ``index`` as an :class:`~opacus_lastiterate.auditing.input_space.canaries.InputCanary` (kind ``"mislabelled"``).

        Raises:
            ValueError: ``index`` out of range, or canary users (k records each, not one
                example: their records are ``features[index]``).
        """
        i = check_int("index", index)
        if i >= self.num_canaries:
            raise ValueError(f"`index` must be in [0, {self.num_canaries - 1}], got {i}.")
        if self.reduction is not None:
            raise ValueError(
                "canary users are not single examples: a canary user's k records are "
                "`features[index]`, all labelled `labels[index]`."
            )
        return InputCanary(self.features[i], int(self.labels[i]), "mislabelled")

    @torch.no_grad()
    def scores(
        self,
        model: nn.Module,
        *,
        loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = _per_example_cross_entropy,
        batch_size: int = 1024,
    ) -> NDArray[np.float64]:
        """Minus the ``loss`` of ``model`` on every canary (higher = "in").

        ``loss(output, labels)`` must return one value per example (default: the
        cross-entropy, so that the score is :class:`~opacus_lastiterate.auditing.input_space.canaries.InputScore`'s ``"loss"``
        statistic). For canary users the model sees the records, shape ``(b k, ...)``,
        each labelled with its user's secret, and a user's score is minus the sum (or the
        mean, by :attr:`reduction`) of its k records' losses. ``batch_size`` canaries go
        through the model at a time. The model is put in eval mode for the scoring and its
        mode restored afterwards.
        """
        if not isinstance(model, nn.Module):
            raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}.")
        b = check_int("batch_size", batch_size, minimum=1)
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        users = self.reduction is not None
        k = self.records_per_canary
        was_training = model.training
        model.eval()
        try:
            out = []
            for start in range(0, self.num_canaries, b):
                x = self.features[start : start + b]
                y = self.labels[start : start + b]
                if users:  # the records of the users, each with its user's secret
                    x = x.reshape(-1, *x.shape[2:])
                    y = y.repeat_interleave(k)
                x, y = x.to(device), y.to(device)
                values = loss(model(x), y)
                if values.shape != y.shape:
                    raise ValueError(
                        f"`loss` must return one value per example (shape {tuple(y.shape)}), "
                        f"got shape {tuple(values.shape)}."
                    )
                if users:
                    per_record = values.reshape(-1, k)
                    values = per_record.sum(1) if self.reduction == "sum" else per_record.mean(1)
                out.append(-values.detach().double())
            return torch.cat(out).cpu().numpy() if out else np.zeros(0)
        finally:
            model.train(was_training)


def make_input_canaries(
    train: Dataset,
    source: Dataset,
    num_canaries: int,
    *,
    num_classes: int,
    seed: int,
) -> tuple[Dataset, InputCanaries]:
    """Training set augmented with mislabelled canaries, and the record of their coins.

    ``num_canaries`` distinct examples ``(x, y)`` are drawn from ``source`` (a data set of
    examples *not* in ``train``, e.g. a held-out split: a copy of a training example would
    be in the data whatever its coin), each relabelled to a uniformly drawn wrong class, and
    each appended to ``train`` if its fair coin says so. All draws come from ``seed``; the
    global random number generators are not used.

    Returns:
        ``(ConcatDataset([train, included canaries]), InputCanaries)``.
    """
    m = check_int("num_canaries", num_canaries, minimum=1)
    k = check_int("num_classes", num_classes, minimum=2)
    s = check_int("seed", seed)
    try:
        n_source = len(source)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError("`source` must be a map-style data set with a length.") from None
    if m > n_source:
        raise ValueError(
            f"`num_canaries` must be at most len(source) = {n_source}, got {m}."
        )
    rng = np.random.default_rng(np.random.SeedSequence(s, spawn_key=(1,)))
    idx = np.sort(rng.choice(n_source, size=m, replace=False)).astype(np.int64)
    shift = rng.integers(1, k, size=m)
    xs, ys = [], []
    for i, j in zip(idx, shift, strict=True):
        x, y = source[int(i)]
        label = int(y)
        if not 0 <= label < k:
            raise ValueError(f"label {label} of source example {int(i)} is not in [0, {k}).")
        xs.append(torch.as_tensor(x))
        ys.append((label + int(j)) % k)
    features = torch.stack(xs)
    labels = torch.tensor(ys, dtype=torch.int64)
    coins = fair_coins(s, m, salt=2)
    canaries = InputCanaries(features, labels, coins, idx)
    keep = torch.from_numpy(np.flatnonzero(coins))
    augmented: Dataset = ConcatDataset([train, TensorDataset(features[keep], labels[keep])])
    return augmented, canaries
