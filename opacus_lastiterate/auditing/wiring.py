"""The wiring check: is every trainable parameter really privatised by the Opacus optimizer?

:func:`check_private_training` arms a one-shot observer on a ``DPOptimizer``; the first step
that adds noise is the probe. It computes nothing on the model and draws no random number: it
reads what Opacus computed for that step and checks, per parameter, the coverage (with the
model: its trainable parameters are exactly the optimizer's), the per-sample gradients (hook
modes: present, one count for all, summing to the ordinary gradient), the clipping (the
clipped sum is the per-sample gradients scaled by ``min(1, C / norm)``, each contribution of
norm at most ``C``; under ghost clipping only the norm of the clipped sum of an expected batch
of ``n`` against ``3 n C``), the noise (a two-sided chi-square test of each parameter's and the
pooled noise against ``noise_multiplier * max_grad_norm``, tails of probability ``alpha``) and,
with the model, that frozen parameters do not change. Under user-level sampling
(``PrivacyUnit.sampled_user()``) each parameter must also have as many per-sample gradients as
the model's input has users and no more than the users the loaders fetched
(:mod:`.wiring_users`), so that Opacus clips users, not records. ``docs/language_models.md``,
"The wiring check", describes the checks, the set-ups they catch and the limits
(adaptive clipping is not checked; under ``DistributedDPOptimizer`` ranks other than 0 skip
the noise).

A failure raises :class:`~opacus_lastiterate.exceptions.PrivacyWiringError` (a
``ValueError``) naming each parameter and its problem, from inside ``optimizer.step()`` of the
probe step, after the noise is drawn and before the accountant records the step or the
parameters change (a frozen parameter changed by the first update is reported at the next
step). The model, the optimizer state, the random number streams and the accountant are never
touched, so training is bit-identical with and without the check.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from opacus_lastiterate._warn import warn
from opacus_lastiterate.analysis.privacy_unit import PrivacyUnit
from opacus_lastiterate.auditing.wiring_report import ParameterReport, WiringReport
from opacus_lastiterate.auditing.wiring_users import (
    BatchSizes,
    per_user_problems,
    warn_uncounted_users,
)
from opacus_lastiterate.exceptions import AuditWarning, PrivacyWiringError

__all__ = [
    "WiringCheck",
    "check_private_training",
]

_GHOST_HINT = (
    "ghost clipping computes no per-sample gradients, so only the n*C bound of the clipped "
    "sum is checked"
)


def _fingerprint(t: torch.Tensor) -> tuple[float, float] | None:
    """A float64 sum and Euclidean norm (None for a tensor without data, on ``meta``)."""
    if t.is_meta:
        return None
    d = t.detach()
    return (
        float(d.sum(dtype=torch.float64)),
        float(torch.linalg.vector_norm(d, dtype=torch.float64)),
    )


def _flat_samples(p: torch.Tensor) -> tuple[torch.Tensor, list[int]] | None:
    """The per-sample gradients of ``p`` as one tensor, and the sizes of its backward passes."""
    gs = getattr(p, "grad_sample", None)
    if gs is None:
        return None
    parts = list(gs) if isinstance(gs, (list, tuple)) else [gs]
    return torch.cat([g.detach() for g in parts], dim=0), [len(g) for g in parts]


class WiringCheck:
    """The armed observer that :func:`check_private_training` returns.

    Attributes:
        report: the :class:`WiringReport` once the probe step passed, else None.
        done: True once the probe step and the frozen-parameter follow-up are over (or the
            check was cancelled).
    """

    def __init__(
        self,
        optimizer: Any,
        model: nn.Module | None,
        *,
        alpha: float,
        rtol: float,
        accountant: object = None,
    ) -> None:
        self.optimizer = optimizer
        self.accountant = accountant
        self.alpha, self.rtol = alpha, rtol
        self.report: WiringReport | None = None
        self.done = False
        self._model = model
        self._names: dict[int, str] = {}
        self._model_trainable: dict[int, tuple[str, torch.Tensor]] = {}
        self._frozen: dict[str, tuple[torch.Tensor, tuple[float, float] | None]] = {}
        if model is not None:
            for name, p in model.named_parameters():
                self._names.setdefault(id(p), name)
                if not p.requires_grad:
                    self._frozen[name] = (p, _fingerprint(p))
        self._probed = False
        self._batches: BatchSizes | None = BatchSizes(model)
        self._own_pre_step = optimizer.__dict__.get("pre_step")
        self._wrapper = self._make_pre_step(optimizer.pre_step)
        optimizer.pre_step = self._wrapper

    # -- arming and disarming -----------------------------------------------------------------

    def _make_pre_step(self, inner: Any) -> Any:
        def pre_step(*args: Any, **kwargs: Any) -> Any:
            if self.done:
                return inner(*args, **kwargs)
            if self._probed:  # the step after the probe: did the first update move a frozen one?
                self._check_frozen("changed by the first update")
                self.cancel()
                return inner(*args, **kwargs)
            users = self._batches.take() if self._batches is not None else ([], 0)
            return self._probe(inner, users, *args, **kwargs)

        return pre_step

    def _give_up(self, why: str) -> None:
        """Disarm with a warning: the probe cannot observe this set-up, and a check that
        cannot run must not abort a step Opacus accepts."""
        self.cancel()
        warn(
            f"The wiring check could not observe this optimizer's step ({why}); it is "
            "switched off and this run's wiring is not checked.",
            AuditWarning,
        )

    def cancel(self) -> None:
        """Disarm; the optimizer's ``pre_step`` is restored when nothing wrapped it since.
        The model and its tensors are no longer referenced."""
        self.done = True
        self._model, self._frozen, self._model_trainable = None, {}, {}
        self._drop_batches()
        opt = self.optimizer
        if opt.__dict__.get("pre_step") is self._wrapper:
            if self._own_pre_step is None:
                del opt.__dict__["pre_step"]
            else:
                opt.pre_step = self._own_pre_step
        # else: someone wrapped it after us; the wrapper stays, passing calls through

    def _drop_batches(self) -> None:
        if self._batches is not None:
            self._batches.remove()
            self._batches = None

    def _per_user(self) -> bool:
        """Whether the accountant reports user-level sampling (read at the probe: the unit
        may be detected after arming, from the loader the monitor is shown)."""
        return getattr(self.accountant, "unit", None) == PrivacyUnit.sampled_user()

    # -- names ------------------------------------------------------------------------------------

    def _name(self, p: torch.Tensor) -> str:
        found = self._names.get(id(p))
        if found is not None:
            return found
        for g, group in enumerate(self.optimizer.param_groups):
            for i, q in enumerate(group["params"]):
                if q is p:
                    return f"param_groups[{g}][{i}] (shape {tuple(p.shape)})"
        return f"tensor of shape {tuple(p.shape)}"

    # -- the probe ------------------------------------------------------------------------------

    def _check_frozen(self, when: str) -> None:
        changed = {
            name: f"frozen (requires_grad=False) but {when}"
            for name, (p, before) in self._frozen.items()
            if before is not None and _fingerprint(p) != before
        }
        if changed:
            self.cancel()
            raise PrivacyWiringError(changed)

    def _probe(
        self, inner: Any, users: tuple[list[int | None], int], *args: Any, **kwargs: Any
    ) -> Any:
        from opacus.optimizers import DPOptimizerFastGradientClipping

        opt = self.optimizer
        params = list(opt.params)
        ghost = isinstance(opt, DPOptimizerFastGradientClipping)
        problems: dict[str, str] = {}
        self._check_frozen("changed before the first private step")
        if self._model is not None:  # read now: the model may have changed since arming
            for name, q in self._model.named_parameters():
                self._names.setdefault(id(q), name)
                if q.requires_grad:
                    self._model_trainable[id(q)] = (name, q)
            in_opt = {id(p) for p in params}
            for key, (name, _) in self._model_trainable.items():
                if key not in in_opt:
                    problems[name] = (
                        "trainable but not in the DP optimizer: it is neither clipped nor "
                        "noised (freeze it, or pass it to the optimizer given to make_private)"
                    )
            for p in params:
                if id(p) not in self._model_trainable:
                    problems[f"{self._name(p)} (the optimizer's tensor)"] = (
                        "in the DP optimizer but not a trainable parameter of the model: the "
                        "optimizer holds a tensor the model does not use (was the model moved, "
                        "re-materialised or rebuilt after make_private?)"
                    )
        if problems:  # the coverage problems first: the others follow from them
            self.cancel()
            raise PrivacyWiringError(problems)
        samples: dict[int, tuple[torch.Tensor, list[int]]] = {}
        raw: dict[int, torch.Tensor | None] = {}
        prior: dict[int, torch.Tensor | None] = {}
        if not ghost:
            self._collect_samples(params, samples, raw, problems, users)
        elif self._per_user():
            warn_uncounted_users("ghost clipping computes no per-sample gradients")
        for p in params:
            sg = getattr(p, "summed_grad", None)
            prior[id(p)] = None if sg is None else sg.detach().clone()
        if problems:
            self.cancel()
            raise PrivacyWiringError(problems)

        own_add_noise = opt.__dict__.get("add_noise")
        add_noise = opt.add_noise

        def observed_add_noise(*a: Any, **k: Any) -> Any:
            opt.__dict__.pop("add_noise", None)
            if own_add_noise is not None:
                opt.add_noise = own_add_noise
            sums = [getattr(p, "summed_grad", None) for p in params]
            if any(sg is None for sg in sums):  # sharded (FSDP) or otherwise unobservable
                self._give_up("some parameters have no clipped sum on this rank")
                return add_noise(*a, **k)
            clipped = {
                id(p): sg.detach().clone()  # type: ignore[union-attr]  # checked above
                for p, sg in zip(params, sums, strict=True)
            }
            out = add_noise(*a, **k)
            try:
                self._verify(params, ghost, samples, raw, prior, clipped)
            except PrivacyWiringError:
                raise
            except Exception as err:  # a set-up the check cannot read: never abort the step
                self._give_up(f"{type(err).__name__}: {err}")
            return out

        opt.add_noise = observed_add_noise
        try:
            result = inner(*args, **kwargs)
        finally:
            if opt.__dict__.get("add_noise") is observed_add_noise:  # a skipped step
                del opt.__dict__["add_noise"]
                if own_add_noise is not None:
                    opt.add_noise = own_add_noise
        if self.report is not None:
            self._probed = True
            self._drop_batches()
            if not self._frozen:
                self.cancel()
        return result

    def _collect_samples(
        self,
        params: list[torch.Tensor],
        samples: dict[int, tuple[torch.Tensor, list[int]]],
        raw: dict[int, torch.Tensor | None],
        problems: dict[str, str],
        users: tuple[list[int | None], int],
    ) -> None:
        for p in params:
            found = _flat_samples(p)
            if found is None:
                problems[self._name(p)] = (
                    "trainable but has no per-sample gradient: its layer is not hooked by "
                    "Opacus (an unsupported or unwrapped module), or it took no part in the loss"
                )
                continue
            samples[id(p)] = found
            raw[id(p)] = None if p.grad is None else p.grad.detach().clone()
        if self._per_user():
            parts = {self._name(p): samples[id(p)][1] for p in params if id(p) in samples}
            hooked = self._batches is not None and self._batches.hooked
            per_user = per_user_problems(parts, users, hooked=hooked)
            if per_user is not None:  # else it could not count the users, and warned
                problems.update(per_user)
                return
        counts = {key: len(s[0]) for key, s in samples.items()}
        if counts:
            n = max(set(counts.values()), key=list(counts.values()).count)
            for p in params:
                c = counts.get(id(p))
                if c is not None and c != n:
                    problems[self._name(p)] = (
                        f"per-sample gradients for {c} examples where the other parameters "
                        f"have {n}: its layer saw an input shared across the batch (for "
                        "example position ids of shape (1, T) fed to a position embedding); "
                        "pass inputs with the batch dimension (position_ids of shape (B, T)) "
                        "or freeze the layer"
                    )

    def _verify(
        self,
        params: list[torch.Tensor],
        ghost: bool,
        samples: dict[int, tuple[torch.Tensor, list[int]]],
        raw: dict[int, torch.Tensor | None],
        prior: dict[int, torch.Tensor | None],
        clipped: dict[int, torch.Tensor],
    ) -> None:
        from scipy import stats

        opt = self.optimizer
        problems: dict[str, str] = {}
        notes: list[str] = []
        mean = getattr(opt, "loss_reduction", "mean") == "mean"
        clip_max: dict[int, float | None] = {id(p): None for p in params}
        examples: dict[int, int | None] = {id(p): None for p in params}
        if ghost:
            notes.append(_GHOST_HINT)
        else:
            self._verify_samples(params, samples, raw, mean, problems)
            self._verify_clipping(params, samples, prior, clipped, problems, clip_max)
            examples = {id(p): len(samples[id(p)][0]) for p in params}
        stated = float(opt.noise_multiplier) * float(opt.max_grad_norm)
        rank = getattr(opt, "rank", 0)
        check_noise = not (isinstance(rank, int) and rank != 0)
        if not check_noise:
            notes.append("noise not checked on this rank (rank 0 adds it under DDP)")
        reports = []
        total_sq, total_n = 0.0, 0
        for p in params:
            if p.grad is None:
                problems[self._name(p)] = "has no gradient after the noise was added"
                continue
            noise = (p.grad.detach() - clipped[id(p)].view_as(p)).double()
            sq, k = float((noise * noise).sum()), noise.numel()
            total_sq, total_n = total_sq + sq, total_n + k
            std = math.sqrt(sq / k) if k else 0.0
            name = self._name(p)
            if check_noise:
                reason = self._noise_problem(sq, k, stated, stats)
                if reason is not None:
                    problems[name] = reason
            if ghost:
                self._verify_ghost_bound(p, clipped[id(p)], prior[id(p)], problems)
            reports.append(
                ParameterReport(name, k, examples[id(p)], std, stated, clip_max[id(p)])
            )
        if check_noise and not problems and total_n:
            reason = self._noise_problem(total_sq, total_n, stated, stats)
            if reason is not None:
                problems["all parameters pooled"] = reason
        if problems:
            self.cancel()
            raise PrivacyWiringError(problems)
        pooled = math.sqrt(total_sq / total_n) if total_n else 0.0
        self.report = WiringReport(
            tuple(reports), pooled, stated, tuple(self._frozen), ghost, tuple(notes)
        )

    def _noise_problem(self, sq: float, k: int, stated: float, stats: Any) -> str | None:
        if k == 0:
            return None
        std = math.sqrt(sq / k)
        if stated == 0.0:
            return None if sq == 0.0 else f"noise of std {std:.3g} where the stated std is 0"
        if sq == 0.0:
            return f"received no noise (stated std {stated:.3g})"
        t = sq / stated**2
        lo, hi = stats.chi2.ppf(self.alpha, k), stats.chi2.isf(self.alpha, k)
        if not lo <= t <= hi:
            return (
                f"noise of std {std:.4g} over {k} entries where {stated:.4g} is stated "
                f"(sum of squares / variance = {t:.4g}, outside the chi-square({k}) range "
                f"[{lo:.4g}, {hi:.4g}] of tail probability {self.alpha:g} each side)"
            )
        return None

    def _tolerance(self, grad_sample: torch.Tensor) -> float:
        """``rtol``, or 8 units in the last place of the per-sample gradients' dtype when that
        is coarser (bfloat16/float16 under autocast: Opacus sums them in that precision)."""
        return max(self.rtol, 8.0 * torch.finfo(grad_sample.dtype).eps)

    def _verify_samples(
        self,
        params: list[torch.Tensor],
        samples: dict[int, tuple[torch.Tensor, list[int]]],
        raw: dict[int, torch.Tensor | None],
        mean: bool,
        problems: dict[str, str],
    ) -> None:
        sums: dict[int, tuple[torch.Tensor, float]] = {}
        for p in params:
            gs, sizes = samples[id(p)]
            total = torch.zeros_like(gs[0], dtype=torch.float64)
            spread = torch.zeros_like(total)
            start = 0
            for size in sizes:
                part = gs[start : start + size].double()
                total += part.sum(dim=0) / (size if mean else 1)
                spread += part.abs().sum(dim=0) / (size if mean else 1)
                start += size
            sums[id(p)] = (total, float(spread.max()) if spread.numel() else 0.0)
        # rounding: relative to the per-sample terms' own size (triangle inequality), with a
        # floor at 1e-6 of the largest such size in the model (gradients that cancel to
        # rounding noise, e.g. an attention key bias)
        floor = 1e-6 * max((scale for _, scale in sums.values()), default=0.0)
        for p in params:
            grad = raw[id(p)]
            if grad is None:
                continue  # the plain gradient was cleared; nothing to compare
            total, scale = sums[id(p)]
            gap = float((total - grad.double().view_as(total)).abs().max())
            if gap > self._tolerance(samples[id(p)][0]) * max(scale, floor, 1e-30):
                problems[self._name(p)] = (
                    "its per-sample gradients do not add up to its gradient: part of its use "
                    "in the model is not seen by Opacus's hooks (a functional call, a tied or "
                    "shared weight used outside its layer), so that part is not clipped"
                )

    def _verify_clipping(
        self,
        params: list[torch.Tensor],
        samples: dict[int, tuple[torch.Tensor, list[int]]],
        prior: dict[int, torch.Tensor | None],
        clipped: dict[int, torch.Tensor],
        problems: dict[str, str],
        clip_max: dict[int, float | None],
    ) -> None:
        opt = self.optimizer
        flat = [samples[id(p)][0].double().reshape(len(samples[id(p)][0]), -1) for p in params]
        per_layer = getattr(opt, "max_grad_norms", None)
        if per_layer is None:
            bound = float(opt.max_grad_norm)
            norms = torch.stack([f.norm(dim=1) for f in flat], dim=1).norm(dim=1)
            factor = (bound / (norms + 1e-6)).clamp(max=1.0)
            factors, bounds = [factor] * len(params), [bound] * len(params)
            joint = float((factor * norms).max()) if len(norms) else 0.0
            joints = [joint] * len(params)
        else:
            bounds = [float(b) for b in per_layer]
            factors, joints = [], []
            for f, b in zip(flat, bounds, strict=True):
                n = f.norm(dim=1)
                factors.append((b / (n + 1e-6)).clamp(max=1.0))
                joints.append(float((factors[-1] * n).max()) if len(n) else 0.0)
        spreads = [
            float((fac[:, None] * f).abs().sum(dim=0).max()) if f.numel() else 0.0
            for f, fac in zip(flat, factors, strict=True)
        ]
        floor = 1e-6 * max(spreads, default=0.0)  # as in _verify_samples
        for p, f, fac, b, j, spread in zip(
            params, flat, factors, bounds, joints, spreads, strict=True
        ):
            clip_max[id(p)] = j
            expected = (fac[:, None] * f).sum(dim=0)
            before = prior[id(p)]
            if before is not None:
                expected = expected + before.double().reshape(-1)
                spread += float(before.double().abs().max())
            gap = float((clipped[id(p)].double().reshape(-1) - expected).abs().max())
            if j > b * (1 + 1e-5):
                problems[self._name(p)] = f"a clipped contribution of norm {j:.6g} > C = {b:.6g}"
            elif gap > self._tolerance(samples[id(p)][0]) * max(spread, floor, 1e-30):
                problems[self._name(p)] = (
                    "the clipped sum Opacus accumulated differs from the per-sample gradients "
                    f"clipped to C = {b:.6g}"
                )

    def _verify_ghost_bound(
        self,
        p: torch.Tensor,
        clipped: torch.Tensor,
        prior: torch.Tensor | None,
        problems: dict[str, str],
    ) -> None:
        n = getattr(self.optimizer, "expected_batch_size", None)
        if not isinstance(n, int) or n <= 0:
            return
        step = clipped.double() - (0.0 if prior is None else prior.double())
        # the batch drawn may exceed its expected size; allow a generous margin (3x)
        bound = 3 * n * float(self.optimizer.max_grad_norm)
        if float(step.norm()) > bound:
            problems[self._name(p)] = (
                f"clipped sum of norm {float(step.norm()):.6g} exceeds 3 * n * C = {bound:.6g}"
            )


def check_private_training(
    optimizer: Any,
    model: nn.Module | None = None,
    *,
    enabled: bool = True,
    alpha: float = 1e-9,
    rtol: float = 1e-4,
    accountant: object = None,
) -> WiringCheck | None:
    """Arm the wiring check (module docs) on an Opacus ``DPOptimizer``; the next step that
    adds noise is the probe.

    Args:
        optimizer: the ``DPOptimizer`` that ``make_private`` returned (flat or per-layer
            clipping, hooks or ghost clipping, wrapped model or ``wrap_model=False``).
        model: the model that is trained (the user's model under ``wrap_model=False``, or
            the ``GradSampleModule``); without it the coverage and frozen-parameter checks
            are skipped and parameters are named by their place in ``param_groups``.
        enabled: False returns None and arms nothing (the switch-off).
        alpha: tail probability, each side, of the chi-square test of each parameter's noise
            (and of the pooled noise): the chance that correct noise fails is at most
            ``2 * alpha * (number of parameters + 1)``.
        rtol: relative tolerance (to the largest entry) when sums of per-sample gradients
            are compared with Opacus's.
        accountant: the run's accountant; when its ``unit`` is
            ``PrivacyUnit.sampled_user()`` at the probe step (user-level sampling), each
            parameter must have one per-sample gradient per user (counted on the model's
            input when ``model`` is given, and from the users the data loaders fetched);
            when neither count is available, or under ghost clipping, an ``AuditWarning``
            says this is not checked.

    Returns:
        The armed :class:`WiringCheck` (its ``report`` is set once the probe passed), or
        None when ``enabled`` is False.

    Raises:
        TypeError: ``optimizer`` is not an Opacus ``DPOptimizer``, or ``model`` not a module.
        ValueError: ``alpha`` not in (0, 0.5) or ``rtol`` not positive.
        PrivacyWiringError: (at the probe step, from ``optimizer.step()``) parameters that
            are not privatised, each named with its problem.
    """
    from opacus.optimizers import DPOptimizer

    if not isinstance(enabled, bool):
        raise TypeError(f"`enabled` must be a bool, got {type(enabled).__name__}.")
    if not isinstance(optimizer, DPOptimizer):
        raise TypeError(
            "`optimizer` must be an Opacus DPOptimizer (the one make_private returns), got "
            f"{type(optimizer).__name__}."
        )
    if model is not None and not isinstance(model, nn.Module):
        raise TypeError(f"`model` must be a torch.nn.Module or None, got {type(model).__name__}.")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 0.5:
        raise ValueError(f"`alpha` must be a float in (0, 0.5), got {alpha!r}.")
    if isinstance(rtol, bool) or not isinstance(rtol, (int, float)) or not rtol > 0:
        raise ValueError(f"`rtol` must be a positive float, got {rtol!r}.")
    if not enabled:
        return None
    return WiringCheck(
        optimizer, model, alpha=float(alpha), rtol=float(rtol), accountant=accountant
    )

