"""Opacus accountants for normalised DP-SGD: ``"feasgm"`` (Opacus 1.x) and ``"asgm"`` (0.x).

``docs/normalisation.md``. Both need facts that Opacus never passes to an accountant:

* **N** (``dataset_size``): always explicit, ``accountant.configure(dataset_size=N)`` or
  ``configure(data_loader=loader)`` (N = len(loader.dataset)).
* **L** (``batch_size``, FEASGM only): the batch size of the DataLoader given to
  ``make_private``; explicit, or read from that (non-DP) loader by ``configure``.
* **d** (``dimension``, FEASGM's dimension-aware curve only): read from the optimizer at each
  step (number of trainable parameters) by the hook of :meth:`get_optimizer_hook_fn`, or
  explicit (an explicit value wins).

The hook also records the optimizer's ``expected_batch_size`` and ``loss_reduction`` and the
public divisor set by :func:`~opacus_lastiterate.accountants.use_public_divisor`. Calling
``get_epsilon`` without what it needs raises ``ValueError`` naming the missing parameters.

``make_private_with_epsilon`` creates a fresh, unconfigured accountant by name, so with these
accountants it raises that error: calibrate with ``"prv"`` and account with these.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

from opacus.optimizers import DPOptimizer

from opacus_lastiterate._warn import warn
from opacus_lastiterate.accountants._normalisation_config import (
    CONFIG_DEFAULTS,
    check_config,
    config_from_loader,
    optional,
)
from opacus_lastiterate.accountants.base import RunAccountant, synchronized
from opacus_lastiterate.accountants.opacus_sgm import opacus_rdp_delta, opacus_sgm_epsilon
from opacus_lastiterate.accountants.public_divisor import (
    public_divisor_of,
    public_divisor_verdict_at_opacus_rate,
)
from opacus_lastiterate.analysis._validation import (
    check_delta,
    check_epsilon,
    check_positive,
)
from opacus_lastiterate.analysis.normalisation import DivisorVerdict
from opacus_lastiterate.analysis.normalisation.asgm import ASGM, ASGM_MODEL
from opacus_lastiterate.analysis.normalisation.discretisation import DEFAULT_INTERVAL
from opacus_lastiterate.analysis.normalisation.divisor_leak import FEASGM, FEASGM_MODEL
from opacus_lastiterate.analysis.normalisation.divisor_verdict import feasgm_verdict
from opacus_lastiterate.analysis.normalisation.opacus_arithmetic import opacus1x_batch_arithmetic
from opacus_lastiterate.analysis.privacy_model import PrivacyModel
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun, Normalisation
from opacus_lastiterate.exceptions import NormalisationWarning

__all__ = [
    "ASGMAccountant",
    "FEASGMAccountant",
]

ASGM_MECHANISM = "asgm"
FEASGM_MECHANISM = "feasgm"
# Upper bounds only: Opacus's "gdp" (a central-limit approximation that can under-estimate)
# is deliberately not offered for a number we call a guarantee.
STANDARD_ACCOUNTANTS = ("pld", "rdp", "prv")
"""Standard SGM accountants for a safe FEASGM verdict: "pld" is
:func:`~opacus_lastiterate.analysis.baselines.composition.standard_epsilon_for_history`, the others
are Opacus's accountants of that name."""

History = list[tuple[float, float, int]]

# -- shared base --------------------------------------------------------------------------------


