"""Gradient canaries for the final-model threat model: craft, insert, score.

An *adversary* (frozen dataclass) crafts a :class:`GradientCanary` for a model of a given
dimension. The canary is its own clipped gradient (norm <= C), written directly into the
summed clipped gradient of the steps it is in (``insert``), and scores a final model by
comparing it with the initial one (``score``, higher = "canary was in"). ``docs/auditing.md``,
"Adversaries":

- :class:`DiracCanaryAdversary` (A_GC-R): C on one random coordinate, score
  ``theta_0[c] - theta_T[c]`` (descent moves that coordinate down when the canary is in);
- :class:`SimulatedCoordinateAdversary` (A_GC-S): the coordinate whose per-step noiseless
  updates (same batches, no noise, no canary) accumulate the least absolute movement
  ("Noiseless-PS" of Cebere et al.), same gradient and score as the Dirac canary;
- :class:`RandomDirectionAdversary`: ``C u`` with u uniform on the unit sphere, score the
  cosine between ``theta_0 - theta_T`` and u.

``insert`` and ``score`` work on numpy arrays and on torch tensors (batched over leading
axes), so the same object serves the numpy simulator and an Opacus training loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from opacus_lastiterate.analysis._validation import check_int, check_positive
from opacus_lastiterate.auditing.gradient_space.insertion import check_rng

__all__ = [
    "DiracCanary",
    "DiracCanaryAdversary",
    "SimulatedCoordinateAdversary",
]


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _like(values: NDArray, ref: Any) -> Any:
    """``values`` as an array of the kind (numpy / torch dtype and device) of ``ref``."""
    if _is_torch(ref):
        import torch

        return torch.as_tensor(np.array(values), dtype=ref.dtype, device=ref.device)
    return values


def _presence(present: Any, ref: Any) -> Any:
    """``present`` (bool or bool array over the leading axes of ``ref``) as a 0/1 factor."""
    if _is_torch(present) or _is_torch(ref):
        import torch

        t = torch.as_tensor(present, device=ref.device).to(ref.dtype)
        return t.reshape(tuple(t.shape) + (1,))
    p = np.asarray(present)
    if p.dtype != bool:
        raise TypeError(f"`present` must be a bool or a bool array, got dtype {p.dtype}.")
    return p.astype(np.float64)[..., None]


@dataclass(frozen=True)
class GradientCanary:
    """A crafted clipped gradient (norm <= C) and how it is inserted.

    Attributes:
        gradient: the canary's gradient, shape ``(dimension,)``.
    """

    gradient: NDArray[np.float64] = field(repr=False, compare=False)

    def __post_init__(self) -> None:
        g = np.array(self.gradient, dtype=np.float64)  # a private, read-only copy
        if g.ndim != 1 or g.size == 0 or not np.all(np.isfinite(g)):
            raise ValueError(
                f"`gradient` must be a finite non-empty 1-D array, got shape {g.shape}."
            )
        g.setflags(write=False)
        object.__setattr__(self, "gradient", g)

    @property
    def dimension(self) -> int:
        """Number of model parameters the canary addresses."""
        return int(self.gradient.shape[0])

    def insert(self, summed_gradient: Any, present: Any = True) -> Any:
        """``summed_gradient + present * gradient`` (between clipping and noise).

        ``summed_gradient``: shape ``(..., dimension)``, numpy or torch; ``present``: bool
        or bool array of the leading shape (one flag per trial).
        """
        if summed_gradient.shape[-1] != self.dimension:
            raise ValueError(
                f"`summed_gradient` must have last axis {self.dimension}, got shape "
                f"{tuple(summed_gradient.shape)}."
            )
        return summed_gradient + _presence(present, summed_gradient) * _like(
            self.gradient, summed_gradient
        )

    def score(self, initial: Any, final: Any) -> Any:
        """Higher = "canary was in"; subclasses define it."""
        raise NotImplementedError


@dataclass(frozen=True)
class DiracCanary(GradientCanary):
    """``value`` on ``coordinate``, zero elsewhere; score ``initial[c] - final[c]``."""

    coordinate: int = 0

    def score(self, initial: Any, final: Any) -> Any:
        """``theta_0[c] - theta_T[c]`` (batched over leading axes)."""
        return initial[..., self.coordinate] - final[..., self.coordinate]


@dataclass(frozen=True)
class RandomDirectionCanary(GradientCanary):
    """``C u``, u a unit vector; score the cosine of ``theta_0 - theta_T`` with u."""

    def score(self, initial: Any, final: Any) -> Any:
        """``<theta_0 - theta_T, u> / ||theta_0 - theta_T||`` (0 when the model did not move)."""
        diff = initial - final
        u = _like(self.gradient / np.linalg.norm(self.gradient), diff)
        dot = (diff * u).sum(-1)
        if _is_torch(diff):
            norm = diff.norm(dim=-1)
            return dot / norm.clamp_min(1e-300)
        norm = np.linalg.norm(diff, axis=-1)
        return dot / np.maximum(norm, 1e-300)


def _dirac(dimension: int, coordinate: int, value: float) -> DiracCanary:
    g = np.zeros(dimension)
    g[coordinate] = value
    return DiracCanary(gradient=g, coordinate=coordinate)


@dataclass(frozen=True)
class DiracCanaryAdversary:
    """A_GC-R: a Dirac gradient canary of norm C on a uniformly random coordinate."""

    clipping_norm: float = 1.0

    def __post_init__(self) -> None:
        check_positive("clipping_norm", self.clipping_norm)

    def craft(self, rng: np.random.Generator, dimension: int) -> DiracCanary:
        """Draw the coordinate uniformly from ``range(dimension)``."""
        d = check_int("dimension", dimension, minimum=1)
        return _dirac(d, int(check_rng(rng).integers(d)), self.clipping_norm)


@dataclass(frozen=True)
class SimulatedCoordinateAdversary:
    """A_GC-S: Dirac canary on the coordinate that moves least in a noiseless simulation.

    ``craft`` takes the per-step updates of a noiseless training run (same batches, no
    noise, no canary), shape ``(steps, dimension)``, and picks
    ``argmin_c sum_t |update_t[c]|`` (per-step ranking, "Noiseless-PS"); ties go to the
    lowest index.
    """

    clipping_norm: float = 1.0

    def __post_init__(self) -> None:
        check_positive("clipping_norm", self.clipping_norm)

    def craft(self, noiseless_updates: ArrayLike) -> DiracCanary:
        """Dirac canary on the least-updated coordinate of ``noiseless_updates``."""
        u = np.asarray(noiseless_updates, dtype=np.float64)
        if u.ndim != 2 or u.shape[0] < 1 or u.shape[1] < 1:
            raise ValueError(
                f"`noiseless_updates` must have shape (steps >= 1, dimension >= 1), got {u.shape}."
            )
        if not np.all(np.isfinite(u)):
            raise ValueError("`noiseless_updates` must be finite.")
        movement = np.abs(u).sum(axis=0)
        return _dirac(u.shape[1], int(np.argmin(movement)), self.clipping_norm)


@dataclass(frozen=True)
class RandomDirectionAdversary:
    """A canary ``C u`` with u uniform on the unit sphere (normalised Gaussian vector)."""

    clipping_norm: float = 1.0

    def __post_init__(self) -> None:
        check_positive("clipping_norm", self.clipping_norm)

    def craft(self, rng: np.random.Generator, dimension: int) -> RandomDirectionCanary:
        d = check_int("dimension", dimension, minimum=1)
        z = check_rng(rng).standard_normal(d)
        while not np.any(z):  # pragma: no cover - probability zero
            z = rng.standard_normal(d)
        return RandomDirectionCanary(gradient=self.clipping_norm * z / np.linalg.norm(z))
