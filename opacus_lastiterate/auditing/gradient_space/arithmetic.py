"""The arithmetic of one DP-SGD step, as configured: clip, sum, add noise, divide.

    theta_{t+1} = theta_t - lr * (sum_{i in B_t} clip_C(g_i) + N(0, sigma^2 C^2 I)) / divisor_t

with ``normalisation``:

- ``"sum"`` (SGM): divisor 1;
- ``"expected"`` (EASGM, what Opacus does with Poisson sampling): divisor = the constant
  ``expected_batch_size``;
- ``"realised"`` (ASGM): divisor = ``|B_t|``, the realised batch size.

Empty batches under ``"realised"`` (``|B_t|`` = 0, so the canary is absent in both worlds):
``empty_batch="noise"`` (default) divides by 1, i.e. the step releases N(0, sigma^2 C^2 I)
alone; ``empty_batch="skip"`` leaves the model unchanged (no noise). Either reveals at
most "the batch was empty" (``analysis/normalisation/asgm.py`` discusses the conventions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from opacus_lastiterate.analysis._validation import check_noise_multiplier, check_positive

__all__ = [
    "DPSGDArithmetic",
]

StepDivisor = Literal["sum", "expected", "realised"]
"""What a simulated step divides the noisy sum by: nothing (``"sum"``), the constant
``expected_batch_size`` (``"expected"``) or the realised batch size (``"realised"``)."""

_NORMALISATIONS = ("sum", "expected", "realised")


@dataclass(frozen=True)
class DPSGDArithmetic:
    """Clipping norm C, noise multiplier sigma, learning rate and normalisation of a step.

    Attributes:
        noise_multiplier: sigma; the noise std is ``sigma * C``.
        clipping_norm: C.
        learning_rate: lr (constant).
        normalisation: ``"sum"``, ``"expected"`` or ``"realised"`` (module docs).
        expected_batch_size: the constant divisor, required for ``"expected"`` only.
        empty_batch: ``"noise"`` or ``"skip"``, used by ``"realised"`` only (module docs).
    """

    noise_multiplier: float
    clipping_norm: float = 1.0
    learning_rate: float = 1.0
    normalisation: StepDivisor = "sum"
    expected_batch_size: float | None = None
    empty_batch: Literal["noise", "skip"] = "noise"

    def __post_init__(self) -> None:
        check_noise_multiplier(self.noise_multiplier)
        check_positive("clipping_norm", self.clipping_norm)
        check_positive("learning_rate", self.learning_rate)
        if self.normalisation not in _NORMALISATIONS:
            raise ValueError(
                f"`normalisation` must be one of {_NORMALISATIONS}, got {self.normalisation!r}."
            )
        if self.normalisation == "expected":
            if self.expected_batch_size is None:
                raise ValueError("`expected_batch_size` is required with normalisation='expected'.")
            check_positive("expected_batch_size", self.expected_batch_size)
        elif self.expected_batch_size is not None:
            raise ValueError(
                f"`expected_batch_size` is only used with normalisation='expected', got "
                f"{self.expected_batch_size!r} with {self.normalisation!r}."
            )
        if self.empty_batch not in ("noise", "skip"):
            raise ValueError(f"`empty_batch` must be 'noise' or 'skip', got {self.empty_batch!r}.")

    @property
    def noise_std(self) -> float:
        """sigma * C."""
        return self.noise_multiplier * self.clipping_norm

    def divisor(self, batch_size: NDArray | int | None = None) -> NDArray[np.float64] | float:
        """The divisor of the noisy sum; ``batch_size`` (realised ``|B_t|``) for ``"realised"``.

        For ``"realised"`` an empty batch gets divisor 1 (``empty_batch="noise"``) or
        ``inf`` (``"skip"``: the update, noise included, is multiplied by ``step_scale = 0``;
        use :meth:`step_scale`).
        """
        if self.normalisation == "sum":
            return 1.0
        if self.normalisation == "expected":
            return float(self.expected_batch_size)  # type: ignore[arg-type]
        if batch_size is None:
            raise ValueError("`batch_size` is required with normalisation='realised'.")
        m = np.asarray(batch_size, dtype=np.float64)
        return np.where(m > 0, m, 1.0 if self.empty_batch == "noise" else np.inf)

    def step_scale(self, batch_size: NDArray | int | None = None) -> NDArray[np.float64] | float:
        """lr / divisor: the factor applied to (clipped sum + noise); 0 for skipped steps."""
        return self.learning_rate / self.divisor(batch_size)

    def clip(self, gradients: NDArray[np.float64]) -> NDArray[np.float64]:
        """Per-example clipping along the last axis: ``g * min(1, C / ||g||)``."""
        g = np.asarray(gradients, dtype=np.float64)
        norms = np.linalg.norm(g, axis=-1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            factor = np.where(norms > self.clipping_norm, self.clipping_norm / norms, 1.0)
        return g * factor