class _NormalisationAccountant(RunAccountant):
    """Configuration and optimizer observation shared by both accountants (history, steps
    and state come from :class:`~opacus_lastiterate.accountants.base.RunAccountant`)."""

    def __init__(self) -> None:
        """An empty accountant (Opacus's registry calls ``cls()``); see :meth:`configure`."""
        super().__init__()
        self._config: dict[str, Any] = dict(CONFIG_DEFAULTS)
        self._observed_dimension: int | None = None
        self._warned: set[str] = set()

    # configuration

    def configure(
        self,
        *,
        dataset_size: int | None = None,
        batch_size: int | None = None,
        dimension: int | None = None,
        drop_last: bool | None = None,
        public_divisor: float | None = None,
        standard: str | None = None,
        data_loader: object = None,
    ) -> _NormalisationAccountant:
        """Set what Opacus does not pass (module docstring); arguments left None are unchanged.

        Args:
            dataset_size: N = len(dataset), an integer >= 1.
            batch_size: L, the batch size of the DataLoader given to ``make_private``.
            dimension: d, the number of trainable parameters (overrides the observed one).
            drop_last: that DataLoader's ``drop_last``.
            public_divisor: the constant the optimizer divides by, if public (what
                ``use_public_divisor`` sets; the hook also reads it from the optimizer).
            standard: SGM accountant for a safe verdict, one of :data:`STANDARD_ACCOUNTANTS`.
            data_loader: a DataLoader to read N (and, if not a DPDataLoader, L and
                drop_last) from; explicit arguments win.

        Returns:
            ``self``. Everything is validated before anything changes.
        """
        new = dict(self._config)
        if data_loader is not None:
            new.update(config_from_loader(data_loader))
        explicit = {
            "dataset_size": dataset_size,
            "batch_size": batch_size,
            "dimension": dimension,
            "drop_last": drop_last,
            "public_divisor": public_divisor,
            "standard": standard,
        }
        new.update({k: v for k, v in explicit.items() if v is not None})
        self._config = check_config(new, STANDARD_ACCOUNTANTS)
        return self

    @property
    def configuration(self) -> dict[str, Any]:
        """A copy of the configuration (explicit values and what the hook observed)."""
        config = dict(self._config)
        if config["dimension"] is None:
            config["dimension"] = self._observed_dimension
        return config

    def _require(self, *keys: str) -> dict[str, Any]:
        config = self.configuration
        missing = [k for k in keys if config[k] is None]
        if missing:
            how = {
                "dataset_size": "dataset_size=len(train_dataset)",
                "batch_size": "batch_size=<the DataLoader batch size given to make_private>",
                "dimension": "dimension=<number of trainable parameters> (or take a training "
                "step, after which it is read from the optimizer)",
            }
            raise ValueError(
                f"{type(self).__name__} needs {', '.join(f'`{k}`' for k in missing)}, which "
                f"Opacus does not pass to accountants: call accountant.configure("
                f"{', '.join(how[k] for k in missing)}) (or configure(data_loader=...))."
            )
        return config

    # optimizer hook (RunAccountant.get_optimizer_hook_fn validates, then calls _observe)

    def _observe(self, optim: DPOptimizer) -> None:
        self._observed_dimension = int(sum(p.numel() for p in optim.params if p.requires_grad))
        reduction = getattr(optim, "loss_reduction", None)
        divisor = getattr(optim, "expected_batch_size", None)
        public = public_divisor_of(optim)
        config = dict(self._config)
        config["loss_reduction"] = reduction if reduction in ("mean", "sum") else None
        config["optimizer_divisor"] = (
            float(divisor) if isinstance(divisor, numbers.Real) and float(divisor) >= 0 else None
        )
        if public is not None:
            config["public_divisor"] = public
        self._config = check_config(config, STANDARD_ACCOUNTANTS)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warn(message, NormalisationWarning)

    # state

    def _extra_state(self) -> dict[str, Any]:
        return {"configuration": self.configuration}

    def _check_extra_state(self, state_dict: Mapping[str, Any]) -> Any:
        """A state without ``"configuration"`` keeps the current configuration."""
        if "configuration" not in state_dict:
            return self._config
        given = state_dict["configuration"]
        if not isinstance(given, Mapping):
            raise TypeError(
                f"`state_dict['configuration']` must be a mapping, got {type(given).__name__}."
            )
        return check_config(given, STANDARD_ACCOUNTANTS, prefix="state_dict['configuration'].")

    def _load_extra_state(self, checked: Any) -> None:
        self._config = dict(checked)
        self._observed_dimension = None
        self._warned = set()

    def _history(self) -> History:
        return self.history


# -- FEASGM -------------------------------------------------------------------------------------


