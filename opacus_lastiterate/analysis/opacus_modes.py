"""What each Opacus release does in its other training modes: distributed training (DDP,
FSDP) and adaptive clipping; the rows' texts are :attr:`OpacusRelease.distributed`,
:attr:`OpacusRelease.adaptive_clipping` and :attr:`OpacusRelease.ghost_clipping`
(``docs/opacus_versions.md``, "Training modes"). Ghost clipping and virtual steps
(``BatchMemoryManager``) change neither the divisor nor the accountant's (q, steps) of
:func:`~opacus_lastiterate.analysis.opacus_versions.compare_versions`: one noisy step per
logical batch, divided by int(N q). torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from opacus_lastiterate.analysis._validation import check_int, check_noise_multiplier
from opacus_lastiterate.analysis.baselines.composition import standard_epsilon
from opacus_lastiterate.analysis.opacus_releases import OpacusRelease, release
from opacus_lastiterate.analysis.opacus_versions import (
    VersionConfig,
    accounting_plan,
    divisor,
    reported_epsilon,
)

__all__ = [
    "adaclip_accounting",
    "distributed_divisors",
]




def distributed_divisors(
    rel: OpacusRelease | str, dataset_size: int, batch_size: int, world_size: int
) -> tuple[float, float]:
    """(the divisor each rank uses, the global divisor) of ``make_private`` on a DDP (or,
    1.6.0, FSDP) module with W = ``world_size`` ranks, Poisson sampling, ``"mean"``: 1.0.0
    and 1.0.1 divide by int(N q) on every rank and the all-reduce averages, so W int(N q)
    globally; from 1.0.2 each rank divides by int(N q) / W, int(N q) globally
    (:attr:`OpacusRelease.distributed`). ValueError for 0.x (not modelled)."""
    r = release(rel) if isinstance(rel, str) else rel
    w = check_int("world_size", world_size, minimum=1)
    if r.family != "1.x":
        raise ValueError(f"distributed training is not modelled for Opacus {r.version} (0.x).")
    c = divisor(r, dataset_size, batch_size)
    if r.key < (1, 0, 2):
        return c, w * c
    return c / w, c


@dataclass(frozen=True)
class AdaClipAccounting:
    """What a release reports for an ``AdaClipDPOptimizer`` run, and what it should.

    Attributes:
        version: the release.
        recorded_noise_multiplier: the sigma its accountant records (sigma_eff before 1.6.0).
        accounted_noise_multiplier: sigma, Theorem 1 of Andrew et al. (Opacus 1.6.0).
        reported: the epsilon the release prints (its default accountant, its own q).
        corrected: the same accountant's epsilon at sigma (what 1.6.0 prints; equal to
            ``reported`` on 1.6.0).
        count_sensitivity_one_noise_multiplier: (sigma_eff^-2 + sigma_u^-2)^(-1/2).
        count_sensitivity_one: SGM (PLD, an upper bound) at that multiplier: Theorem 1
            gives the count query sensitivity 1/2 (Andrew et al. centre the bits with a
            known number of participants); Opacus noises the uncentred count of unclipped
            examples, whose add/remove sensitivity is 1, and the vector (clipped gradient /
            C, count) then has noise multiplier this value.
    """

    version: str
    recorded_noise_multiplier: float
    accounted_noise_multiplier: float
    reported: float
    corrected: float
    count_sensitivity_one_noise_multiplier: float
    count_sensitivity_one: float


def adaclip_accounting(
    rel: OpacusRelease | str, config: VersionConfig, unclipped_num_std: float
) -> AdaClipAccounting:
    """The epsilons of an adaptive-clipping run (``make_private(clipping="adaptive")``) of
    ``config`` with sigma = ``config.noise_multiplier`` and sigma_u = ``unclipped_num_std``
    (:class:`AdaClipAccounting`).

    Raises:
        ValueError: before 1.1.3 (no adaptive clipping), or unless sigma < 2 sigma_u (the
            condition of Theorem 1, which 1.5.4 and 1.6.0 enforce).
    """
    r = release(rel) if isinstance(rel, str) else rel
    if not r.adaptive_clipping:
        raise ValueError(f"Opacus {r.version} has no adaptive clipping (AdaClipDPOptimizer, 1.1.3+).")
    sigma = float(config.noise_multiplier)
    sigma_u = float(check_noise_multiplier(unclipped_num_std, "unclipped_num_std"))
    if not (0 < sigma < 2 * sigma_u):
        raise ValueError(
            f"adaptive clipping needs 0 < noise_multiplier < 2 * unclipped_num_std, got "
            f"{sigma} and {sigma_u}."
        )
    sigma_eff = (sigma**-2 - (2 * sigma_u) ** -2) ** -0.5
    recorded = sigma if r.key >= (1, 6, 0) else sigma_eff

    def printed(s: float) -> float:
        return reported_epsilon(r, replace(config, noise_multiplier=s))

    sigma_one = (sigma_eff**-2 + sigma_u**-2) ** -0.5
    plan = accounting_plan(r, config)
    return AdaClipAccounting(
        version=r.version,
        recorded_noise_multiplier=recorded,
        accounted_noise_multiplier=sigma,
        reported=printed(recorded),
        corrected=printed(sigma),
        count_sensitivity_one_noise_multiplier=sigma_one,
        count_sensitivity_one=float(
            standard_epsilon(
                float(config.delta), steps=plan.steps, sample_rate=plan.accountant_rate,
                noise_multiplier=sigma_one,
            )
        ),
    )
