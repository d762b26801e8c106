"""What the wiring check (:mod:`.wiring`) reports when its probe step passes: one
:class:`ParameterReport` per parameter of the DP optimizer, gathered in a
:class:`WiringReport`."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__: list[str] = []


@dataclass(frozen=True)
class ParameterReport:
    """What the probe step showed for one parameter of the DP optimizer.

    Attributes:
        name: the parameter's name in the model (``param_groups[g][i]`` without a model).
        numel: its number of entries.
        examples: the number of per-sample gradients (None under ghost clipping).
        noise_std: the empirical standard deviation of the noise added to it.
        stated_std: ``noise_multiplier * max_grad_norm``.
        clipped_norm_max: the largest norm of one example's clipped contribution, over all
            parameters jointly for flat clipping (None under ghost clipping).
    """

    name: str
    numel: int
    examples: int | None
    noise_std: float
    stated_std: float
    clipped_norm_max: float | None


@dataclass(frozen=True)
class WiringReport:
    """The passed probe step: one :class:`ParameterReport` per parameter, the pooled noise
    standard deviation, and the names of the frozen parameters checked."""

    parameters: tuple[ParameterReport, ...]
    pooled_noise_std: float
    stated_std: float
    frozen: tuple[str, ...]
    ghost_clipping: bool
    notes: tuple[str, ...] = field(default=())
