"""In-training canary audit of the final model, in one training run (``docs/auditing.md``,
"In-training audit").

m canaries, each included by an independent fair coin recorded up front, go through the real
training; at the end every canary is scored on the final model only, and the scores and coins
give the one-run epsilon lower bound of Steinke, Nasr, Jagielski (*Privacy Auditing with One
(1) Training Run*, arXiv 2305.08846) and the f-DP one-run bound of Mahloujifar, Melis,
Chaudhuri (*Auditing f-Differential Privacy in One Run*, arXiv 2410.22235), both by
:meth:`ScoreAudit.from_canaries <opacus_lastiterate.analysis.audit.ScoreAudit.from_canaries>`,
reported beside the heuristic and standard epsilons at the same delta. Two kinds:

* **gradient canaries** (:class:`InTrainingCanaryAudit`): the Dirac canaries of
  :class:`~opacus_lastiterate.auditing.gradient_space.DiracCanary` (C = ``max_grad_norm`` on
  distinct coordinates of the flattened parameters, score ``theta_0[c] - theta_T[c]``), m of
  them batched on the parameters' device, each included one Poisson-sampled at every step at
  rate q and added to the clipped sum before the noise (so the divisor applies to it as to a
  real example);
* **input canaries** (:func:`~opacus_lastiterate.auditing.input_space.make_input_canaries`,
  :func:`~opacus_lastiterate.auditing.input_space.make_canary_users` under user-level
  sampling, :func:`~opacus_lastiterate.auditing.input_space.make_text_canaries` for language
  models; :class:`~opacus_lastiterate.auditing.input_space.InputCanaries`), added to the
  training set by their coins and scored by minus the final model's loss.

Per step nothing leaves the parameters' device and nothing waits for it (a dedicated
``torch.Generator``, an ``index_add_``); scores are read back once, in
:meth:`InTrainingCanaryAudit.report`. The global random number generators are never touched,
so ``enabled=False`` (or ``num_canaries=0``) leaves training bit-for-bit identical.

Distributed training (``DistributedDPOptimizer``): build the audit on every rank with the same
``seed``; coordinates, coins and per-step draws are then the same on every rank, and the
sampled canaries are added to rank 0's clipped sum only (the rank that adds the noise), so
after the all-reduce each is in the global sum exactly once (``C / world_size`` per rank would
round C). Other distributed optimizers are refused with a ``TypeError`` that says why.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike, NDArray
from torch import nn

from opacus_lastiterate.analysis._validation import (
    check_delta,
    check_in_interval,
    check_int,
    check_sample_rate,
    check_step_noise,
)
from opacus_lastiterate.analysis.audit.result import AuditResult
from opacus_lastiterate.analysis.audit.score_audit import ScoreAudit
from opacus_lastiterate.analysis.kept_model import KeptModel
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.analysis.sampling import (
    SamplingScheme,
    check_sampling,
    check_sampling_matches,
)
from opacus_lastiterate.auditing.input_space import canary_set, text_canaries
from opacus_lastiterate.callbacks.canary_sampling import CanaryInclusion

__all__ = ["CanaryAuditResult", "InTrainingAuditReport", "InTrainingCanaryAudit"]

_HEURISTIC_NOTE = "last-iterate heuristic, final model only; not a DP guarantee for deep networks"
_STANDARD_NOTE = "standard composition (all iterates released), PLD upper bound"


# ------------------------------------------------------------------------------ results


@dataclass(frozen=True)
class CanaryAuditResult:
    """The one-run audit of one kind of canary.

    Attributes:
        canaries: ``"gradient"``, ``"input"`` or ``"text"``.
        num_canaries: m, canaries with a coin (included or not).
        num_included: canaries whose coin said "in".
        one_run: Steinke, Nasr, Jagielski one-run result (``kind="bound"`` when valid).
        one_run_fdp: Mahloujifar, Melis, Chaudhuri one-run result against the (eps, delta)
            trade-off curve (``kind="bound"`` when valid).
    """

    canaries: str
    num_canaries: int
    num_included: int
    one_run: AuditResult
    one_run_fdp: AuditResult

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly summary."""
        return {
            "canaries": self.canaries,
            "num_canaries": self.num_canaries,
            "num_included": self.num_included,
            "one_run": self.one_run.as_dict(_ONE_RUN_FIELDS),
            "one_run_fdp": self.one_run_fdp.as_dict(_ONE_RUN_FIELDS),
        }


