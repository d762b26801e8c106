"""Input-space audit of the final model: the canary's score against crafted samples' scores on
the same evaluation runs, with the same statistics (``docs/input_audits.md``, "Protocol").

:func:`run_input_audit` runs, through :class:`~opacus_lastiterate.auditing.runner.AuditRunner`
and a model cache (:class:`~opacus_lastiterate.auditing.input_space.model_cache.CachedTrain`):

1. *crafting runs* (white-box): models of the audited training itself, on D or D' by fair
   coins, used only to craft samples;
2. *surrogate runs* (black-box): models of a training the auditor runs itself
   (``surrogate_train``), used only to craft samples;
3. *evaluation runs*: models that are scored, by the canary and by every crafted sample,
   and audited with one threshold strategy, confidence and delta.

The three sets of runs have different master seeds, and :func:`check_disjoint_runs` refuses
to go on if any training seed is shared, so no evaluated model was seen while crafting and
the audit's confidence stays honest.

``in_sample=True`` adds, as a diagnostic, samples crafted on the evaluation models themselves
and audited on them: the confidence of such an audit is not honest (the sample was fitted to
the very runs it is tested on), so its results are labelled ``kind="invalid"``. The gap
between them and the white-box samples shows how much of a crafted sample's apparent gain
is fitted to the noise of particular runs.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from opacus_lastiterate.analysis._validation import check_int
from opacus_lastiterate.analysis.audit import AuditResult, ScoreAudit, ThresholdStrategy
from opacus_lastiterate.analysis.audit.threshold_strategies import DEFAULT_THRESHOLD_STRATEGY
from opacus_lastiterate.auditing.input_space.adversarial_samples import (
    ALL_CRAFTING_OBJECTIVES,
    CRAFTING_OBJECTIVES,
    CraftedSample,
    craft_adversarial_sample,
)
from opacus_lastiterate.auditing.input_space.canaries import InputCanary, InputScore, ScoreStatistic
from opacus_lastiterate.auditing.input_space.model_cache import CachedTrain
from opacus_lastiterate.auditing.runner import (
    AuditRunner,
    RunRecords,
    TrainFunction,
    audit_records,
)

__all__ = [
    "InputAuditReport",
    "SampleAudit",
    "run_input_audit",
]

CraftingMode = Literal["canary", "white-box", "black-box", "in-sample"]
Runs = RunRecords | Iterable[tuple[int, bool]]


def _seeds(runs: Runs) -> set[int]:
    if isinstance(runs, RunRecords):
        return {r.seed for r in runs.records}
    return {int(seed) for seed, _ in runs}


def check_disjoint_runs(crafting: Runs, evaluation: Runs) -> None:
    """ValueError if a crafting run and an evaluation run share a training seed.

    ``crafting`` and ``evaluation``: :class:`RunRecords` or ``(seed, include_canary)`` pairs
    (e.g. ``AuditRunner.assignments()``). A run's model is a function of its seed and coin,
    so distinct seeds mean that no evaluated model was used to craft.
    """
    shared = _seeds(crafting) & _seeds(evaluation)
    if shared:
        raise ValueError(
            f"crafting and evaluation runs share {len(shared)} training seed(s) (e.g. "
            f"{min(shared)}): a sample crafted on a model must not score that model; use "
            "different master seeds."
        )


@dataclass(frozen=True)
class SampleAudit:
    """The audit of one sample's scores on the evaluation runs.

    Attributes:
        name: ``"canary"`` or ``"<objective> (<mode>)"``.
        mode: ``"canary"``, ``"white-box"``, ``"black-box"`` or ``"in-sample"`` (crafted on
            the evaluation runs: a diagnostic, ``kind="invalid"``).
        sample: the scored input.
        bound: Clopper-Pearson lower bound (``kind="bound"``; ``"invalid"`` in-sample).
        estimate: Gaussian-DP estimate from the same scores (``kind="estimate"``;
            ``"invalid"`` in-sample).
        auroc: area under the ROC curve of the scores.
        crafted: how the sample was crafted (None for the canary).
        records: the evaluation runs with this sample's scores.
    """

    name: str
    mode: CraftingMode
    sample: InputCanary
    bound: AuditResult
    estimate: AuditResult
    auroc: float
    crafted: CraftedSample | None = field(default=None, repr=False)
    records: RunRecords | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        """JSON data (no tensors, no scores)."""
        out: dict[str, Any] = {
            "name": self.name,
            "mode": self.mode,
            "sample": {"kind": self.sample.kind, "label": self.sample.label,
                       "digest": self.sample.digest},
            "bound": {
                "epsilon": self.bound.epsilon,
                "kind": self.bound.kind,
                "threshold": self.bound.threshold,
                "counts": repr(self.bound.counts),
                "selection": self.bound.selection,
            },
            "estimate": {"epsilon": self.estimate.epsilon, "mu": self.estimate.mu,
                         "kind": self.estimate.kind},
            "auroc": self.auroc,
        }
        if self.crafted is not None:
            out["crafting"] = {
                "objective": self.crafted.objective,
                "selected_step": self.crafted.selected_step,
                "steps": len(self.crafted.objective_history),
                "num_in": self.crafted.num_in,
                "num_out": self.crafted.num_out,
                "validation_auroc_start": (self.crafted.validation_auroc or [None])[0],
                "validation_auroc_selected": (
                    self.crafted.validation_auroc[self.crafted.selected_step]
                    if self.crafted.validation_auroc
                    else None
                ),
            }
        return out


@dataclass(frozen=True)
class InputAuditReport:
    """Canary and crafted samples audited on the same evaluation runs.

    Attributes:
        audits: one :class:`SampleAudit` per sample, the canary first.
        evaluation: the evaluation runs (canary scores).
        crafting: the white-box crafting runs (None if there were none).
        surrogate: the black-box surrogate runs (None if there were none).
        delta, confidence: of every audit.
    """

    audits: tuple[SampleAudit, ...]
    evaluation: RunRecords = field(repr=False)
    crafting: RunRecords | None = field(repr=False)
    surrogate: RunRecords | None = field(repr=False)
    delta: float
    confidence: float

    @property
    def num_in(self) -> int:
        """Evaluation runs trained with the canary."""
        return int(self.evaluation.in_scores.size)

    @property
    def num_out(self) -> int:
        """Evaluation runs trained without it."""
        return int(self.evaluation.out_scores.size)

    def audit(self, name: str) -> SampleAudit:
        """The audit called ``name``."""
        for a in self.audits:
            if a.name == name:
                return a
        raise KeyError(f"no audit named {name!r}; have {[a.name for a in self.audits]}.")

    def as_dict(self) -> dict[str, Any]:
        """JSON data."""
        return {
            "delta": self.delta,
            "confidence": self.confidence,
            "evaluation_runs": {"in": self.num_in, "out": self.num_out},
            "crafting_runs": None if self.crafting is None else len(self.crafting),
            "surrogate_runs": None if self.surrogate is None else len(self.surrogate),
            "audits": [a.as_dict() for a in self.audits],
        }


def _audit(
    name: str,
    mode: CraftingMode,
    sample: InputCanary,
    records: RunRecords,
    crafted: CraftedSample | None,
    delta: float,
    confidence: float,
    strategy: ThresholdStrategy,
) -> SampleAudit:
    bound = audit_records(records, delta=delta, confidence=confidence, threshold_strategy=strategy)
    estimate = audit_records(
        records, delta=delta, confidence=confidence, threshold_strategy=strategy,
        method="gaussian-dp",
    )
    auroc = ScoreAudit(records.in_scores, records.out_scores).auroc()
    if mode == "in-sample":
        note = ("sample crafted on the evaluated runs themselves: the confidence is not "
                "honest (diagnostic only)",)
        bound, estimate = (
            dataclasses.replace(r, kind="invalid", statistically_valid=False,
                                notes=r.notes + note)
            for r in (bound, estimate)
        )
    return SampleAudit(name, mode, sample, bound, estimate, auroc, crafted, records)


def run_input_audit(
    train: TrainFunction,
    canary: InputCanary,
    *,
    directory: str | os.PathLike[str],
    evaluation_runs: int,
    crafting_runs: int = 0,
    surrogate_train: TrainFunction | None = None,
    surrogate_runs: int = 0,
    objectives: Sequence[str] = CRAFTING_OBJECTIVES,
    statistic: ScoreStatistic = "loss",
    crafting_options: Mapping[str, Any] | None = None,
    delta: float,
    confidence: float = 0.95,
    threshold_strategy: ThresholdStrategy = DEFAULT_THRESHOLD_STRATEGY,
    seed: int = 0,
    workers: int | None = None,
    progress: bool = True,
    in_sample: bool = False,
) -> InputAuditReport:
    """Craft samples on crafting / surrogate runs, audit canary and samples on evaluation runs.

    Args:
        train: the audited training, ``train(include_canary, seed) -> torch.nn.Module``
            (picklable for worker processes); its D' contains ``canary``.
        canary: the canary; also the starting point of every crafted sample.
        directory: where run records and models are kept (an audit resumes from it).
        evaluation_runs: R, models scored and audited.
        crafting_runs: white-box crafting runs of ``train`` (0: no white-box samples).
        surrogate_train: the auditor's own training for black-box crafting (None: none).
        surrogate_runs: its runs (0: no black-box samples).
        objectives: crafting objectives, each giving one sample per mode.
        statistic: score of every sample, ``"loss"`` or ``"margin"``.
        crafting_options: further keyword arguments of :func:`craft_adversarial_sample`.
        delta, confidence, threshold_strategy: of every audit (the same for all samples).
        seed: master seed; the evaluation, crafting and surrogate runs get three different
            master seeds derived from it.
        workers, progress: as in :class:`AuditRunner`.
        in_sample: also craft on the evaluation runs and audit there, labelled
            ``kind="invalid"`` (a diagnostic of over-fitting, see the module docstring).
    """
    if not isinstance(canary, InputCanary):
        raise TypeError(f"`canary` must be an InputCanary, got {type(canary).__name__}.")
    n_eval = check_int("evaluation_runs", evaluation_runs, minimum=2)
    n_craft = check_int("crafting_runs", crafting_runs)
    n_sur = check_int("surrogate_runs", surrogate_runs)
    for name, n in (("crafting_runs", n_craft), ("surrogate_runs", n_sur)):
        if n == 1:
            raise ValueError(f"`{name}` must be 0 or >= 2, got 1.")
    if n_sur and surrogate_train is None:
        raise ValueError("`surrogate_runs` > 0 needs a `surrogate_train`.")
    objectives = tuple(objectives)
    for obj in objectives:
        if obj not in ALL_CRAFTING_OBJECTIVES:
            raise ValueError(
                f"`objectives` must be drawn from {ALL_CRAFTING_OBJECTIVES}, got {obj!r}."
            )
    options = dict(crafting_options or {})
    root = Path(directory)
    eval_seed, craft_seed, sur_seed = (
        int(s) for s in np.random.SeedSequence(check_int("seed", seed)).generate_state(3)
    )
    models = CachedTrain(train, str(root / "models"))
    score = InputScore(canary, statistic)

    def runner(t: TrainFunction, s: InputScore, n: int, master: int, file: str, **kw: Any):
        return AuditRunner(
            t, s, num_runs=n, seed=master, path=root / file,
            workers=kw.get("workers", workers), progress=kw.get("progress", progress),
        )

    evaluation_runner = runner(models, score, n_eval, eval_seed, "evaluation-canary.jsonl")
    plans: list[tuple[CraftingMode, CachedTrain, AuditRunner]] = []
    if n_craft:
        plans.append(
            ("white-box", models, runner(models, score, n_craft, craft_seed, "crafting.jsonl"))
        )
    if n_sur:
        assert surrogate_train is not None
        surrogates = CachedTrain(surrogate_train, str(root / "surrogate-models"))
        plans.append(
            ("black-box", surrogates,
             runner(surrogates, InputScore(canary, statistic), n_sur, sur_seed, "surrogate.jsonl"))
        )
    for _, _, r in plans:  # before anything is trained
        check_disjoint_runs(r.assignments(), evaluation_runner.assignments())

    crafted: list[tuple[CraftingMode, CraftedSample]] = []
    crafting_records: dict[CraftingMode, RunRecords] = {}
    for mode, cache, r in plans:
        records = r.run()
        crafting_records[mode] = records
        ins, outs = cache.models(records)
        for obj in objectives:
            crafted.append(
                (mode, craft_adversarial_sample(canary, ins, outs, objective=obj,  # type: ignore[arg-type]
                                                statistic=statistic, **options))
            )

    evaluation = evaluation_runner.run()
    for records in crafting_records.values():
        check_disjoint_runs(records, evaluation)
    if in_sample:
        ins, outs = models.models(evaluation)
        for obj in objectives:
            crafted.append(
                ("in-sample", craft_adversarial_sample(
                    canary, ins, outs, objective=obj,  # type: ignore[arg-type]
                    statistic=statistic, **{**options, "validation_fraction": 0.0}))
            )
    audits = [_audit("canary", "canary", canary, evaluation, None, delta, confidence,
                     threshold_strategy)]
    for mode, c in crafted:
        name = f"{c.objective} ({mode})"
        rescore = runner(models, InputScore(c.sample, statistic), n_eval, eval_seed,
                         f"evaluation-{c.objective}-{mode}.jsonl", workers=0, progress=False)
        audits.append(_audit(name, mode, c.sample, rescore.run(), c, delta, confidence,
                             threshold_strategy))
    return InputAuditReport(
        audits=tuple(audits),
        evaluation=evaluation,
        crafting=crafting_records.get("white-box"),
        surrogate=crafting_records.get("black-box"),
        delta=delta,
        confidence=confidence,
    )
