"""What each Opacus release (0.9.0-1.6.0) does to a DP-SGD run, and what it reports.

``docs/opacus_versions.md`` has the table in words. One row per PyPI release in
:data:`OPACUS_RELEASES`; every rule cites Opacus's source at the release tag (the PyPI wheel
holds the same files). torch-free: numpy, scipy and dp_accounting only; the installed
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

__all__ = [
    "OPACUS_RELEASES",
    "ExampleWeighting",
    "OpacusRelease",
    "VersionComparison",
    "VersionConfig",
    "compare_versions",
    "corrected_epsilon",
    "divisor",
    "example_weighting",
    "installed_release",
    "installed_version",
    "release",
    "releases_between",
    "reported_epsilon",
]

Family = Literal["0.9-0.11", "0.12-0.13", "0.14-0.15", "1.x"]
Accounting = Literal["rdp-classic", "rdp-improved", "prv"]


@dataclass(frozen=True)
class OpacusRelease:
    """One Opacus release. ``source`` cites Opacus's files at that release's tag.

    Attributes:
        version: the PyPI version string.
        family: the group of releases with the same rules (module docstring).
        mechanism: the default normalisation class: ``"ASGM"`` (divide by ``|B|``) or
            ``"FEASGM"`` (divide by int(N * q)).
        poisson_sampler: Opacus ships a Poisson sampler.
        default_accountant: ``"rdp-classic"``, ``"rdp-improved"`` or ``"prv"``.
        empty_batch: what a Poisson run does at an empty batch.
        crashes_on_empty: an empty Poisson batch ends the run with an exception.
        sum_reduction_bug: ``loss_reduction="sum"`` is mis-normalised (text), or "".
        source: file:line citations (privacy_engine.py unless named).
    """

    version: str
    family: Family
    mechanism: Literal["ASGM", "FEASGM"]
    poisson_sampler: bool
    default_accountant: Accounting
    empty_batch: str
    crashes_on_empty: bool
    source: str
    sum_reduction_bug: str = ""

    @property
    def key(self) -> tuple[int, ...]:
        return _version_key(self.version)


def _version_key(version: str) -> tuple[int, ...]:
    parts = []
    for part in version.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts[:3])


_A_EMPTY = "no Opacus sampler; a 0-row batch crashes (utils/tensor_utils.py reshape)"
_B_EMPTY = "UniformWithReplacementSampler yields [] and default_collate raises IndexError"
_C_EMPTY = (
    "the sampler drops empty batches (utils/uniform_sampler.py); with poisson=True the "
    "engine inserts noise-only steps (crash on torch >= 2 without a zero_grad shim)"
)
_D_CRASH = "0-row batch crashes in DPOptimizer.clip_and_accumulate (g.view(len(g), -1))"
_D_OK = "noise-only step divided by expected_batch_size; the accountant steps as usual"


def _a(version: str, q: int, noise: int, clip: int, check: int, conv: int, bug: str = "") -> OpacusRelease:
    return OpacusRelease(
        version, "0.9-0.11", "ASGM", False, "rdp-classic", _A_EMPTY, True,
        f"q = batch_size / sample_size :{q}; ValueError if |B| > batch_size :{check}; "
        f"noise /= batch_size :{noise}; per_sample_gradient_clip.py:{clip} summed_grad / "
        f"batch_size (realised); privacy_analysis.py:{conv} classic conversion",
        bug,
    )


def _d(version: str, q: int, ebs: int, scale: int, acc: int, empty: int | None, accountant: Accounting) -> OpacusRelease:
    empty_text = (
        f"{_D_OK} (optimizers/optimizer.py:{empty})" if empty is not None else _D_CRASH
    )
    return OpacusRelease(
        version, "1.x", "FEASGM", True, accountant, empty_text, empty is None,
        f"sample_rate = 1 / len(data_loader) :{q}; expected_batch_size = int(len(dataset) * "
        f"sample_rate) :{ebs}; optimizers/optimizer.py:{scale} p.grad /= expected_batch_size "
        f"* accumulated_iterations; PrivacyEngine(accountant=...) default :{acc}",
    )


_SUM9 = (
    "loss_reduction='sum': the clipper ignores it (privacy_engine.py:187 in 0.9.0): per-example "
    "gradients are computed as |B| g_i, clipped at C and their sum (not the noise) divided by "
    "|B|, so the effective clip norm is C/|B| while the noise stays sigma*C"
)
_SUM14 = (
    "loss_reduction='sum': GradSampleModule(module) (privacy_engine.py:156) keeps 'mean': "
    "per-example gradients are computed as |B| g_i and clipped at C, the noisy sum is not "
    "divided (unclipped gradients come out |B| times too large)"
)
# loss_reduction="sum": per-example (clip scale, weight) as powers of the realised |B|
_SUM_RULES = {_SUM9: (-1, 0), _SUM14: (-1, 1)}

#: The 26 PyPI releases, oldest first.
OPACUS_RELEASES: tuple[OpacusRelease, ...] = (
    _a("0.9.0", 99, 284, 292, 266, 349, _SUM9),
    _a("0.9.1", 97, 282, 292, 264, 349, _SUM9),
    _a("0.10.0", 83, 291, 287, 273, 292),
    _a("0.10.1", 83, 294, 287, 276, 292),
    _a("0.11.0", 82, 302, 287, 284, 292),
    *(
        OpacusRelease(
            v, "0.12-0.13", "ASGM", True, "rdp-classic", _B_EMPTY, True,
            "q = sample_rate or batch_size / sample_size :134, :515; noise /= batch_size "
            ":366; per_sample_gradient_clip.py:294 (realised); utils/uniform_sampler.py "
            "Poisson sampler; privacy_analysis.py:298 classic conversion",
        )
        for v in ("0.12.0", "0.13.0")
    ),
    OpacusRelease(
        "0.14.0", "0.14-0.15", "ASGM", True, "rdp-improved", _C_EMPTY, False,
        "q :145, :636; default poisson=False: noise /= batch_size :476 (realised); "
        "poisson=True: p.grad *= batch_size / avg_batch_size :488, avg = sample_rate * "
        "sample_size :643; privacy_analysis.py:300-303 improved conversion",
        _SUM14,
    ),
    OpacusRelease(
        "0.15.0", "0.14-0.15", "ASGM", True, "rdp-improved", _C_EMPTY, False,
        "q :148, :750; default poisson=False: noise /= batch_size :520 (realised); "
        "poisson=True: :526, avg = sample_rate * sample_size :757; privacy_analysis.py:"
        "300-303 improved conversion",
    ),
    _d("1.0.0", 344, 345, 413, 69, None, "rdp-improved"),
    _d("1.0.1", 342, 343, 415, 69, None, "rdp-improved"),
    _d("1.0.2", 342, 343, 420, 69, None, "rdp-improved"),
    _d("1.1.0", 356, 357, 443, 83, None, "rdp-improved"),
    _d("1.1.1", 356, 357, 443, 83, None, "rdp-improved"),
    _d("1.1.2", 372, 373, 443, 99, None, "rdp-improved"),
    _d("1.1.3", 390, 391, 444, 102, None, "rdp-improved"),
    _d("1.2.0", 411, 412, 444, 110, None, "rdp-improved"),
    _d("1.3.0", 412, 413, 448, 110, 397, "prv"),
    _d("1.4.0", 412, 413, 448, 110, 397, "prv"),
    _d("1.4.1", 365, 366, 448, 64, 397, "prv"),
    _d("1.5", 368, 369, 451, 64, 398, "prv"),
    _d("1.5.1", 368, 369, 451, 64, 398, "prv"),
    _d("1.5.2", 368, 369, 488, 64, 435, "prv"),
    _d("1.5.3", 401, 402, 489, 65, 436, "prv"),
    _d("1.5.4", 407, 408, 489, 65, 436, "prv"),
    _d("1.6.0", 440, 441, 504, 67, 438, "prv"),
)

_BY_KEY = {r.key: r for r in OPACUS_RELEASES}


def release(version: str) -> OpacusRelease:
    """The row of ``version`` ("1.5" and "1.5.0" are the same release); ValueError if it is
    not one of the 26 releases."""
    key = _version_key(str(version).split("+")[0])
    try:
        return _BY_KEY[key]
    except KeyError:
        raise ValueError(
            f"unknown Opacus version {version!r}; known: "
            f"{', '.join(r.version for r in OPACUS_RELEASES)}."
        ) from None


def releases_between(spec: str | None) -> tuple[OpacusRelease, ...]:
    """Releases selected by ``"A..B"`` (inclusive; either end may be empty), ``"A,B,C"`` or
    one version; all releases for None or ""."""
    if not spec:
        return OPACUS_RELEASES
    if ".." in spec:
        lo_text, hi_text = spec.split("..", 1)
        lo = release(lo_text).key if lo_text else (0, 0, 0)
        hi = release(hi_text).key if hi_text else (99, 0, 0)
        if lo > hi:
            raise ValueError(f"empty version range {spec!r}.")
        return tuple(r for r in OPACUS_RELEASES if lo <= r.key <= hi)
    return tuple(release(v.strip()) for v in spec.split(","))


def installed_version() -> str | None:
    """The installed opacus distribution's version, from package metadata (opacus is not
    imported); None when it is not installed."""
    from importlib import metadata

    try:
        return metadata.version("opacus")
    except metadata.PackageNotFoundError:
        return None


def installed_release() -> OpacusRelease | None:
    """The row of the installed Opacus (None when absent or not one of the 26 releases)."""
    version = installed_version()
    if version is None:
        return None
    try:
        return release(version)
    except ValueError:
        return None


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
class _Plan:
    """How one version runs a configuration: accountant's q and steps, sampler's q."""

    poisson: bool  # records are really Poisson-sampled
    accountant_rate: float
    sampler_rate: float | None  # None: fixed-size shuffled batches
    steps: int
    divisor: float | None  # None: the realised |B|
    divisor_text: str


def _plan(rel: OpacusRelease, cfg: VersionConfig) -> _Plan:
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
            return _Plan(cfg.poisson, q_a, q_s, steps, 1.0, "1 (loss_reduction='sum')")
        return _Plan(cfg.poisson, q_a, q_s, steps, float(c), f"int(N * q) = {c}")
    q = b / n  # batch_size / sample_size
    poisson = cfg.poisson and rel.poisson_sampler
    per_epoch = int(1 / q) if poisson else k  # UniformWithReplacementSampler.__len__ / loader
    steps = cfg.steps if cfg.steps is not None else per_epoch * int(cfg.epochs or 1)
    if cfg.loss_reduction == "sum":
        return _Plan(poisson, q, q if poisson else None, steps, 1.0, "1 (loss_reduction='sum')")
    return _Plan(poisson, q, q if poisson else None, steps, None, "|B| (realised batch size)")


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
    if loss_reduction == "sum" and r.sum_reduction_bug in _SUM_RULES:
        clip_power, weight_power = _SUM_RULES[r.sum_reduction_bug]
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


ACCOUNTANT_LABELS = {
    "rdp-classic": "RDP, Opacus's DEFAULT_ALPHAS, classic conversion rdp - log(delta)/(a-1)",
    "rdp-improved": "RDP, Opacus's DEFAULT_ALPHAS, improved conversion (Balle et al. 2020)",
    "prv": "PRV (Opacus default from 1.3.0); computed here with the PLD accountant, "
    "which agrees with Opacus's PRVAccountant within its eps_error = 0.01",
}


def reported_epsilon(rel: OpacusRelease | str, config: VersionConfig) -> float:
    """The epsilon version ``rel`` itself prints for ``config`` with its default accountant
    (its own q and step count; RDP reproduced bit-for-bit, PRV via the PLD accountant)."""
    r = release(rel) if isinstance(rel, str) else rel
    p = _plan(r, config)
    sigma, delta = float(config.noise_multiplier), float(config.delta)
    if r.default_accountant == "prv":
        return _pld_epsilon(p.accountant_rate, sigma, p.steps, delta)
    return _rdp_epsilon(p.accountant_rate, sigma, p.steps, delta, r.default_accountant == "rdp-improved")


def _gaussian_epsilon(mu: float, delta: float) -> float:
    """epsilon(delta) of a Gaussian mechanism with sensitivity / sigma = mu."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    def excess(eps: float) -> float:
        return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)) - delta

    if excess(0.0) <= 0:
        return 0.0
    hi = 1.0
    while excess(hi) > 0:
        hi *= 2
    return float(brentq(excess, 0.0, hi, xtol=1e-10))


@lru_cache(maxsize=256)
def _corrected(key: tuple[Any, ...]) -> tuple[float, str]:
    (family, poisson, n, b, drop_last, sigma, delta, steps, q, epochs, sampler_rate, total) = key
    if not poisson:
        participations = epochs if epochs is not None else math.ceil(steps / _loader_length(n, b, drop_last))
        mu = 2.0 * math.sqrt(participations) / sigma
        return _gaussian_epsilon(mu, delta), (
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
    from opacus_lastiterate.analysis.last_iterate.heuristic import heuristic_epsilon

    return float(heuristic_epsilon(delta, steps=steps, sample_rate=q, noise_multiplier=sigma))


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


def _warnings(rel: OpacusRelease, cfg: VersionConfig, p: _Plan) -> list[str]:
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
