"""When an in-training gradient canary is in a batch: the way the loader samples records.

A canary audit's lower bound is valid for the mechanism that was run only if each canary
enters the steps the way a real record does (``docs/samplers.md``):

* **Poisson** (``None``, :class:`~opacus_lastiterate.analysis.sampling.PoissonSampling`, or an
  unknown sampler assumed Poisson): in every step independently with probability q;
* **shuffled batches** and **balls-in-bins**: once per epoch, at a step drawn at the start of
  each epoch with the scheme's probabilities (``|batch j| / N`` for shuffled batches, the rest of
  the mass being the records ``drop_last`` drops; 1 / b for balls-in-bins);
* **deterministic order**: at one step of the epoch drawn once, the same in every epoch.

:class:`CanaryInclusion` draws these on the parameters' device from a dedicated
``torch.Generator`` and returns, per step, the boolean mask of the canaries in that step's
batch: nothing is read back to the host.
"""

from __future__ import annotations

import torch

from opacus_lastiterate.analysis.sampling import (
    BallsInBins,
    DeterministicBatches,
    SamplingScheme,
    ShuffledBatches,
    effective_sampling,
)

__all__ = []


class CanaryInclusion:
    """Per-step inclusion masks of ``num_canaries`` canaries under a sampling scheme.

    Args:
        num_canaries: m >= 1.
        sample_rate: q of the Poisson case (the training's rate).
        sampling: the run's scheme (``None``: Poisson at ``sample_rate``).
        generator: the device generator the masks are drawn from.
        device: where the masks live.
    """

    def __init__(
        self,
        num_canaries: int,
        *,
        sample_rate: float,
        sampling: SamplingScheme | None,
        generator: torch.Generator,
        device: torch.device,
    ) -> None:
        self._m = num_canaries
        self._q = sample_rate
        self._generator = generator
        self._device = device
        scheme = effective_sampling(sampling)
        self.scheme = scheme
        self._steps = 0
        self._epoch_step: torch.Tensor | None = None
        self._probabilities: torch.Tensor | None = None
        self._first = 0
        self._per_epoch = 1
        if isinstance(scheme, (ShuffledBatches, DeterministicBatches, BallsInBins)):
            probs = [float(p) for p in scheme.step_probabilities()]
            dropped = max(0.0, 1.0 - sum(probs))
            # the last category is "not in this epoch" (records drop_last drops)
            self._probabilities = torch.tensor([*probs, dropped], dtype=torch.float64, device=device)
            self._first = int(scheme.first_step_in_epoch)
            self._per_epoch = len(probs)

    @property
    def per_epoch(self) -> bool:
        """Whether canaries enter once per epoch (epoch schemes) rather than by Poisson coins."""
        return self._probabilities is not None

    def _draw_positions(self) -> torch.Tensor:
        assert self._probabilities is not None
        return torch.multinomial(
            self._probabilities, self._m, replacement=True, generator=self._generator
        )

    def next_step(self) -> torch.Tensor:
        """The mask of the canaries in the next step's batch (bool, shape (m,))."""
        step = self._steps
        self._steps += 1
        if self._probabilities is None:
            return (
                torch.rand(self._m, generator=self._generator, device=self._device) < self._q
            )
        position = (self._first + step) % self._per_epoch
        redraw = self._epoch_step is None or (
            position == 0 and not isinstance(self.scheme, DeterministicBatches)
        )
        if redraw:
            self._epoch_step = self._draw_positions()
        assert self._epoch_step is not None
        return self._epoch_step == position

    def __repr__(self) -> str:
        kind = "Poisson" if not self.per_epoch else type(self.scheme).__name__
        return f"CanaryInclusion(num_canaries={self._m}, scheme={kind})"