class FEASGMAccountant(_NormalisationAccountant):
    """Opacus 1.x's divisor int(N * q): ``PrivacyEngine(accountant="feasgm")``.

    ``docs/normalisation.md``, "FEASGM / EASGM with a data-dependent divisor". Configure N
    and L (:meth:`configure`); then :attr:`verdict` compares the divisors and sample rates of
    N - 1, N, N + 1, and :meth:`get_epsilon` returns the SGM epsilon of the recorded history
    from the ``standard`` accountant (default PLD) when safe, and ``inf`` when unsafe (the
    reason is ``accountant.verdict.reason``). :meth:`curve_epsilon` gives the dimension-aware
    curve of the zero-other-gradients configuration (what audits reach; a lower bound on the
    worst case). A divisor made public with ``use_public_divisor`` is picked up by the hook.
    """

    _MECHANISM = FEASGM_MECHANISM
    _standard: tuple[DPSGDRun, PrivacyModel] | None = None

    @property
    def verdict(self) -> DivisorVerdict:
        """The verdict for the configured (N, L) and divisor (``DivisorVerdict``).

        Raises:
            ValueError: if ``dataset_size`` or ``batch_size`` is not configured.
        """
        config = self._require("dataset_size", "batch_size")
        opacus = feasgm_verdict(
            config["dataset_size"], config["batch_size"], drop_last=config["drop_last"]
        )
        public = self._public_divisor(config)
        if public is None:
            return opacus
        return public_divisor_verdict_at_opacus_rate(
            opacus, public, summed=config["public_divisor"] is None
        )

    @staticmethod
    def _public_divisor(config: Mapping[str, Any]) -> float | None:
        if config["public_divisor"] is not None:
            return float(config["public_divisor"])
        if config["loss_reduction"] == "sum":
            return 1.0  # no division at all: the noisy sum is released
        return None

    def _check_consistency(self, history: History, config: Mapping[str, Any]) -> None:
        row = opacus1x_batch_arithmetic(
            config["dataset_size"], config["batch_size"], drop_last=config["drop_last"]
        )
        rates = sorted({q for _, q, _ in history})
        if any(not math.isclose(q, row.accountant_rate, rel_tol=1e-12) for q in rates):
            self._warn_once(
                "rate",
                f"FEASGMAccountant: the recorded sample rates {rates} differ from Opacus 1.x's "
                f"1/len(DPDataLoader) = {row.accountant_rate!r} for the configured N = "
                f"{row.dataset_size}, L = {row.batch_size}: check configure(dataset_size, "
                "batch_size, drop_last); the verdict models make_private(poisson_sampling=True) "
                "without gradient accumulation.",
            )
        observed = config["optimizer_divisor"]
        if (
            self._public_divisor(config) is None
            and observed is not None
            and observed != row.expected_batch_size
        ):
            self._warn_once(
                "divisor",
                f"FEASGMAccountant: the optimizer divides by expected_batch_size = {observed:g}, "
                f"not Opacus 1.x's int(N * q) = {row.expected_batch_size} for the configured "
                f"N = {row.dataset_size}, L = {row.batch_size}; if that value is a public "
                "constant, set it with use_public_divisor(optimizer, expected_batch_size=...).",
            )

    @synchronized
    def get_epsilon(self, delta: float) -> float:
        """Corrected epsilon (``docs/normalisation.md``, "FEASGM / EASGM with a
        data-dependent divisor"): the ``standard`` SGM epsilon of the history if the verdict
        is safe, ``inf`` if unsafe (reason: ``verdict.reason``).

        Args:
            delta: in (0, 1).

        Raises:
            TypeError: for any keyword argument (Opacus's ``make_private_with_epsilon``
                forwards its extra keywords here; this accountant takes none, and a
                misspelt one is not ignored).
            ValueError: if N or L is not configured (the message names them).
        """
        d = check_delta(delta)
        history = self._history()
        if not history:
            return 0.0
        if self.run.has_zero_noise:
            return math.inf
        config = self._require("dataset_size", "batch_size")
        self._check_consistency(history, config)
        if not self.verdict.safe:
            return math.inf
        if config["standard"] == "pld":
            return self._standard_model().epsilon(d)
        return opacus_sgm_epsilon(history, d, config["standard"])

    def _standard_model(self) -> PrivacyModel:
        """The PLD model of the recorded run for its sampling scheme (the registry's
        ``"standard"``), built once per change of the history."""
        run = self.run
        if self._standard is None or self._standard[0] is not run:
            self._standard = (run, privacy_model("standard", run))
        return self._standard[1]

    @synchronized
    def get_delta(self, epsilon: float) -> float:
        """Corrected delta(epsilon), from the same ``standard`` accountant as
        :meth:`get_epsilon`, so that the two are one (epsilon, delta) curve: the SGM delta
        of the history when the verdict is safe, 1 when it is unsafe or a step had no
        noise, 0 for an empty history.

        * ``"pld"``: dp_accounting's PLD delta, read off the same PLD as the epsilon.
        * ``"rdp"``: the inverse of Opacus's RDP-to-DP conversion at its orders
          (:func:`~opacus_lastiterate.accountants.opacus_sgm.opacus_rdp_delta`): ``get_epsilon(get_delta(e)) == e`` up to floating
          point.
        * ``"prv"``: not available (``NotImplementedError``). Opacus's ``PRVAccountant``
          has no delta(epsilon) with error bounds: its discretisation is chosen from
          ``delta_error = delta / 1000`` of the delta asked for, and
          ``DiscretePRV.compute_delta_estimate`` is an estimate, not a bound.

        Raises:
            TypeError, ValueError: for an ``epsilon`` that is not a number in [0, inf).
            ValueError: if N or L is not configured.
            NotImplementedError: for ``standard="prv"`` (use ``configure(standard="pld")``
                or ``"rdp"`` for a delta).
        """
        e = check_epsilon(epsilon)
        if not self._num_steps:
            return 0.0
        config = self._require("dataset_size", "batch_size")
        if config["standard"] == "prv":
            raise NotImplementedError(
                "FEASGMAccountant.get_delta is not available with standard='prv': Opacus's "
                "PRVAccountant gives an epsilon at a delta, with error bounds, but no delta at "
                "an epsilon. Call accountant.configure(standard='pld') (the default) or "
                "configure(standard='rdp') for a delta consistent with get_epsilon."
            )
        self._check_consistency(self.history, config)
        if self.run.has_zero_noise or not self.verdict.safe:
            return 1.0
        if config["standard"] == "rdp":
            return opacus_rdp_delta(self.history, e)
        return self._standard_model().delta(e)

    def curve_model(
        self, value_discretization_interval: float | None = None
    ) -> FEASGM:
        """The dimension-aware FEASGM curve of the recorded run (:class:`FEASGM`).

        Raises:
            ValueError: if N, L or d is not configured/observed.
        """
        config = self._require("dataset_size", "batch_size", "dimension")
        interval = optional("value_discretization_interval", value_discretization_interval, check_positive)
        public = self._public_divisor(config)
        norm = Normalisation(
            "floored_expected" if public is None else "public",
            dataset_size=config["dataset_size"],
            batch_size=config["batch_size"],
            drop_last=config["drop_last"],
            dimension=config["dimension"],
            public_divisor=public,
        )
        run = DPSGDRun._trusted(self.run.segments, None, norm)
        return FEASGM(run, value_discretization_interval=interval)

    def _curve(self, value: float, kind: str, interval_arg: float | None) -> float:
        """epsilon(delta) (``kind="epsilon"``) or delta(epsilon) of the curve model."""
        if not self._num_steps:
            return 0.0
        model = self.curve_model(interval_arg)
        self._check_consistency(self.history, self._require("dataset_size", "batch_size"))
        return model.epsilon(value) if kind == "epsilon" else model.delta(value)

    def curve_epsilon(
        self, delta: float, *, value_discretization_interval: float | None = None
    ) -> float:
        """Dimension-aware epsilon(delta) of the recorded steps in the zero-other-gradients
        configuration with d = ``dimension`` (``docs/normalisation.md``, "FEASGM / EASGM
        with a data-dependent divisor"; label :data:`FEASGM_MODEL`): what an audit can reach,
        a lower bound on the worst case.
        Varying noise multipliers are composed exactly, segment by segment.

        Raises:
            ValueError: if N, L or d is not configured/observed.
        """
        return self._curve(check_delta(delta), "epsilon", value_discretization_interval)

    def curve_label(self) -> str:
        """The model label of :meth:`curve_epsilon` for the configured d."""
        config = self._require("dimension")
        label = FEASGM_MODEL.format(dimension=config["dimension"])
        public = self._public_divisor(config)
        if public is not None:
            label += f", here with the public divisor {public:g} (SGM's curve)"
        return label

    def describe(self, delta: float | None = None) -> str:
        """Verdict, reason and (with ``delta``) the corrected and curve epsilons, labelled."""
        lines = [f"FEASGMAccountant: {self.num_steps} steps in {len(self)} segment(s)."]
        config = self.configuration
        if config["dataset_size"] is None or config["batch_size"] is None:
            lines.append("Not configured: call configure(dataset_size=..., batch_size=...).")
            return "\n".join(lines)
        v = self.verdict
        lines.append(
            f"Verdict ({v.rule}): {v.verdict}. N = {v.dataset_sizes}, divisors = {v.divisors}, "
            f"sample rates = {v.sample_rates}."
        )
        lines.append(v.reason)
        if delta is not None:
            eps = self.get_epsilon(delta)
            label = (
                f"SGM guarantee ({config['standard']} accountant)"
                if v.safe
                else "no finite guarantee"
            )
            lines.append(f"Corrected epsilon at delta={check_delta(delta):g}: {eps:.4f} [{label}].")
            if config["dimension"] is not None:
                lines.append(
                    f"Curve epsilon: {self.curve_epsilon(delta):.4f} [{self.curve_label()}]."
                )
        return "\n".join(lines)

    def __repr__(self) -> str:
        c = self.configuration
        return (
            f"FEASGMAccountant(segments={len(self)}, dataset_size={c['dataset_size']}, "
            f"batch_size={c['batch_size']}, dimension={c['dimension']}, "
            f"public_divisor={c['public_divisor']})"
        )


