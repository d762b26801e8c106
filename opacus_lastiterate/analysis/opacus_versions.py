"""What each Opacus release (0.9.0-1.6.0) does to a DP-SGD run, and what it reports.

``docs/opacus_versions.md`` has the table in words. The rows, one per PyPI release, are in
:mod:`opacus_lastiterate.analysis.opacus_releases` (:data:`OPACUS_RELEASES`, re-exported
here); this module runs a training configuration through them: the divisor and weighting
each release applies, the epsilon it reports and the corrected one. Every rule cites
Opacus's source at the release tag (the PyPI wheel holds the same files). torch-free: numpy, scipy and dp_accounting only; the installed
version is read from package metadata without importing opacus.

This is the math half of one concept, "what each Opacus release does": the torch half, in
``opacus_lastiterate.auditing.opacus_releases``, probes a release's real code
(``probe``), checks a probe record against this model (``agreement``) and audits the real
code (``real_code_audit``). This module imports nothing of it (the math layer loads no torch).

Families:

* 0.9.0-0.11.0: no sampler in Opacus; the user's shuffled fixed-size DataLoader. Accountant
  q = batch_size / sample_size, RDP with the classic conversion. Divisor: the realised batch
  size ``|B|`` (ASGM). A batch larger than ``batch_size`` raises ``ValueError``.
* 0.12.0-0.13.0: as before, plus ``UniformWithReplacementSampler`` (Poisson); an empty
  Poisson batch crashes the run (default_collate of ``[]``). Divisor ``|B|`` (ASGM).
* 0.14.0-0.15.0: improved RDP conversion; the sampler drops empty batches; default divisor
  ``|B|`` (ASGM); ``PrivacyEngine(poisson=True)`` divides by sample_rate * sample_size (EASGM).
* 1.0.0-1.6.0: ``make_private`` divides by ``int(len(dataset) * sample_rate)`` (FEASGM,
  :func:`~opacus_lastiterate.analysis.normalisation.opacus1x_batch_arithmetic`), also
  without Poisson sampling; empty batches crash before 1.3.0; default accountant RDP up to
  1.2.0, PRV from 1.3.0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from opacus_lastiterate.analysis._validation import (
    check_delta,
    check_int,
    check_noise_multiplier,
)
from opacus_lastiterate.analysis.baselines.gaussian_mechanism import gaussian_epsilon
from opacus_lastiterate.analysis.opacus_releases import (
    OPACUS_RELEASES,
    SUM_REDUCTION_RULES,
    OpacusRelease,
    installed_release,
    release,
    releases_between,
)

__all__ = [
    "OPACUS_RELEASES",
    "OpacusRelease",
    "VersionComparison",
    "VersionConfig",
    "compare_versions",
    "corrected_epsilon",
    "divisor",
    "example_weighting",
    "installed_release",
    "release",
    "reported_epsilon",
]

# -- a training configuration ---------------------------------------------------------------


@dataclass(frozen=True)
class VersionConfig:
    """A training script's configuration, as every version would run it.

    Attributes:
        dataset_size: N = len(dataset).
        batch_size: L, the DataLoader batch size (0.x: also the ``batch_size`` argument).
        noise_multiplier: sigma.
        delta: target delta.
        epochs: number of epochs (steps per epoch follow each version's loader), or
        steps: a fixed number of steps (overrides epochs).
        dimension: number of trainable parameters d (for the FEASGM curve), optional.
        poisson: Poisson sampling where the version offers it (1.x ``poisson_sampling``,
            0.12-0.15 ``UniformWithReplacementSampler``); 0.9-0.11 always shuffle.
        loss_reduction: ``"mean"`` or ``"sum"``.
        drop_last: the user's DataLoader ``drop_last``.
    """

    dataset_size: int
    batch_size: int
    noise_multiplier: float
    delta: float
    epochs: int | None = 1
    steps: int | None = None
    dimension: int | None = None
    poisson: bool = True
    loss_reduction: Literal["mean", "sum"] = "mean"
    drop_last: bool = False

    def __post_init__(self) -> None:
        check_int("dataset_size", self.dataset_size, minimum=2)
        check_int("batch_size", self.batch_size, minimum=1)
        check_noise_multiplier(self.noise_multiplier)
        check_delta(self.delta)
        if self.steps is None and self.epochs is None:
            raise ValueError("give `epochs` or `steps`.")
        if self.steps is not None:
            check_int("steps", self.steps, minimum=1)
        if self.epochs is not None:
            check_int("epochs", self.epochs, minimum=1)
        if self.dimension is not None:
            check_int("dimension", self.dimension, minimum=1)
        if self.loss_reduction not in ("mean", "sum"):
            raise ValueError(f"`loss_reduction` must be 'mean' or 'sum', got {self.loss_reduction!r}.")
        if self.batch_size > self.dataset_size - 1:
            raise ValueError(
                f"`batch_size` must be < `dataset_size` (the neighbour N - 1 must fill a "
                f"batch), got {self.batch_size} and {self.dataset_size}."
            )


def _loader_length(n: int, b: int, drop_last: bool) -> int:
    return n // b if drop_last else (n + b - 1) // b


@dataclass(frozen=True)
class AccountingPlan:
    """How one version runs a configuration: the accountant's q and steps, the sampler's q
    (None: fixed-size shuffled batches), the divisor (None: the realised ``|B|``)."""

    poisson: bool  # records are really Poisson-sampled
    accountant_rate: float
    sampler_rate: float | None  # None: fixed-size shuffled batches
    steps: int
    divisor: float | None  # None: the realised |B|
    divisor_text: str


def _plan(rel: OpacusRelease, cfg: VersionConfig) -> AccountingPlan:
    n, b = cfg.dataset_size, cfg.batch_size
    k = _loader_length(n, b, cfg.drop_last)
    if rel.family == "1.x":
        from opacus_lastiterate.analysis.normalisation.opacus_arithmetic import (
            opacus1x_batch_arithmetic,
        )

        if cfg.poisson:
            row = opacus1x_batch_arithmetic(n, b, drop_last=cfg.drop_last)
            per_epoch, q_a, q_s, c = (
                row.steps_per_epoch, row.accountant_rate, row.sampler_rate, row.expected_batch_size,
            )
        else:  # make_private keeps the user's loader: q = 1 / len(loader)
            q_a = 1 / k
            per_epoch, q_s, c = k, None, int(n * q_a)
        steps = cfg.steps if cfg.steps is not None else per_epoch * int(cfg.epochs or 1)
        if cfg.loss_reduction == "sum":
            return AccountingPlan(cfg.poisson, q_a, q_s, steps, 1.0, "1 (loss_reduction='sum')")
        return AccountingPlan(cfg.poisson, q_a, q_s, steps, float(c), f"int(N * q) = {c}")
    q = b / n  # batch_size / sample_size
    poisson = cfg.poisson and rel.poisson_sampler
    per_epoch = int(1 / q) if poisson else k  # UniformWithReplacementSampler.__len__ / loader
    steps = cfg.steps if cfg.steps is not None else per_epoch * int(cfg.epochs or 1)
    if cfg.loss_reduction == "sum":
        return AccountingPlan(poisson, q, q if poisson else None, steps, 1.0, "1 (loss_reduction='sum')")
    return AccountingPlan(poisson, q, q if poisson else None, steps, None, "|B| (realised batch size)")


def accounting_plan(rel: OpacusRelease | str, config: VersionConfig) -> AccountingPlan:
    """How release ``rel`` runs ``config`` (:class:`AccountingPlan`)."""
    return _plan(release(rel) if isinstance(rel, str) else rel, config)


def divisor(
    rel: OpacusRelease | str,
    dataset_size: int,
    batch_size: int,
    realised_batch_size: int | None = None,
    *,
    poisson: bool = True,
    drop_last: bool = False,
    loss_reduction: str = "mean",
) -> float:
    """d in (sum_i w clip_{aC}(g_i) + Z) / d, the number the noise Z ~ N(0, sigma^2 C^2 I)
    (and the clipped sum) is divided by in version ``rel`` at one step; a and w are
    :func:`example_weighting`.

    1.x: ``int(N * sample_rate)`` exactly as Opacus computes it (independent of the batch);
    0.x: the realised batch size ``realised_batch_size`` (required). ``loss_reduction="sum"``
    gives 1."""
    r = release(rel) if isinstance(rel, str) else rel
    n = check_int("dataset_size", dataset_size, minimum=1)
    b = check_int("batch_size", batch_size, minimum=1)
    _check_reduction(loss_reduction)
    if loss_reduction == "sum":
        return 1.0
    if r.family == "1.x":
        from opacus_lastiterate.analysis.normalisation.opacus_arithmetic import (
            opacus1x_batch_arithmetic,
        )

        if poisson:
            return float(opacus1x_batch_arithmetic(n, b, drop_last=drop_last).expected_batch_size)
        return float(int(n * (1 / _loader_length(n, b, drop_last))))
    if realised_batch_size is None:
        raise ValueError(f"Opacus {r.version} divides by the realised batch size: give it.")
    return float(check_int("realised_batch_size", realised_batch_size, minimum=0))


def _check_reduction(loss_reduction: object) -> None:
    if loss_reduction not in ("mean", "sum"):
        raise ValueError(f"`loss_reduction` must be 'mean' or 'sum', got {loss_reduction!r}.")


@dataclass(frozen=True)
class ExampleWeighting:
    """How the per-example gradients g_i enter the update (sum_i w clip_{aC}(g_i) + Z) / d.

    Attributes:
        clip_scale: a; the effective clip norm is a * C.
        weight: w, each clipped gradient's weight in the sum.
    """

    clip_scale: float
    weight: float


def example_weighting(
    rel: OpacusRelease | str, realised_batch_size: int, *, loss_reduction: str = "mean"
) -> ExampleWeighting:
    """a = w = 1, except for ``loss_reduction="sum"`` in 0.9.x (a = ``1/|B|``, w = 1: the
    clipper clips ``|B| g_i`` at C and divides the sum by ``|B|``, the noise is not divided)
    and 0.14.0 (a = ``1/|B|``, w = ``|B|``: ``|B| g_i`` is clipped at C and summed), ``|B|``
    the realised batch size."""
    r = release(rel) if isinstance(rel, str) else rel
    b = check_int("realised_batch_size", realised_batch_size, minimum=1)
    _check_reduction(loss_reduction)
    if loss_reduction == "sum" and r.sum_reduction_bug in SUM_REDUCTION_RULES:
        clip_power, weight_power = SUM_REDUCTION_RULES[r.sum_reduction_bug]
        return ExampleWeighting(float(b) ** clip_power, float(b) ** weight_power)
    return ExampleWeighting(1.0, 1.0)


# -- epsilons -------------------------------------------------------------------------------


@lru_cache(maxsize=256)
def _rdp_epsilon(q: float, sigma: float, steps: int, delta: float, improved: bool) -> float:
    from opacus_lastiterate.analysis.baselines.rdp_conversion import (
        OPACUS_ORDERS,
        classic_conversion,
        improved_conversion,
        subsampled_gaussian_rdp,
    )

    rdp = subsampled_gaussian_rdp(q, sigma, steps, OPACUS_ORDERS)
    convert = improved_conversion if improved else classic_conversion
    return float(convert(OPACUS_ORDERS, rdp, delta)[0])


@lru_cache(maxsize=256)
def _pld_epsilon(q: float, sigma: float, steps: int, delta: float) -> float:
    from opacus_lastiterate.analysis.baselines.composition import standard_epsilon

    return float(standard_epsilon(delta, steps=steps, sample_rate=q, noise_multiplier=sigma))


@lru_cache(maxsize=256)
def _prv_epsilon(q: float, sigma: float, steps: int, delta: float, variant: str) -> float:
    from opacus_lastiterate.analysis.opacus_prv import opacus_prv_epsilon

    return opacus_prv_epsilon([(sigma, q, steps)], delta, variant=variant)  # type: ignore[arg-type]


def prv_variant(rel: OpacusRelease) -> str:
    """Which PRV arithmetic release ``rel`` runs (:data:`~opacus_lastiterate.analysis.
    opacus_prv.PRV_VARIANTS`): ``"1.3"`` for 1.3.0-1.4.0, ``"1.4.1"`` from 1.4.1."""
    return "1.3" if rel.key < (1, 4, 1) else "1.4.1"


ACCOUNTANT_LABELS = {
    "rdp-classic": "RDP, Opacus's DEFAULT_ALPHAS, classic conversion rdp - log(delta)/(a-1)",
    "rdp-improved": "RDP, Opacus's DEFAULT_ALPHAS, improved conversion (Balle et al. 2020)",
    "prv": "PRV (Opacus default from 1.3.0): Opacus's PRVAccountant arithmetic re-run "
    "(analysis.opacus_prv; the upper end of its eps_error = 0.01 interval, as it prints)",
}


def reported_epsilon(rel: OpacusRelease | str, config: VersionConfig) -> float:
    """The epsilon version ``rel`` itself prints for ``config`` with its default accountant
    (its own q and step count; RDP reproduced bit-for-bit, PRV by Opacus's own PRV arithmetic,
    :func:`~opacus_lastiterate.analysis.opacus_prv.opacus_prv_epsilon`, within 1e-6 of
    Opacus 1.6's ``PRVAccountant``)."""
    r = release(rel) if isinstance(rel, str) else rel
    p = _plan(r, config)
    sigma, delta = float(config.noise_multiplier), float(config.delta)
    if r.default_accountant == "prv":
        return _prv_epsilon(p.accountant_rate, sigma, p.steps, delta, prv_variant(r))
    return _rdp_epsilon(p.accountant_rate, sigma, p.steps, delta, r.default_accountant == "rdp-improved")


@lru_cache(maxsize=256)
def _corrected(key: tuple[Any, ...]) -> tuple[float, str]:
    (family, poisson, n, b, drop_last, sigma, delta, steps, q, epochs, sampler_rate, total) = key
    if not poisson:
        participations = epochs if epochs is not None else math.ceil(steps / _loader_length(n, b, drop_last))
        mu = 2.0 * math.sqrt(participations) / sigma
        return gaussian_epsilon(mu=mu, delta=delta), (
            f"shuffled fixed-size batches, no amplification: each record in one batch per "
            f"epoch, {participations} Gaussian step(s) of sensitivity 2C (replace-one "
            f"neighbours; the batch sizes and the divisor are then the same in both worlds)"
        )
    if total:
        rate = sampler_rate if sampler_rate is not None else q
        return _pld_epsilon(rate, sigma, steps, delta), (
            f"loss_reduction='sum': divisor 1 (public), SGM (PLD) at q = {rate:.6g}"
        )
    if family == "1.x":
        from opacus_lastiterate.analysis.normalisation.divisor_verdict import feasgm_verdict

        verdict = feasgm_verdict(n, b, drop_last=drop_last)
        if not verdict.safe:
            return math.inf, "FEASGM verdict: unsafe, no finite guarantee (" + verdict.reason + ")"
        return _pld_epsilon(sampler_rate, sigma, steps, delta), (
            "FEASGM verdict: safe, the divisor and q are the same for N - 1, N, N + 1; SGM "
            f"(PLD) at the sampler's q = {sampler_rate:.6g}"
        )
    from opacus_lastiterate.analysis.normalisation.asgm import ASGM_MODEL, asgm_epsilon

    return float(
        asgm_epsilon(delta, dataset_size=n, sample_rate=q, noise_multiplier=sigma, steps=steps)
    ), f"{ASGM_MODEL} (divisor |B|), q = {q:.6g}"


def corrected_epsilon(rel: OpacusRelease | str, config: VersionConfig) -> tuple[float, str]:
    """(epsilon, model) for what version ``rel`` really runs: SGM when the divisor and q are
    public (FEASGM verdict safe), inf when the 1.x divisor changes between neighbours, the
    ASGM model for 0.x's division by ``|B|``, and a no-amplification bound for shuffled batches."""
    r = release(rel) if isinstance(rel, str) else rel
    p = _plan(r, config)
    key = (
        r.family if r.family == "1.x" else "0.x",
        p.poisson,
        config.dataset_size,
        config.batch_size,
        config.drop_last,
        float(config.noise_multiplier),
        float(config.delta),
        p.steps,
        p.accountant_rate,
        config.epochs if config.steps is None else None,
        p.sampler_rate,
        config.loss_reduction == "sum",
    )
    return _corrected(key)


@lru_cache(maxsize=256)
def _heuristic(q: float, sigma: float, steps: int, delta: float) -> float:
    from opacus_lastiterate.analysis.privacy_models import privacy_model
    from opacus_lastiterate.analysis.run import DPSGDRun

    run = DPSGDRun.constant(steps=steps, sample_rate=q, noise_multiplier=sigma)
    return float(privacy_model("heuristic", run).epsilon(delta))


@lru_cache(maxsize=64)
def _curve(n: int, b: int, drop_last: bool, sigma: float, steps: int, dim: int, delta: float) -> float:
    from opacus_lastiterate.analysis.normalisation.divisor_leak import feasgm_epsilon

    return float(
        feasgm_epsilon(
            delta, dataset_size=n, batch_size=b, noise_multiplier=sigma, steps=steps,
            dimension=dim, drop_last=drop_last,
        )
    )


# -- the comparison -------------------------------------------------------------------------


@dataclass(frozen=True)
class VersionComparison:
    """One row of ``compare-versions``."""

    version: str
    mechanism: str
    accountant: str
    sample_rate: float
    sampler_rate: float | None
    steps: int
    divisor: str
    reported: float
    corrected: float
    corrected_model: str
    heuristic: float
    curve: float | None
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        def num(x: float | None) -> float | str | None:
            if x is None or math.isfinite(x):
                return x
            return "inf" if x > 0 else "nan"

        return {
            "version": self.version,
            "mechanism": self.mechanism,
            "accountant": self.accountant,
            "sample_rate": self.sample_rate,
            "sampler_rate": self.sampler_rate,
            "steps": self.steps,
            "divisor": self.divisor,
            "reported": num(self.reported),
            "corrected": num(self.corrected),
            "corrected_model": self.corrected_model,
            "heuristic": num(self.heuristic),
            "curve": num(self.curve),
            "warnings": list(self.warnings),
        }


SHUFFLE_NOTE = (
    "fixed-size shuffled batches accounted as if Poisson: the Poisson guarantee is not what "
    "this code implements; audits of shuffled DP-SGD (How Private are DP-SGD "
    "Implementations?, arXiv 2403.17673; To Shuffle or not To Shuffle: Auditing DP-SGD with "
    "Shuffling, arXiv 2411.10614) show the true epsilon can exceed the Poisson one"
)


def _warnings(rel: OpacusRelease, cfg: VersionConfig, p: AccountingPlan) -> list[str]:
    out: list[str] = []
    n, b = cfg.dataset_size, cfg.batch_size
    if not p.poisson:
        out.append(SHUFFLE_NOTE)
    if cfg.poisson and rel.family == "0.9-0.11":
        out.append(
            "no Poisson sampler in this version, and a batch larger than batch_size raises "
            "ValueError: Poisson-sized batches cannot run"
        )
    if p.poisson and p.sampler_rate is not None:
        empty = (1.0 - p.sampler_rate) ** n
        crash = -math.expm1(p.steps * math.log1p(-empty)) if empty < 1 else 1.0
        if rel.crashes_on_empty and crash > 1e-9:
            out.append(
                f"crash on empty batch: P(empty step) = {empty:.3g}, P(run crashes) = {crash:.3g} "
                f"({rel.empty_batch})"
            )
        elif rel.family == "0.14-0.15" and empty > 1e-9:
            out.append(f"empty batches (P = {empty:.3g} per step) are dropped by the sampler")
    if rel.family == "1.x" and cfg.loss_reduction == "mean" and p.divisor is not None:
        c = p.divisor
        if c == 0:
            out.append("divisor 0: expected_batch_size = 0, the update is inf/NaN")
        if c > b:
            out.append(f"divisor {c:g} above the batch size {b}")
        if p.sampler_rate is not None and p.sampler_rate != p.accountant_rate:
            out.append(
                f"sample rate mismatch: accountant q = {p.accountant_rate:.10g}, sampler q = "
                f"{p.sampler_rate:.10g} (int(1/(1/k)) = k - 1)"
            )
        if not p.poisson and n % b and not cfg.drop_last:
            out.append(f"the last batch ({n % b} records) is also divided by {c:g}")
    if rel.family == "0.14-0.15" and p.poisson:
        out.append(
            "with PrivacyEngine(poisson=True) this version divides by sample_rate * "
            "sample_size instead (EASGM); modelled here: the default poisson=False"
        )
    if cfg.loss_reduction == "sum" and rel.sum_reduction_bug:
        out.append(rel.sum_reduction_bug)
    return out


def compare_versions(
    config: VersionConfig, versions: str | None = None
) -> list[VersionComparison]:
    """One :class:`VersionComparison` per selected release (``versions``: see
    :func:`releases_between`)."""
    rows = []
    for rel in releases_between(versions):
        p = _plan(rel, config)
        sigma, delta = float(config.noise_multiplier), float(config.delta)
        corrected, model = corrected_epsilon(rel, config)
        curve = None
        if (
            config.dimension is not None and rel.family == "1.x" and p.poisson
            and config.loss_reduction == "mean"
        ):
            curve = _curve(
                config.dataset_size, config.batch_size, config.drop_last, sigma, p.steps,
                int(config.dimension), delta,
            )
        mechanism = rel.mechanism if config.loss_reduction == "mean" else "SGM (sum)"
        rows.append(
            VersionComparison(
                version=rel.version,
                mechanism=mechanism + ("" if p.poisson else ", shuffled"),
                accountant=rel.default_accountant,
                sample_rate=p.accountant_rate,
                sampler_rate=p.sampler_rate,
                steps=p.steps,
                divisor=p.divisor_text,
                reported=reported_epsilon(rel, config),
                corrected=corrected,
                corrected_model=model,
                heuristic=_heuristic(p.accountant_rate, sigma, p.steps, delta),
                curve=curve,
                warnings=tuple(_warnings(rel, config, p)),
            )
        )
    return rows

