"""The noise multiplier that meets a target epsilon (``docs/cli.md``, "Calibration").

For T steps at constant sample rate q, every privacy model of this package gives an epsilon
that decreases as the noise multiplier sigma grows (more noise of the same signal), so the
smallest sigma with ``epsilon(sigma) <= target`` is found by a root search on log sigma. The
answer is returned on the safe side: the model's epsilon at the returned sigma is at most the
target, and sigma is within a relative ``rtol`` of the exact crossing.

Accountants, by their names in the registry of privacy models
(:mod:`opacus_lastiterate.analysis.privacy_models`, whose :func:`~.privacy_models.choose`
picks the model for the run's sampling scheme): ``"heuristic"`` (last-iterate
heuristic, final model only, not a proven bound for deep networks), ``"robust_heuristic"``
(its max over the last t <= T steps), ``"standard"`` (composition over all iterates, dp_accounting PLD, an
upper bound) and ``"full_batch"`` (full-batch DP-GD with the same expected step and noise,
closed form).

**Adaptive optimizers** (``docs/adaptive_optimizers.md``). With ``optimizer_settings`` (the
settings of Adam, AdamW, ... at every planned step, or one for every step) the heuristic is
the weighted heuristic with the optimizer's frozen-second-moment weights, labelled
"heuristic; adaptive second moment treated as fixed". Those weights depend on the noise the
optimizer sees, sigma x ``noise_scale`` (``noise_scale`` = C / B, the clipping norm over the
expected batch size), so they are recomputed at every noise multiplier tried
(:func:`~.last_iterate.adaptive_weights.adaptive_weights`; the run is answered as an
accountant's recorded run, by :class:`~.kept_model.KeptModel`). What is calibrated is the run the
settings describe: a learning-rate schedule, betas or weight decay not in them are not
assumed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal

from opacus_lastiterate.analysis._validation import (
    check_delta,
    check_in_interval,
    check_positive,
    check_sample_rate,
    check_steps,
)
from opacus_lastiterate.analysis.baselines.composition import DEFAULT_DISCRETIZATION
from opacus_lastiterate.analysis.kept_model import KeptModel
from opacus_lastiterate.analysis.last_iterate.adaptive_steps import AdaptiveStep
from opacus_lastiterate.analysis.last_iterate.adaptive_weights import (
    AdaptiveSettings,
    adaptive_weights,
)
from opacus_lastiterate.analysis.privacy_model import PrivacyModel
from opacus_lastiterate.analysis.privacy_models import choose
from opacus_lastiterate.analysis.run import DPSGDRun, TrainingSegment
from opacus_lastiterate.analysis.sampling import SamplingScheme

__all__ = [
    "calibrate_noise_multiplier",
]

Accountant = Literal["heuristic", "robust_heuristic", "standard", "full_batch"]
CALIBRATED_ACCOUNTANTS: tuple[str, ...] = ("heuristic", "robust_heuristic", "standard", "full_batch")
"""The accountants :func:`calibrate_noise_multiplier` can calibrate (registry names)."""

_SIGMA_RANGE = (1e-4, 1e6)  # the search gives up outside this range of noise multipliers
_COARSE_INTERVAL = 1e-3  # PLD interval of the first, coarse search of the standard accountant


def canonical_accountant(accountant: object, name: str = "accountant") -> str:
    """``accountant`` if it is a registry name of :data:`CALIBRATED_ACCOUNTANTS`; anything
    else is a ValueError (TypeError when not a string) naming ``name``."""
    if not isinstance(accountant, str):
        raise TypeError(
            f"`{name}` must be one of {', '.join(CALIBRATED_ACCOUNTANTS)}, got {accountant!r} of "
            f"type {type(accountant).__name__}."
        )
    if accountant not in CALIBRATED_ACCOUNTANTS:
        raise ValueError(
            f"`{name}` must be one of {', '.join(CALIBRATED_ACCOUNTANTS)}, got {accountant!r}."
        )
    return accountant


def _model(
    accountant: str, steps: int, sample_rate: float, interval: float,
    sampling: SamplingScheme | None,
    adaptive: tuple[list[AdaptiveSettings], float] | None = None,
) -> Callable[[float], PrivacyModel | KeptModel]:
    """The registry's model ``accountant`` of the run at noise multiplier sigma, as
    :func:`~.privacy_models.choose` decides it for the scheme (the run is checked once);
    with ``adaptive`` = (settings per step, C / B), the run recorded with those settings and
    noise std sigma C / B (:class:`~.kept_model.KeptModel`, whose heuristic reads the
    adaptive weights at that sigma)."""
    params = {"value_discretization_interval": interval} if accountant == "standard" else {}
    run = DPSGDRun.constant(
        steps=steps, sample_rate=sample_rate, noise_multiplier=1.0, sampling=sampling
    )
    choice = choose(accountant, sampling=run.sampling, weighted=False)

    def build(sigma: float) -> PrivacyModel | KeptModel:
        segment = TrainingSegment(sigma, sample_rate, steps)
        scheme_run = DPSGDRun.from_history([segment], sampling=run.sampling)
        if adaptive is None:
            return choice.build(scheme_run, **params)
        # the adaptive run as an accountant records it: the chooser's kept engine answers
        # (an Adam or AdamW run through its SGD equivalent), as for a trained run
        runs: list[tuple[AdaptiveStep, int]] = []
        for settings in adaptive[0]:
            step = AdaptiveStep(settings, sigma * adaptive[1])
            if runs and runs[-1][0] == step:
                runs[-1] = (step, runs[-1][1] + 1)
            else:
                runs.append((step, 1))
        return KeptModel.from_run(scheme_run, runs)

    return build


def _adaptive(
    accountant: str, settings: object, noise_scale: float, steps: int
) -> tuple[list[AdaptiveSettings], float] | None:
    """(settings per step, C / B) of ``optimizer_settings``, validated; None without."""
    if settings is None:
        return None
    if accountant != "heuristic":
        raise ValueError(
            f"`optimizer_settings` is for accountant='heuristic' (the one that reads the "
            f"adaptive weights), got {accountant!r}."
        )
    scale = check_positive("noise_scale", noise_scale)
    if isinstance(settings, AdaptiveSettings):
        return [settings] * steps, scale
    if isinstance(settings, (str, bytes)) or not isinstance(settings, Sequence):
        raise TypeError(
            "`optimizer_settings` must be an AdaptiveSettings or a sequence of them, got "
            f"{type(settings).__name__}."
        )
    if len(settings) != steps:
        raise ValueError(
            f"`optimizer_settings` must have one entry per step ({steps}), got {len(settings)}."
        )
    adaptive_weights(list(settings), noise_std=1.0)  # a TypeError/ValueError naming the entry
    return list(settings), scale


def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    *,
    steps: int,
    sample_rate: float,
    accountant: Accountant = "heuristic",
    sampling: SamplingScheme | None = None,
    value_discretization_interval: float = DEFAULT_DISCRETIZATION,
    rtol: float = 1e-4,
    optimizer_settings: AdaptiveSettings | Sequence[AdaptiveSettings] | None = None,
    noise_scale: float = 1.0,
) -> float:
    """Smallest noise multiplier (within ``rtol`` relative, rounded up) whose epsilon at
    ``delta`` is at most ``target_epsilon`` for T = ``steps`` steps at rate ``sample_rate``.

    Args:
        target_epsilon: the epsilon to meet, > 0.
        delta: delta in (0, 1).
        steps: T >= 1.
        sample_rate: the sampling rate q in (0, 1] (the expected batch size over the
            dataset size).
        accountant: one of :data:`CALIBRATED_ACCOUNTANTS` (module docstring).
        sampling: how the batches are drawn (:mod:`~.sampling`; None: Poisson at
            ``sample_rate``); the number is the registry's for that scheme.
        value_discretization_interval: PLD value discretisation interval of the standard
            accountant (default 1e-4, :mod:`~.privacy_models`).
        rtol: relative accuracy of the returned sigma, in (0, 0.1].
        optimizer_settings: an adaptive optimizer's settings (module docstring, "Adaptive
            optimizers"): one :class:`~.last_iterate.adaptive_weights.AdaptiveSettings` for
            every step, or one per step (a schedule); only with ``accountant="heuristic"``.
            The returned sigma then meets the target on the heuristic with the optimizer's
            weights ("heuristic; adaptive second moment treated as fixed").
        noise_scale: with ``optimizer_settings``, C / B > 0 (``max_grad_norm`` over the
            expected batch size): the optimizer sees noise of std sigma x ``noise_scale``
            per coordinate, which sets the weights (against the optimizer's eps).

    Raises:
        ValueError: no noise multiplier in [1e-4, 1e6] meets the target; bad
            ``optimizer_settings`` (named, as TypeError when not settings).
    """
    target = check_positive("target_epsilon", target_epsilon)
    d = check_delta(delta)
    t = check_steps(steps, minimum=1)
    q = check_sample_rate(sample_rate)
    accountant = canonical_accountant(accountant)  # type: ignore[assignment]
    interval = check_positive("value_discretization_interval", value_discretization_interval)
    tol = check_in_interval("rtol", rtol, 0.0, 0.1, high_open=False)
    build = _model(
        accountant, t, q, interval, sampling, _adaptive(accountant, optimizer_settings, noise_scale, t)
    )

    seen: dict[float, float] = {}

    def excess(log_sigma: float) -> float:  # memoised: the root search revisits its ends
        if log_sigma not in seen:
            seen[log_sigma] = build(math.exp(log_sigma)).epsilon(d) - target
        return seen[log_sigma]

    if accountant == "standard" and interval < _COARSE_INTERVAL:
        # the fine PLD is slow at small sigma: locate the root on a coarse grid first (its
        # pessimistic epsilon is about the fine one, a little above), then refine nearby
        coarse = calibrate_noise_multiplier(
            target, d, steps=t, sample_rate=q, accountant="standard", sampling=sampling,
            value_discretization_interval=_COARSE_INTERVAL, rtol=tol,
        )
        lo, hi = _bracket(excess, math.log(coarse), growth=0.002)
    elif accountant in ("robust_heuristic", "standard"):
        # both are >= the heuristic at every sigma, so their sigma is >= the heuristic's:
        # start there and grow slowly (the PLD accountant is slow at small sigma)
        start = math.log(calibrate_noise_multiplier(
            target, d, steps=t, sample_rate=q, sampling=sampling, rtol=tol
        ))
        lo, hi = _bracket(excess, start - math.log1p(tol), growth=0.25)
    else:
        lo, hi = _bracket(excess, 0.0, growth=1.0)
    if lo == -math.inf:
        return _SIGMA_RANGE[0]  # even the smallest sigma searched meets the target
    # Brent's method on log sigma inside the bracket excess(lo) > 0 >= excess(hi); the root
    # is within step / 2, so root + step / 2 meets the target unless the model's epsilon
    # jumps (PLD discretisation): then bisect what is left of the bracket.
    from scipy import optimize

    step = math.log1p(tol)
    root = optimize.brentq(excess, lo, hi, xtol=step / 2)
    candidate = min(root + step / 2, hi)
    if excess(candidate) <= 0:
        return math.exp(candidate)
    lo = candidate
    while hi - lo > step:
        mid = 0.5 * (lo + hi)
        if excess(mid) > 0:
            lo = mid
        else:
            hi = mid
    return math.exp(hi)


def _bracket(excess: Callable[[float], float], start: float, growth: float) -> tuple[float, float]:
    """(lo, hi) on log sigma with excess(lo) > 0 >= excess(hi), searched from ``start`` in
    steps of ``growth``; lo = -inf when excess <= 0 down to the smallest sigma searched."""
    lo_cap, hi_cap = (math.log(s) for s in _SIGMA_RANGE)
    x = start
    if excess(x) > 0:
        while True:
            if x >= hi_cap:
                raise ValueError(
                    "`target_epsilon` is not met by any noise multiplier up to "
                    f"{_SIGMA_RANGE[1]:g}."
                )
            nxt = min(x + growth, hi_cap)
            if excess(nxt) <= 0:
                return x, nxt
            x, growth = nxt, growth * 2
    while x > lo_cap:
        nxt = max(x - growth, lo_cap)
        if excess(nxt) > 0:
            return nxt, x
        x, growth = nxt, growth * 2
    return -math.inf, x
