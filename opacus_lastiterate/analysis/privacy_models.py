"""The registry of privacy models and the chooser: one name per number, one place that decides
how it is computed for a run.

Every privacy number of this package comes from a :class:`~.privacy_model.PrivacyModel`
built from a :class:`~.run.DPSGDRun` (``docs/run_description.md``, "Privacy models"); this
module names them once. :func:`choose` decides, from the name, the run's sampling scheme and
whether the run has per-step weights, which model computes the number (and which kept engine
follows it step by step, :class:`~.kept_model.KeptModel`); :func:`privacy_model` builds that
model. Calibration, the side-by-side comparison, the batch-size plan, the CLI and
``LastIterateAccountant`` (through :class:`~.kept_model.KeptModel`) take their numbers here.

A new computation is one place here: a new number is an entry of the table below; a new
sampling scheme or privacy unit with its own model is a row of ``_EPOCH_CLASSES`` /
``_SCHEME_CLASSES`` read by :func:`choose`; a new optimizer's weights are one entry of
:data:`~.kept_model.OPTIMIZER_WEIGHTS` (a run from scratch carries its weights in
``DPSGDRun.weights``, whatever optimizer made them).

========================  ===================================  =============  ==================
name                      class                                kind           keyword parameters
========================  ===================================  =============  ==================
``"heuristic"``           :class:`LastIterateHeuristic`        heuristic      ``accuracy=1e-3``
``"robust_heuristic"``    :class:`RobustLastIterateHeuristic`  heuristic      (none)
``"standard"``            :class:`StandardComposition`         upper_bound    ``value_discretization_interval=1e-4``
``"standard_rdp"``        :class:`RDPComposition`              upper_bound    ``orders=None``
``"full_batch"``          :class:`FullBatchGaussian`           exact          (none)
``"asgm"``                :class:`ASGM`                        upper_bound    ``value_discretization_interval=3e-4``, ``discretization_method="connect_dots"``
``"feasgm"``              :class:`FEASGM`                      model          ``value_discretization_interval=None``, ``discretization_method="connect_dots"``
========================  ===================================  =============  ==================

The weighted heuristic (learning-rate schedules, momentum) is ``"heuristic"`` on a run with
``weights``.

**Sampling schemes** (``docs/samplers.md``). On a run whose ``sampling`` is shuffled,
deterministic or balls-in-bins batches (or an unknown sampler assuming one of them),
``"heuristic"`` builds :class:`~.sampling_heuristic.SamplingHeuristic`, ``"robust_heuristic"``
:class:`~.sampling_heuristic.RobustSamplingHeuristic` and ``"standard"`` and
``"standard_rdp"`` :class:`~.sampling_standard.NoAmplificationBound` (an upper bound without
amplification, in closed form), except ``"standard"`` on a balls-in-bins run, which builds
:class:`~.sampling_allocation.BallsInBinsBound` (random allocation, pld-accounting; without it
installed, the same no-amplification value, so labelled); each carries the scheme in its label. ``"full_batch"``,
``"asgm"`` and ``"feasgm"`` are unchanged. A run with ``sampling=None`` or
:class:`~.sampling.PoissonSampling` gets the classes of the table, unchanged. ``"asgm"`` and ``"feasgm"`` read what they need beyond the segments from
``run.normalisation`` (``docs/normalisation.md``).

**Privacy units** (``docs/privacy_units.md``). On a run whose ``unit`` is a user with at
most k records or a group of k (:class:`~.privacy_unit.PrivacyUnit`), ``"heuristic"`` builds
:class:`~.user_level.UserLevelHeuristic` (Poisson) or
:class:`~.user_level.UserLevelSamplingHeuristic` (the epoch schemes), and ``"standard"``
:class:`~.user_level_standard.UserLevelComposition` (Poisson: a mixture-of-Gaussians PLD) or
:class:`~.user_level_standard.UserLevelNoAmplificationBound`; the other names have no
model for such a unit and refuse it (``ValueError`` naming ``unit``), and every record-level
model refuses such a run when built directly (:class:`~.privacy_model.PrivacyModel`).
A user under user-level sampling (``PrivacyUnit.sampled_user()``: users sampled, each
user's records clipped together) makes one contribution per step it is sampled in, like a
record: every name builds its record-level class, whose numbers, with the run's sizes and
rates counted in users, are the user's (``run.unit.label()`` says "user-level sampling").

**The PLD value discretisation interval** (``value_discretization_interval``, the grid step
of the privacy loss in nats): every PLD model rounds pessimistically, so any interval gives an
upper bound on its model. The defaults are the values the published numbers were computed with
(``docs/run_description.md``): ``"standard"`` 1e-4
(:data:`~.baselines.composition.DEFAULT_DISCRETIZATION`, also calibration's, the comparison's,
the plan's and the CLI's), ``"asgm"`` 3e-4 (:data:`~.normalisation.discretisation.DEFAULT_INTERVAL`),
``"feasgm"`` None (automatic, :func:`~.normalisation.divisor_leak.divisor_leak_pld`);
:attr:`PrivacyModelEntry.defaults` reports each model's.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from opacus_lastiterate.analysis.privacy_model import PrivacyModel
from opacus_lastiterate.analysis.privacy_unit import PrivacyUnit
from opacus_lastiterate.analysis.run import DPSGDRun, RunLike, as_run
from opacus_lastiterate.analysis.sampling import (
    BallsInBins,
    DeterministicBatches,
    SamplingScheme,
    ShuffledBatches,
    effective_sampling,
)

__all__ = [
    "PRIVACY_MODELS",
    "Choice",
    "choose",
    "privacy_model",
]

ModelName = Literal[
    "heuristic", "robust_heuristic", "standard", "standard_rdp", "full_batch", "asgm", "feasgm"
]


@dataclass(frozen=True)
class PrivacyModelEntry:
    """One registered privacy model.

    Attributes:
        name: the registry name (module table).
        kind: what the number is: "exact", "heuristic", "upper_bound" or "model" (the class's
            :attr:`~.privacy_model.PrivacyModel.kind`).
        description: one line saying what the number describes (the label printed beside it).
        needs: what the run must carry beyond its segments ("" when nothing).
        class_path: ``"module:ClassName"`` of the class (imported on first use: the PLD
            models load dp_accounting).
    """

    name: str
    kind: str
    description: str
    needs: str
    class_path: str

    @property
    def cls(self) -> type[PrivacyModel]:
        """The :class:`~.privacy_model.PrivacyModel` subclass."""
        return _model_class(self.class_path)

    @property
    def defaults(self) -> Mapping[str, Any]:
        """The keyword parameters of the model and their defaults (from its constructor)."""
        signature = inspect.signature(self.cls.__init__)
        return MappingProxyType({
            p.name: p.default
            for p in signature.parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY
        })

    def build(self, run: RunLike, **params: Any) -> PrivacyModel:
        """The model of ``run`` (:func:`privacy_model`), as :func:`choose` decides it."""
        checked = as_run(run)
        choice = choose(
            self.name, sampling=checked.sampling, weighted=checked.weights is not None,
            unit=checked.unit,
        )  # fmt: skip
        return choice.build(checked, **params)

    def check_params(self, params: Mapping[str, Any]) -> None:
        """TypeError naming the keyword parameters of ``params`` the model does not take."""
        if not params:
            return
        allowed = self.defaults
        unknown = sorted(set(params) - set(allowed))
        if unknown:
            known = ", ".join(allowed) or "none"
            raise TypeError(
                f"privacy model {self.name!r} got unknown parameter(s) {', '.join(unknown)}; "
                f"its parameters: {known}."
            )


@dataclass(frozen=True)
class Choice:
    """How one registry name is computed for a run (:func:`choose`).

    Attributes:
        name: the registry name.
        class_path: ``"module:ClassName"`` of the model that computes it from scratch.
        weights: whether the model reads the run's per-step weights (False: the robust
            maximum, computed for the constant-rate formula, and the standard bounds, for
            which the weights do not matter: every step is released).
        kept: the kept engine that follows the run step by step and gives the same number
            (:class:`~.kept_model.KeptModel`): ``"constant"``
            (:class:`~.last_iterate.incremental.IncrementalHeuristic`), ``"weighted"``
            (:class:`~.last_iterate.incremental_weighted.IncrementalWeightedHeuristic`, within
            the requested accuracy), or None (from scratch).
    """

    name: str
    class_path: str
    weights: bool
    kept: Literal["constant", "weighted"] | None

    @property
    def cls(self) -> type[PrivacyModel]:
        """The :class:`~.privacy_model.PrivacyModel` subclass (imported on first use)."""
        return _model_class(self.class_path)

    def build(self, run: DPSGDRun, **params: Any) -> PrivacyModel:
        """The model of the validated ``run`` with the keyword ``params`` of its entry."""
        PRIVACY_MODELS[self.name].check_params(params)
        return self.cls(run, **params)  # type: ignore[call-arg]


def choose(
    name: ModelName | str,
    *,
    sampling: SamplingScheme | None,
    weighted: bool,
    unit: PrivacyUnit | None = None,
) -> Choice:
    """How the number ``name`` is computed for a run whose batches are drawn by ``sampling``
    (None: Poisson), that has per-step weights (``weighted``: learning-rate schedules,
    momentum, weight decay) or not, and that protects ``unit`` (None: one record): the one
    place where that is decided (module docstring, "Sampling schemes" and "Privacy units"),
    for a run from scratch (:func:`privacy_model`) and for a run kept as it grows
    (:class:`~.kept_model.KeptModel`).

    Raises:
        TypeError: ``name`` is not a string.
        ValueError: an unknown ``name``, or a name without a model for ``unit``.
    """
    entry = _entry(name)
    scheme = effective_sampling(sampling)
    epoch = isinstance(scheme, (ShuffledBatches, DeterministicBatches, BallsInBins))
    if unit is not None and unit.max_records > 1:  # at most one record: the record's models
        path = _UNIT_CLASSES.get((entry.name, epoch))
        if path is None:
            known = sorted({n for n, _ in _UNIT_CLASSES})
            raise ValueError(
                f"`unit` is {unit.describe()}, and {entry.name!r} has no model for it; the "
                f"names with one: {', '.join(known)}."
            )
        return Choice(entry.name, path, True, None)
    path = entry.class_path
    if epoch and entry.name in _EPOCH_CLASSES:
        path = _SCHEME_CLASSES.get((entry.name, type(scheme)), _EPOCH_CLASSES[entry.name])
    kept: Literal["constant", "weighted"] | None = None
    if entry.name == "heuristic" and not epoch:
        kept = "weighted" if weighted else "constant"
    return Choice(entry.name, path, entry.name not in _WITHOUT_WEIGHTS, kept)


_PREFIX = "opacus_lastiterate.analysis."
_ENTRIES = (
    PrivacyModelEntry(
        "heuristic",
        "heuristic",
        "last-iterate heuristic (final model only; exact for linear losses, "
        "not a proven bound for deep networks)",
        "",
        _PREFIX + "last_iterate.heuristic:LastIterateHeuristic",
    ),
    PrivacyModelEntry(
        "robust_heuristic",
        "heuristic",
        "robust heuristic: max over the last t <= T steps",
        "no per-step weights",
        _PREFIX + "last_iterate.heuristic:RobustLastIterateHeuristic",
    ),
    PrivacyModelEntry(
        "standard",
        "upper_bound",
        "standard composition (all iterates released): dp_accounting PLD, "
        "pessimistic upper bound",
        "",
        _PREFIX + "baselines.composition:StandardComposition",
    ),
    PrivacyModelEntry(
        "standard_rdp",
        "upper_bound",
        "standard composition (all iterates released): dp_accounting RDP, upper bound",
        "",
        _PREFIX + "baselines.composition:RDPComposition",
    ),
    PrivacyModelEntry(
        "full_batch",
        "exact",
        "full-batch DP-GD with the same expected step and noise (closed form)",
        "",
        _PREFIX + "baselines.composition:FullBatchGaussian",
    ),
    PrivacyModelEntry(
        "asgm",
        "upper_bound",
        "ASGM (batch size revealed, other gradients zero): division by the realised batch size",
        "normalisation.dataset_size",
        _PREFIX + "normalisation.asgm:ASGM",
    ),
    PrivacyModelEntry(
        "feasgm",
        "model",
        "FEASGM (zero other gradients): Opacus 1.x's floor-based expected-batch divisor",
        "normalisation.dataset_size, batch_size, dimension",
        _PREFIX + "normalisation.divisor_leak:FEASGM",
    ),
)

# The names whose models do not read the weights: computed for the constant-rate formula only
# (their models refuse weights), or standard bounds (every step released: weights do not matter).
_WITHOUT_WEIGHTS = frozenset({"robust_heuristic", "standard", "standard_rdp"})

# The class each name builds for a run with an epoch scheme (module docstring).
_EPOCH_CLASSES = {
    "heuristic": _PREFIX + "sampling_heuristic:SamplingHeuristic",
    "robust_heuristic": _PREFIX + "sampling_heuristic:RobustSamplingHeuristic",
    "standard": _PREFIX + "sampling_standard:NoAmplificationBound",
    "standard_rdp": _PREFIX + "sampling_standard:NoAmplificationBound",
}

# Where one scheme has its own class for a name (module docstring): (name, scheme type) -> class.
_SCHEME_CLASSES: dict[tuple[str, type], str] = {
    ("standard", BallsInBins): _PREFIX + "sampling_allocation:BallsInBinsBound",
}

# The class each name builds for a run whose unit is a user or a group of k records (module
# docstring, "Privacy units"): (name, epoch scheme?) -> class; the other names have none.
_UNIT_CLASSES: dict[tuple[str, bool], str] = {
    ("heuristic", False): _PREFIX + "user_level:UserLevelHeuristic",
    ("heuristic", True): _PREFIX + "user_level:UserLevelSamplingHeuristic",
    ("standard", False): _PREFIX + "user_level_standard:UserLevelComposition",
    ("standard", True): _PREFIX + "user_level_standard:UserLevelNoAmplificationBound",
}

PRIVACY_MODELS: Mapping[str, PrivacyModelEntry] = MappingProxyType({e.name: e for e in _ENTRIES})
"""Registry name -> :class:`PrivacyModelEntry` (module table)."""

PRIVACY_MODEL_NAMES: tuple[str, ...] = tuple(PRIVACY_MODELS)
"""The registry names, in the order of the module table."""


def privacy_model(name: ModelName | str, run: RunLike, /, **params: Any) -> PrivacyModel:
    """The privacy model ``name`` of ``run``, built with the keyword ``params`` of its entry.

    Args:
        name: one of :data:`PRIVACY_MODEL_NAMES`.
        run: a :class:`~.run.DPSGDRun` or an Opacus-style history.
        params: the model's keyword parameters (:attr:`PrivacyModelEntry.defaults`).

    Raises:
        TypeError: ``name`` is not a string, or a parameter the model does not take (named).
        ValueError: an unknown ``name``, or an invalid run or parameter value.
    """
    return _entry(name).build(run, **params)


def _model_class(class_path: str) -> type[PrivacyModel]:
    """The class at ``"module:ClassName"`` (imported on first use: the PLD models load
    dp_accounting)."""
    module, _, name = class_path.partition(":")
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, PrivacyModel)
    return cls


def _entry(name: object) -> PrivacyModelEntry:
    if not isinstance(name, str):
        raise TypeError(f"`name` must be a string, got {name!r} of type {type(name).__name__}.")
    try:
        return PRIVACY_MODELS[name]
    except KeyError:
        raise ValueError(
            f"`name` must be one of {', '.join(PRIVACY_MODEL_NAMES)}, got {name!r}."
        ) from None