_ONE_RUN_FIELDS = ("epsilon", "delta", "confidence", "method", "kind", "num_guesses",
                   "num_correct", "threshold", "notes")
"""The keys of a one-run result in :meth:`CanaryAuditResult.as_dict`."""


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return "inf" if math.isinf(value) else f"{value:.4g}"


@dataclass(frozen=True)
class InTrainingAuditReport:
    """One-run lower bounds of one training run beside the epsilons it is held against.

    Attributes:
        delta: the delta of every number here.
        confidence: confidence of each audit separately (two audits hold together at
            ``1 - 2 (1 - confidence)``).
        steps: optimizer steps taken while the gradient canaries were attached (None when
            they were not).
        sample_rate: q, the canaries' (and the training's) Poisson sampling rate.
        heuristic_epsilon: last-iterate heuristic epsilon of the reference run (None
            without a run to account).
        robust_heuristic_epsilon: its robust variant (max over the last t <= T steps).
        standard_epsilon: standard composition epsilon (an upper bound, all iterates).
        audits: one :class:`CanaryAuditResult` per kind of canary used.
    """

    delta: float
    confidence: float
    steps: int | None
    sample_rate: float | None
    heuristic_epsilon: float | None
    robust_heuristic_epsilon: float | None
    standard_epsilon: float | None
    audits: tuple[CanaryAuditResult, ...] = ()

    def audit(self, canaries: str) -> CanaryAuditResult:
        """The result for ``"gradient"`` or ``"input"`` canaries (KeyError if absent)."""
        for a in self.audits:
            if a.canaries == canaries:
                return a
        raise KeyError(f"no {canaries!r} canaries in this report.")

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly form (``json.dumps`` works on it; inf is written as Infinity)."""
        return {
            "delta": self.delta,
            "confidence": self.confidence,
            "steps": self.steps,
            "sample_rate": self.sample_rate,
            "heuristic_epsilon": self.heuristic_epsilon,
            "robust_heuristic_epsilon": self.robust_heuristic_epsilon,
            "standard_epsilon": self.standard_epsilon,
            "audits": [a.as_dict() for a in self.audits],
        }

    def __str__(self) -> str:
        lines = [
            f"In-training canary audit at delta = {self.delta:g} "
            f"({100 * self.confidence:.4g}% confidence per audit)"
            + (f", {self.steps} steps" if self.steps is not None else "")
            + (f", q = {self.sample_rate:.4g}" if self.sample_rate is not None else ""),
            f"  epsilon {_fmt(self.heuristic_epsilon):>8}  ({_HEURISTIC_NOTE})",
            f"  epsilon {_fmt(self.robust_heuristic_epsilon):>8}  (robust heuristic, max over "
            "the last t <= T steps)",
            f"  epsilon {_fmt(self.standard_epsilon):>8}  ({_STANDARD_NOTE})",
        ]
        for a in self.audits:
            lines.append(
                f"  {a.canaries} canaries: {a.num_canaries} ({a.num_included} included by fair "
                "coins)"
            )
            for name, r in (("one-run", a.one_run), ("one-run f-DP", a.one_run_fdp)):
                label = "lower bound" if r.is_bound else f"{r.kind.upper()}, NOT A VALID BOUND"
                counts = r.counts
                lines.append(
                    f"    {name:<13} epsilon >= {_fmt(r.epsilon):>8}  ({label}; "
                    f"{getattr(counts, 'num_correct', '?')}/{getattr(counts, 'num_guesses', '?')}"
                    " guesses correct)"
                )
        if not self.audits:
            lines.append("  no canaries: nothing audited")
        return "\n".join(lines)


def _canary_audit(
    name: str,
    scores: NDArray[np.float64],
    coins: NDArray[np.bool_],
    delta: float,
    confidence: float,
) -> CanaryAuditResult:
    audit = ScoreAudit.from_canaries(scores, coins)
    return CanaryAuditResult(
        canaries=name,
        num_canaries=int(coins.size),
        num_included=int(coins.sum()),
        one_run=audit.one_run(delta=delta, confidence=confidence),
        one_run_fdp=audit.one_run_fdp(delta=delta, confidence=confidence),
    )


# ------------------------------------------------------------------------------ gradient canaries


def _check_dp_optimizer(optimizer: object) -> Any:
    from opacus.optimizers import DPOptimizer

    if not isinstance(optimizer, DPOptimizer):
        raise TypeError(
            "`optimizer` must be an Opacus DPOptimizer (returned by "
            f"PrivacyEngine.make_private), got {type(optimizer).__name__}."
        )
    if "add_noise" in vars(optimizer):
        raise ValueError(
            "`optimizer.add_noise` is already replaced (another canary audit is attached?); "
            "attach one InTrainingCanaryAudit per optimizer."
        )
    return optimizer


def _distributed_rank(optimizer: Any) -> int | None:
    """None for a single-process optimizer; the rank of a supported distributed one.

    Supported: Opacus's ``DistributedDPOptimizer`` (flat clipping) as it is, whose rank 0
    adds the noise to its local clipped sum and whose ``reduce_gradients`` then sums
    ``p.grad`` over the ranks (divided by ``world_size`` with ``loss_reduction="mean"``,
    each rank having divided by its per-worker ``expected_batch_size``). Everything else
    that carries a ``rank`` is refused with the reason.
    """
    if not (hasattr(optimizer, "rank") or hasattr(optimizer, "world_size")):
        return None
    from opacus.optimizers import DistributedDPOptimizer, DPPerLayerOptimizer
    from opacus.optimizers.optimizer_fast_gradient_clipping import (
        DPOptimizerFastGradientClipping,
    )

    name = type(optimizer).__name__
    prefix = f"`optimizer` is a distributed DPOptimizer ({name}); "
    if isinstance(optimizer, DPPerLayerOptimizer):
        raise TypeError(
            prefix + "per-layer clipping is not supported: a gradient canary of norm "
            "max_grad_norm on one layer would exceed that layer's clipping bound."
        )
    if isinstance(optimizer, DPOptimizerFastGradientClipping):
        raise TypeError(
            prefix + "ghost clipping (DDP or FSDP) is not supported: FSDP shards the "
            "parameters (a flat coordinate is not the same parameter on every rank) and the "
            "distributed ghost-clipping path is not validated with canaries."
        )
    if not isinstance(optimizer, DistributedDPOptimizer):
        raise TypeError(
            prefix + "only Opacus's DistributedDPOptimizer (flat clipping) is supported; "
            "this one adds its noise elsewhere (e.g. per parameter in backward hooks), so "
            "there is no add_noise step to put the canaries into."
        )
    cls = type(optimizer)
    for method in ("add_noise", "reduce_gradients", "step"):
        if getattr(cls, method) is not getattr(DistributedDPOptimizer, method):
            raise TypeError(
                prefix + f"it overrides {method}(), so where the ranks' sums meet is "
                "unknown; only DistributedDPOptimizer's own aggregation is supported."
            )
    rank = optimizer.rank
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        raise TypeError(f"`optimizer.rank` must be an integer >= 0, got {rank!r}.")
    return rank


def _check_candidates(candidates: ArrayLike | None, dimension: int, m: int) -> NDArray[np.int64]:
    if candidates is None:
        return np.arange(dimension, dtype=np.int64)
    c = np.asarray(candidates)
    if c.ndim != 1 or not (c.size == 0 or np.issubdtype(c.dtype, np.integer)):
        raise TypeError(f"`candidates` must be a 1-D integer array, got {c.dtype} {c.shape}.")
    c = c.astype(np.int64)
    if c.size and (c.min() < 0 or c.max() >= dimension):
        raise ValueError(f"`candidates` must lie in [0, {dimension}), the flat parameter indices.")
    if np.unique(c).size != c.size:
        raise ValueError("`candidates` must be distinct.")
    if c.size < m:
        raise ValueError(f"`candidates` has {c.size} coordinates, fewer than num_canaries = {m}.")
    return c


class InTrainingCanaryAudit:
    """Gradient (and optionally input) canaries in one Opacus training run, audited at the end.

    Attach it after ``PrivacyEngine.make_private`` and before the first step; train as
    usual; call :meth:`report` on the final model. The gradient canaries' coordinates and
    coins are drawn here from ``seed`` (numpy), their per-step sampling from a
    ``torch.Generator`` on the parameters' device seeded from ``seed``.

    Args:
        optimizer: the :class:`opacus.optimizers.DPOptimizer` of the run.
        num_canaries: m, gradient canaries (0: none; at most the number of parameters).
        sample_rate: q, the training's Poisson rate (``1 / len(data_loader)`` for Opacus's
            DPDataLoader); every included canary is in each step with probability q.
        sampling: how the loader draws batches (:mod:`opacus_lastiterate.analysis.sampling`);
            the canaries enter the steps the same way (:mod:`.canary_sampling`: once per
            epoch for shuffled and balls-in-bins batches). ``None``: the accountant's
            ``sampling`` when it has one, else Poisson at ``sample_rate``.
        seed: seed of the coordinates, coins and per-step sampling.
        accountant: the PrivacyEngine's accountant (``engine.accountant``), whose run gives
            the reference epsilons (:meth:`report`); None: the steps this audit sees.
        input_canaries: the record returned by
            :func:`~opacus_lastiterate.auditing.input_space.make_input_canaries` (or, for a
            language model, :func:`~opacus_lastiterate.auditing.input_space.make_text_canaries`).
        candidates: flat parameter indices the canary coordinates are drawn from (None:
            all), e.g. coordinates the real data do not move.
        enabled: False makes the audit inert (nothing attached; training unchanged).

    With a ``DistributedDPOptimizer``, create it on every rank with the same arguments
    (module docs, "Distributed training"); every rank then reports the same audit.
    """

    def __init__(
        self,
        optimizer: Any,
        *,
        num_canaries: int,
        sample_rate: float,
        seed: int,
        accountant: Any = None,
        input_canaries: canary_set.InputCanaries | text_canaries.TextCanaries | None = None,
        candidates: ArrayLike | None = None,
        enabled: bool = True,
        sampling: SamplingScheme | None = None,
    ) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"`enabled` must be a bool, got {enabled!r}.")
        self._optimizer = _check_dp_optimizer(optimizer)
        self._rank = _distributed_rank(optimizer)
        # The canaries enter the clipped sum on one process only: the single process, or
        # rank 0 of a DistributedDPOptimizer (the rank that adds the noise); the others
        # draw the same per-step samples and count the same insertions without adding.
        self._inserts = self._rank is None or self._rank == 0
        m = check_int("num_canaries", num_canaries)
        self._sample_rate = check_sample_rate(sample_rate)
        self._seed = check_int("seed", seed)
        kinds = (canary_set.InputCanaries, text_canaries.TextCanaries)
        if input_canaries is not None and not isinstance(input_canaries, kinds):
            raise TypeError(
                "`input_canaries` must be an InputCanaries (make_input_canaries), TextCanaries "
                f"(make_text_canaries) or None, got {type(input_canaries).__name__}."
            )
        if accountant is not None and not hasattr(accountant, "history"):
            raise TypeError(
                f"`accountant` must be an Opacus accountant or None, got {type(accountant).__name__}."
            )
        self._accountant = accountant
        scheme = check_sampling(sampling)
        if scheme is None:
            scheme = getattr(accountant, "sampling", None)
        check_sampling_matches(scheme, [self._sample_rate], "sampling")
        self._sampling = scheme
        self._input = input_canaries
        params: list[torch.Tensor] = list(optimizer.params)
        dimension = sum(p.numel() for p in params)
        if m > dimension:
            raise ValueError(
                f"`num_canaries` must be at most the number of parameters ({dimension}), got {m}."
            )
        pool = _check_candidates(candidates, dimension, m)
        self._enabled = enabled and m > 0
        self._num_canaries = m if self._enabled else 0
        self._steps = 0
        # the run of the reference epsilons when no accountant records it
        self._own = KeptModel(sampling=scheme) if accountant is None else None
        self._original_add_noise: Callable[[], None] | None = None
        if not self._enabled:
            self._coordinates = np.zeros(0, dtype=np.int64)
            self._coins = np.zeros(0, dtype=bool)
            return

        rng = np.random.default_rng(np.random.SeedSequence(self._seed, spawn_key=(0,)))
        self._coordinates = rng.choice(pool, size=m, replace=False).astype(np.int64)
        self._coins = canary_set.fair_coins(self._seed, m, salt=3)
        self._device = params[0].device
        sampling_seed = int(np.random.SeedSequence(self._seed, spawn_key=(4,)).generate_state(1)[0])
        self._generator = torch.Generator(device=self._device).manual_seed(sampling_seed)
        self._inclusion = CanaryInclusion(
            m,
            sample_rate=self._sample_rate,
            sampling=self._sampling,
            generator=self._generator,
            device=self._device,
        )
        self._included = torch.as_tensor(self._coins, device=self._device)
        self._insertions = torch.zeros(m, dtype=torch.int64, device=self._device)
        # (parameter, local flat indices, canary positions, initial values) per parameter.
        self._groups: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        offset = 0
        for p in params:
            n = p.numel()
            pos = np.flatnonzero((self._coordinates >= offset) & (self._coordinates < offset + n))
            if pos.size:
                local = torch.as_tensor(self._coordinates[pos] - offset, device=p.device)
                with torch.no_grad():
                    initial = p.detach().reshape(-1).index_select(0, local).clone()
                self._groups.append(
                    (p, local, torch.as_tensor(pos, device=self._device), initial)
                )
            offset += n
        self._original_add_noise = optimizer.add_noise
        optimizer.add_noise = self._add_noise

    # -- the hot path ---------------------------------------------------------------------

    def _add_noise(self) -> None:
        """Add the sampled, included canaries to ``p.summed_grad``, then Opacus's noise."""
        self._insert()
        assert self._original_add_noise is not None
        self._original_add_noise()
        self._steps += 1
        if self._own is not None:
            self._own.append(check_step_noise(self._optimizer.noise_multiplier), self._sample_rate)

    @torch.no_grad()
    def _insert(self) -> None:
        """One step's canaries: sample on the device, ``index_add_`` into the clipped sums."""
        opt = self._optimizer
        present = self._inclusion.next_step() & self._included
        self._insertions += present
        if not self._inserts:  # another rank adds them to the global sum
            return
        norm = float(opt.max_grad_norm)  # C, a Python number: no synchronisation
        for p, local, pos, _ in self._groups:
            summed: torch.Tensor | None = getattr(p, "summed_grad", None)
            if summed is None:  # pragma: no cover - Opacus always sets it before add_noise
                continue
            if not summed.is_contiguous():
                summed = summed.contiguous()
                p.summed_grad = summed  # type: ignore[attr-defined]
            flat = summed.view(-1)
            values = present.index_select(0, pos).to(flat.device, flat.dtype) * norm
            flat.index_add_(0, local, values)

    # -- state --------------------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """True if gradient canaries are attached (enabled and m > 0)."""
        return self._enabled

    @property
    def num_canaries(self) -> int:
        """m, the gradient canaries (0 when disabled)."""
        return self._num_canaries

    @property
    def rank(self) -> int | None:
        """The optimizer's ``torch.distributed`` rank (None for a single-process one); the
        canaries are added to the clipped sum on rank 0 only."""
        return self._rank

    @property
    def steps(self) -> int:
        """Steps taken with the gradient canaries attached."""
        return self._steps

    @property
    def coordinates(self) -> NDArray[np.int64]:
        """Flat parameter index of each gradient canary (a copy)."""
        return self._coordinates.copy()

    @property
    def coins(self) -> NDArray[np.bool_]:
        """Inclusion coin of each gradient canary, True = included (a copy)."""
        return self._coins.copy()

    def insertions(self) -> NDArray[np.int64]:
        """How many steps each gradient canary was in (0 for excluded ones). Synchronises."""
        if not self._enabled:
            return np.zeros(0, dtype=np.int64)
        return self._insertions.cpu().numpy()

    @torch.no_grad()
    def gradient_scores(self) -> NDArray[np.float64]:
        """``theta_0[c] - theta_T[c]`` per gradient canary, on the current parameters."""
        if not self._enabled:
            return np.zeros(0)
        scores = torch.zeros(self._num_canaries, dtype=torch.float64, device=self._device)
        for p, local, pos, initial in self._groups:
            final = p.detach().reshape(-1).index_select(0, local)
            diff = (initial.double() - final.double()).to(self._device)
            scores.index_copy_(0, pos, diff)
        return scores.cpu().numpy()

    def detach(self) -> None:
        """Stop inserting gradient canaries (Opacus's own ``add_noise`` is restored)."""
        if self._original_add_noise is not None:
            del self._optimizer.add_noise  # the instance attribute; the class method returns
            self._original_add_noise = None

    # -- the report -----------------------------------------------------------------------

    def _reference_model(self) -> KeptModel:
        """The run of the reference epsilons as the analysis keeps it: the accountant's kept
        model (``LastIterateAccountant.kept_model``: the run's scheme and optimizer weights),
        the accountant's run with the audit's ``sampling`` where that differs, or the steps
        this audit saw when it has no accountant."""
        acc = self._accountant
        if acc is None:
            assert self._own is not None
            return self._own
        kept = getattr(acc, "kept_model", None)
        if isinstance(kept, KeptModel):
            if kept.sampling == self._sampling:
                return kept
            run = DPSGDRun.from_history(kept.run.segments, sampling=self._sampling)
            return KeptModel.from_run(run, kept.settings_columns, accuracy=kept.accuracy)
        return KeptModel.from_run(DPSGDRun.from_history(acc.history, sampling=self._sampling))

    def report(
        self,
        *,
        delta: float,
        confidence: float = 0.95,
        model: nn.Module | None = None,
        input_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        standard: bool = True,
    ) -> InTrainingAuditReport:
        """Score every canary on the final model and audit them (one run).

        Args:
            delta: delta of the bounds and of the reference epsilons, in (0, 1): the
                heuristic, robust and standard numbers of the registry for the accountant's
                run (``accountant.kept_model.epsilon(delta, name)``, for the run's scheme and
                optimizer weights).
            confidence: confidence of each one-run audit.
            model: the final model; needed when input canaries were given.
            input_loss: per-record loss of the input canaries (default cross-entropy; canary
                users reduce it over their records; no text).
            standard: also compute the standard composition epsilon (a PLD accountant:
                seconds for long runs at large epsilon); False leaves it None.
        """
        if not isinstance(standard, bool):
            raise TypeError(f"`standard` must be a bool, got {standard!r}.")
        d = check_delta(delta)
        c = check_in_interval("confidence", confidence, 0.0, 1.0)
        audits = []
        if self._enabled:
            audits.append(_canary_audit("gradient", self.gradient_scores(), self._coins, d, c))
        if self._input is not None:
            if model is None:
                raise ValueError("`model` is required to score the input canaries.")
            text = isinstance(self._input, text_canaries.TextCanaries)
            if text and input_loss is not None:
                raise ValueError("`input_loss` does not apply to text canaries (scored by NLL).")
            kw = {} if input_loss is None else {"loss": input_loss}
            scores = self._input.scores(model, **kw)  # type: ignore[arg-type]
            coins = self._input.included
            audits.append(_canary_audit("text" if text else "input", scores, coins, d, c))
        kept = self._reference_model()

        def reference(name: str, wanted: bool = True) -> float | None:
            return kept.epsilon(d, name) if wanted and kept.num_steps else None

        return InTrainingAuditReport(
            delta=d,
            confidence=c,
            steps=self._steps if self._enabled else None,
            sample_rate=self._sample_rate,
            heuristic_epsilon=reference("heuristic"),
            robust_heuristic_epsilon=reference("robust_heuristic"),
            standard_epsilon=reference("standard", standard),
            audits=tuple(audits),
        )

    def __repr__(self) -> str:
        return (
            f"InTrainingCanaryAudit(num_canaries={self._num_canaries}, "
            f"sample_rate={self._sample_rate:g}, steps={self._steps}, "
            + ("" if self._rank is None else f"rank={self._rank}, ")
            + f"input_canaries={0 if self._input is None else self._input.num_canaries})"
        )