# -- ASGM ---------------------------------------------------------------------------------------


class ASGMAccountant(_NormalisationAccountant):
    """Division by the realised batch size (Opacus 0.x): ``PrivacyEngine(accountant="asgm")``.

    ``docs/normalisation.md``, "ASGM: dividing by the realised batch size": the exact
    "batch size revealed" model (label :data:`ASGM_MODEL`), worst of both neighbours of an
    N-record data set and both directions, composed segment by segment (varying sigma and q
    are exact). Needs only N (:meth:`configure`). Every hooked step counts, empty batches
    included (Opacus 1.x steps on them), as the model's empty-batch convention requires.
    An Opacus 1.x optimizer with ``loss_reduction="mean"`` divides by ``expected_batch_size``
    instead: the hook then warns that ``"feasgm"`` is the accountant for it.
    """

    _MECHANISM = ASGM_MECHANISM
    _model: tuple[DPSGDRun, int, ASGM] | None = None

    def _observe(self, optim: DPOptimizer) -> None:
        super()._observe(optim)
        if self._config["loss_reduction"] == "mean":
            self._warn_once(
                "mean",
                "ASGMAccountant: this DPOptimizer divides by expected_batch_size (Opacus 1.x, "
                "FEASGM), not by the realised batch size; the ASGM number does not cover that "
                "divisor. Use PrivacyEngine(accountant='feasgm') for this optimizer.",
            )

    def model(self) -> ASGM:
        """The ASGM privacy model of the recorded run (built once per step)."""
        n = self._require("dataset_size")["dataset_size"]
        base = self.run  # a new object after every change of the history
        if self._model is None or self._model[0] is not base or self._model[1] != n:
            run = DPSGDRun._trusted(base.segments, None, Normalisation("realised", dataset_size=n))
            self._model = (base, n, ASGM(run, value_discretization_interval=DEFAULT_INTERVAL))
        return self._model[2]

    @synchronized
    def get_epsilon(self, delta: float) -> float:
        """ASGM epsilon of the recorded steps (an upper bound; inf when the all-sampled mass
        exceeds delta, or when a step had no noise).

        Args:
            delta: in (0, 1).

        Raises:
            TypeError: for any keyword argument (Opacus's ``make_private_with_epsilon``
                forwards its extra keywords here; this accountant takes none, and a
                misspelt one is not ignored).
            ValueError: if ``dataset_size`` is not configured.
        """
        d = check_delta(delta)
        if not self._num_steps:
            return 0.0
        return self.model().epsilon(d)

    @synchronized
    def get_delta(self, epsilon: float) -> float:
        """ASGM delta(epsilon) of the recorded steps (an upper bound)."""
        e = check_epsilon(epsilon)
        if not self._num_steps:
            return 0.0
        return self.model().delta(e)

    def describe(self, delta: float | None = None) -> str:
        """The model and (with ``delta``) the labelled epsilon."""
        lines = [
            f"ASGMAccountant: {self.num_steps} steps in {len(self)} segment(s); model: {ASGM_MODEL}."
        ]
        if delta is not None:
            lines.append(
                f"Epsilon at delta={check_delta(delta):g}: {self.get_epsilon(delta):.4f} [{ASGM_MODEL}]."
            )
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"ASGMAccountant(segments={len(self)}, dataset_size={self._config['dataset_size']})"
