"""The Opacus releases 0.9.0-1.6.0, one row each: what each does to a DP-SGD run.

The rows of the release table (``docs/opacus_versions.md``): sampler, divisor, accountant and
conversion, the loss-reduction bug and what an empty batch does, each citing Opacus's source
at the release tag. :mod:`opacus_lastiterate.analysis.opacus_versions` runs a training
configuration through them. torch-free; the installed version is read from package metadata
without importing opacus.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "OPACUS_RELEASES",
    "OpacusRelease",
    "installed_release",
    "release",
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
        adaptive_clipping: what ``AdaClipDPOptimizer`` hands the accountant (text), or ""
            when the release has no adaptive clipping (before 1.1.3).
        ghost_clipping: the ghost (fast gradient) clipping path's divisor and steps
            (text), or "" before 1.5.
        distributed: DDP/FSDP: the divisor each rank uses and the global one (text), or ""
            where not modelled (0.x).
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
    adaptive_clipping: str = ""
    ghost_clipping: str = ""
    distributed: str = ""

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


_ADACLIP_ADJUSTED = (
    "AdaClipDPOptimizer adds sigma_eff = (sigma^-2 - (2 sigma_u)^-2)^(-1/2) to the gradients "
    "and overwrites optimizer.noise_multiplier with it (optimizers/adaclipoptimizer.py "
    "__init__), so the accountant records sigma_eff > sigma: the printed epsilon is too "
    "small (Theorem 1 of Andrew et al. accounts sigma); fixed in 1.6.0 (PR #807)"
)
_ADACLIP_FIXED = (
    "AdaClipDPOptimizer adds sigma_eff to the gradients inside add_noise and keeps the "
    "user's sigma in optimizer.noise_multiplier: the accountant records sigma (PR #807)"
)
_GHOST = (
    "DPOptimizerFastGradientClipping: divisor expected_batch_size (accumulated_iterations "
    "is fixed to 1); BatchMemoryManager: one noisy step per logical batch"
)
_GHOST_ZERO = (
    "; k backward passes before one step (Opacus #683): each DPTensorFastGradientClipping."
    "backward calls optimizer.zero_grad() between its passes, so only the last micro-batch "
    "is released, (S_last + Z) / expected_batch_size, at the recorded q (measured on 1.5.4 "
    "and 1.6.0)"
)
_DDP_BUG = (
    "DDP: each rank divides by expected_batch_size = int(N q) and the all-reduce averages "
    "over W ranks: global divisor W * int(N q) (1.0.2 divides by W)"
)
_DDP_OK = (
    "DDP: each rank divides by expected_batch_size = int(N q) / W (a float), noise on rank "
    "0 only, all-reduce mean: global divisor int(N q); every rank's accountant records the "
    "same (sigma, q)"
)
_FSDP = (
    "; FSDP (grad_sample_mode='ghost_fsdp', FSDPOptimizerFastGradientClipping): per rank "
    "int(N q) / W, noise / W on each rank's shard, reduce-scatter mean: global divisor "
    "int(N q) (measured, 2 ranks, gloo)"
)


_GHOST_ALIAS = (
    "; with BatchMemoryManager, accumulate() adds p.grad to summed_grad by reference "
    "(optimizers/optimizer_fast_gradient_clipping.py; copied from 1.5.3, PR #707): not "
    "measured here"
)


def _modes(version: str) -> tuple[str, str, str]:
    key = _version_key(version)
    ada = "" if key < (1, 1, 3) else (_ADACLIP_FIXED if key >= (1, 6, 0) else _ADACLIP_ADJUSTED)
    ghost = "" if key < (1, 5, 0) else _GHOST + (_GHOST_ZERO if key >= (1, 5, 2) else "")
    if (1, 5, 0) <= key < (1, 5, 3):
        ghost += _GHOST_ALIAS
    ddp = _DDP_BUG if key < (1, 0, 2) else _DDP_OK + (_FSDP if key >= (1, 6, 0) else "")
    return ada, ghost, ddp


def _d(version: str, q: int, ebs: int, scale: int, acc: int, empty: int | None, accountant: Accounting) -> OpacusRelease:
    empty_text = (
        f"{_D_OK} (optimizers/optimizer.py:{empty})" if empty is not None else _D_CRASH
    )
    ada, ghost, ddp = _modes(version)
    return OpacusRelease(
        version, "1.x", "FEASGM", True, accountant, empty_text, empty is None,
        f"sample_rate = 1 / len(data_loader) :{q}; expected_batch_size = int(len(dataset) * "
        f"sample_rate) :{ebs}; optimizers/optimizer.py:{scale} p.grad /= expected_batch_size "
        f"* accumulated_iterations; PrivacyEngine(accountant=...) default :{acc}",
        adaptive_clipping=ada,
        ghost_clipping=ghost,
        distributed=ddp,
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
SUM_REDUCTION_RULES: dict[str, tuple[int, int]] = {_SUM9: (-1, 0), _SUM14: (-1, 1)}
"""``loss_reduction="sum"`` bug of a release (:attr:`OpacusRelease.sum_reduction_bug`) ->
(clip scale, weight) of each example, as powers of the realised batch size."""

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
