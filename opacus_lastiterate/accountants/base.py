"""What every accountant of this package shares: one history, validated where it enters.

:class:`RunAccountant` implements Opacus's ``IAccountant`` bookkeeping once:

* ``history``: ``[(noise_multiplier, sample_rate, steps), ...]``, run-length merged like
  Opacus's own accountants. Reading it returns a copy; assigning it (as Opacus's
  ``get_noise_multiplier`` does) validates the whole list first.
* ``step``: validates (sigma, q) and records them. A noise multiplier of 0 is accepted, as
  Opacus accepts it: the step is recorded, a :class:`ZeroNoiseWarning` is emitted once, and
  the accountants report what it implies (epsilon = inf where a step is released without
  noise). Accounting never aborts a training step that Opacus itself accepts.
* ``state_dict``/``load_state_dict``: Opacus's keys plus each accountant's own; a state is
  validated completely before anything changes.
* :attr:`run`: the history as a :class:`~opacus_lastiterate.analysis.run.DPSGDRun`, built
  once per change, which the analysis layer trusts without re-validating.
* :attr:`sampling`: how the batches are drawn (``docs/samplers.md``): detected from the loader
  ``make_private`` returns (:mod:`.engine_sampling`), or declared by the user with
  :meth:`~RunAccountant.declare_sampling`; ``None`` means Poisson at the recorded rates.
  It is part of :attr:`run`, so every model computed from the accountant is the one of that
  scheme.

Subclasses set ``_MECHANISM`` and may override the ``_after_step``, ``_after_reset``,
``_observe``, ``_extra_state`` and ``_check_extra_state``/``_load_extra_state`` hooks.
"""

from __future__ import annotations

import contextvars
import copy
import functools
import inspect
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar, TypeVar

from opacus.accountants import IAccountant

from opacus_lastiterate._warn import warn
from opacus_lastiterate.accountants.adaptive_clipping import accounting_noise_multiplier
from opacus_lastiterate.analysis._validation import (
    check_int,
    check_sample_rate,
    check_step_noise,
)
from opacus_lastiterate.analysis.privacy_unit import PrivacyUnit
from opacus_lastiterate.analysis.run import DPSGDRun, TrainingSegment, append_steps, as_segments
from opacus_lastiterate.analysis.sampling import (
    SamplingScheme,
    check_sampling,
    check_sampling_matches,
    sampling_from_dict,
)
from opacus_lastiterate.exceptions import SamplingWarning, ZeroNoiseWarning

__all__ = [
    "RunAccountant",
]

History = list[tuple[float, float, int]]


def _mechanism_name(value: object) -> object:
    """The mechanism name stored in a state dict.

    Opacus < 1.6 stored the bound classmethod ``cls.mechanism`` instead of its result (fixed
    in Opacus PR #778); such a value is resolved to its name, anything else is returned as is.
    """
    if (
        inspect.ismethod(value)
        and isinstance(value.__self__, type)
        and issubclass(value.__self__, IAccountant)
    ):
        return value()
    return value


_NEW_ACCOUNTANT_SAMPLING: contextvars.ContextVar[SamplingScheme | None] = contextvars.ContextVar(
    "opacus_lastiterate_new_accountant_sampling", default=None
)


@contextmanager
def sampling_of_new_accountants(scheme: SamplingScheme | None) -> Iterator[None]:
    """Within this block, a new :class:`RunAccountant` starts with ``scheme`` as its
    :attr:`~RunAccountant.sampling` (what ``make_private_with_epsilon`` needs: Opacus's
    calibration creates a fresh accountant by name, which must know the run's scheme)."""
    token = _NEW_ACCOUNTANT_SAMPLING.set(check_sampling(scheme, "scheme"))
    try:
        yield
    finally:
        _NEW_ACCOUNTANT_SAMPLING.reset(token)


def trim_history(
    history: list[tuple[float, float, int]] | list[list[Any]], steps: int
) -> list[tuple[float, float, int]]:
    """A run-length history ``[(sigma, q, steps), ...]`` without its last ``steps`` steps
    (``steps`` at most the history's total)."""
    out = [tuple(h) for h in history]
    while steps:
        sigma, q, n = out[-1]
        cut = min(steps, n)
        out[-1:] = [(sigma, q, n - cut)] if n > cut else []
        steps -= cut
    return out  # type: ignore[return-value]


def validate_history(history: object, name: str = "history") -> tuple[TrainingSegment, ...]:
    """A list/tuple of ``(noise_multiplier, sample_rate, num_steps)`` triples with sigma in
    [0, inf), q in (0, 1] and num_steps an integer >= 1; raises naming the bad entry."""
    if not isinstance(history, (list, tuple)):
        raise TypeError(
            f"`{name}` must be a list of (noise_multiplier, sample_rate, num_steps) triples, "
            f"got {history!r} of type {type(history).__name__}."
        )
    segments = as_segments(history, name)
    for i, seg in enumerate(segments):
        if seg.steps < 1:
            raise ValueError(f"`{name}[{i}].steps` must be an integer >= 1, got {seg.steps}.")
    return segments


_Method = TypeVar("_Method", bound=Callable[..., Any])


def synchronized(method: _Method) -> _Method:
    """``method`` run under its accountant's lock (:attr:`RunAccountant._lock`), so that a
    query from another thread sees the accountant between two recorded steps, never during
    one."""

    @functools.wraps(method)
    def locked(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked  # type: ignore[return-value]


class RunAccountant(IAccountant):
    """Opacus accountant bookkeeping shared by this package's accountants (module docs)."""

    _MECHANISM: ClassVar[str] = ""

    def __init__(self) -> None:
        """An empty accountant (Opacus's registry calls ``cls()``)."""
        self._segments: list[TrainingSegment] = []
        self._num_steps = 0
        self._run: DPSGDRun | None = None
        self._zero_noise_warned = False
        self._externally_assigned = False
        self._sampling: SamplingScheme | None = _NEW_ACCOUNTANT_SAMPLING.get()
        self._sampling_declared = False
        self._sampling_checked_rate: float | None = None
        # a subclass that takes a unit (LastIterateAccountant(unit=...)) sets it first
        self._unit: PrivacyUnit = self.__dict__.get("_unit", PrivacyUnit.record())
        self._revision = object()
        self._lock = threading.RLock()
        # IAccountant.__init__ would assign ``self.history = []``; nothing to validate here.

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]  # a lock is neither copied nor pickled: each copy has its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    # -- history ------------------------------------------------------------------------------

    @property
    def history(self) -> History:
        """A copy of the recorded segments ``[(noise_multiplier, sample_rate, steps), ...]``."""
        return [(s.noise_multiplier, s.sample_rate, s.steps) for s in self._segments]

    @history.setter
    @synchronized
    def history(self, value: History) -> None:
        # Opacus's get_noise_multiplier writes ``accountant.history = [(sigma, q, steps)]``.
        segments = validate_history(value)
        self._set_segments(segments)
        self._externally_assigned = True

    @property
    def revision(self) -> object:
        """A token replaced each time the history is replaced (:meth:`load_state_dict`, an
        assigned :attr:`history`, :meth:`take_back`) and kept while steps are recorded:
        whoever follows the accountant step by step compares it (``is``) to notice a change
        it did not make."""
        return self._revision

    def _set_segments(self, segments: tuple[TrainingSegment, ...]) -> None:
        self._revision = object()
        self._segments = list(segments)
        self._num_steps = sum(s.steps for s in segments)
        self._run = None
        if self._sampling is not None:  # a history at other rates is not of this scheme
            try:
                check_sampling_matches(self._sampling, [s.sample_rate for s in segments])
            except ValueError as exc:
                warn(
                    f"{type(self).__name__}: the history assigned does not fit the run's "
                    f"sampling ({exc}); the numbers assume Poisson sampling at its rates.",
                    SamplingWarning,
                )
                self._set_sampling(None)
                self._sampling_declared = False
        self._after_reset()

    @property
    def num_steps(self) -> int:
        """Total number of optimizer steps recorded (the sum of the segments' steps)."""
        return self._num_steps

    def __len__(self) -> int:
        """Number of history segments, as Opacus defines it (see :attr:`num_steps`)."""
        return len(self._segments)

    @property
    @synchronized
    def run(self) -> DPSGDRun:
        """The recorded history as a :class:`DPSGDRun` (built once per change)."""
        if self._run is None:
            self._run = DPSGDRun._trusted(
                tuple(self._segments), sampling=self._sampling, unit=self._unit
            )
        return self._run

    @property
    def unit(self) -> PrivacyUnit:
        """What one guarantee protects: one record, or one user under user-level sampling
        (detected from the loader ``make_private`` returned, :mod:`.engine_sampling`)."""
        return self._unit

    @synchronized
    def observe_unit(self, unit: PrivacyUnit) -> None:
        """Take the privacy unit detected from the training loader: one record, or
        ``PrivacyUnit.sampled_user()`` (users sampled, each user's records clipped together;
        the numbers are then those of a dataset of users). A loader of records leaves a unit
        the user stated (``LastIterateAccountant(unit=PrivacyUnit.user(k))``) as it is; a
        loader over users replaces one record, and next to another stated unit it is warned
        about (:class:`~opacus_lastiterate.exceptions.SamplingWarning`) and the stated unit
        is kept.

        Raises:
            TypeError: ``unit`` is not a :class:`PrivacyUnit`.
            ValueError: a unit of several records per contribution (a user or group of k
                records is a property of the analysis, not of the loader).
        """
        if not isinstance(unit, PrivacyUnit):
            raise TypeError(f"`unit` must be a PrivacyUnit, got {unit!r}.")
        if unit.max_records != 1:
            raise ValueError(
                f"`unit` must make one contribution per step (a record, or a user under "
                f"user-level sampling), got {unit.describe()}."
            )
        if unit == self._unit or unit.is_record:
            return
        if not self._unit.is_record:
            warn(
                f"The training loader draws users (user-level sampling), but this accountant's "
                f"unit was stated as {self._unit.code()!r}: the numbers stay those of "
                f"{self._unit.describe()}. Set accountant.unit = PrivacyUnit.sampled_user() "
                "for the numbers of a sampled user.",
                SamplingWarning,
            )
            return
        self._unit = unit
        self._run = None

    # -- sampling scheme ------------------------------------------------------------------------

    @property
    def sampling(self) -> SamplingScheme | None:
        """How the batches are drawn (``None``: Poisson at the recorded rates), as detected
        from the loader ``make_private`` returned or declared with :meth:`declare_sampling`."""
        return self._sampling

    @property
    def sampling_declared(self) -> bool:
        """Whether :attr:`sampling` was declared by the user (detection then leaves it)."""
        return self._sampling_declared

    @synchronized
    def declare_sampling(self, scheme: SamplingScheme | None) -> None:
        """Declare how the batches are drawn (for users who know better than detection, or
        who feed the accountant by hand); it is kept when ``make_private`` detects another.

        Args:
            scheme: a scheme of :mod:`opacus_lastiterate.analysis.sampling`, or ``None`` for
                Poisson at the recorded rates.

        Raises:
            TypeError: if ``scheme`` is not a scheme or None.
            ValueError: if it does not match the sample rates recorded so far (Opacus records
                1 / len(data_loader)); nothing changes then.
        """
        checked = check_sampling(scheme, "scheme")
        check_sampling_matches(checked, [s.sample_rate for s in self._segments], "scheme")
        self._set_sampling(checked)
        self._sampling_declared = True

    @synchronized
    def observe_sampling(self, scheme: SamplingScheme | None) -> None:
        """Take the scheme detected from the training loader (:mod:`.engine_sampling`),
        unless one was declared. A scheme that does not match the recorded rates is not taken
        (a :class:`SamplingWarning` says so): the numbers stay Poisson at the recorded rates."""
        if self._sampling_declared:
            return
        checked = check_sampling(scheme, "scheme")
        try:
            check_sampling_matches(checked, [s.sample_rate for s in self._segments], "scheme")
        except ValueError as exc:
            warn(
                f"{type(self).__name__}: the detected sampling does not match the steps "
                f"recorded so far ({exc}); the numbers assume Poisson sampling at the recorded "
                "rates.",
                SamplingWarning,
            )
            return
        self._set_sampling(checked)

    def _set_sampling(self, scheme: SamplingScheme | None) -> None:
        self._sampling = scheme
        self._sampling_checked_rate = None
        self._run = None

    def _check_step_sampling(self, q: float) -> None:
        """A step at rate ``q`` must fit :attr:`sampling`; if it does not (the loader was
        changed), the scheme is dropped with a warning, never the step."""
        if self._sampling is None or q == self._sampling_checked_rate:
            return
        try:
            check_sampling_matches(self._sampling, (q,), "sampling")
        except ValueError as exc:
            warn(
                f"{type(self).__name__}: a step was recorded at a sample rate that does not "
                f"fit the run's sampling ({exc}). From this step on the numbers assume Poisson "
                "sampling at the recorded rates (declare_sampling to say otherwise).",
                SamplingWarning,
            )
            self._set_sampling(None)
            self._sampling_declared = False
            return
        self._sampling_checked_rate = q

    @property
    def last_step(self) -> tuple[float, float]:
        """(noise_multiplier, sample_rate) of the last recorded step.

        Raises:
            ValueError: if no step was recorded.
        """
        if not self._segments:
            raise ValueError(f"{type(self).__name__} has recorded no step.")
        last = self._segments[-1]
        return last.noise_multiplier, last.sample_rate

    @synchronized
    def take_back(self, steps: int = 1) -> None:
        """Remove the last ``steps`` recorded steps (and what the accountant recorded with
        them), as if they had not been taken; the accountant is then as a fresh one that
        :meth:`load_state_dict` loaded with the shorter state.

        Raises:
            TypeError, ValueError: unless ``steps`` is an integer in [0, num_steps]; nothing
                changes then.
        """
        n = self._check_steps_back(steps)
        if n:
            self.load_state_dict(self._trimmed_state(dict(self.state_dict()), n))

    def _check_steps_back(self, steps: object) -> int:
        n = check_int("steps", steps)
        if n > self._num_steps:
            raise ValueError(
                f"`steps` must be an integer in [0, {self._num_steps}] (the steps recorded), "
                f"got {n}."
            )
        return n

    def _trimmed_state(self, state: dict[str, Any], steps: int) -> dict[str, Any]:
        """``state`` without its last ``steps`` steps (subclasses trim what they add)."""
        state["history"] = trim_history(state["history"], steps)
        return state

    @synchronized
    def with_history(self, history: History) -> RunAccountant:
        """A copy of this accountant (its configuration and the warnings it has given
        included) whose history is ``history``, as if it had recorded those steps; what an
        accountant records besides (sigma, q), such as optimizer settings, is not in a
        history and is dropped.

        Raises:
            TypeError, ValueError: on an invalid ``history`` (:func:`validate_history`).
        """
        segments = validate_history(history)
        twin = copy.deepcopy(self)
        twin._set_segments(segments)
        twin._externally_assigned = False
        return twin

    @classmethod
    def mechanism(cls) -> str:
        """The name under which this accountant is registered with Opacus."""
        return cls._MECHANISM

    # -- steps ----------------------------------------------------------------------------------

    @synchronized
    def step(self, *, noise_multiplier: float, sample_rate: float) -> None:
        """Record one step; extend the last segment if (sigma, q) are unchanged.

        Args:
            noise_multiplier: noise standard deviation over clipping norm, in [0, inf); 0 is
                recorded (epsilon becomes inf) with a :class:`ZeroNoiseWarning`.
            sample_rate: Poisson sampling rate, in (0, 1].

        Raises:
            TypeError, ValueError: on an invalid argument; nothing is then recorded.
        """
        self._record(check_step_noise(noise_multiplier), check_sample_rate(sample_rate))

    def _record(self, sigma: float, q: float) -> None:
        """Record a validated step."""
        if sigma == 0.0 and not self._zero_noise_warned:
            self._zero_noise_warned = True
            warn(
                f"{type(self).__name__}: a step with noise_multiplier=0 was recorded; "
                "the gradients of that step are released without noise, so the reported "
                "epsilon is inf.",
                ZeroNoiseWarning,
            )
        self._check_step_sampling(q)
        self._extend_segments(sigma, q, 1)
        self._after_step(sigma, q)

    def _extend_segments(self, sigma: float, q: float, steps: int) -> None:
        """Add ``steps`` validated steps at (sigma, q) to the history (no hooks)."""
        append_steps(self._segments, sigma, q, steps)
        self._num_steps += steps
        self._run = None

    @synchronized
    def record_step(
        self, noise_multiplier: float, sample_rate: float, *, optimizer: Any = None
    ) -> None:
        """Record a step as this accountant's optimizer hook does: read what it needs from
        ``optimizer`` (when given), then record (sigma, q). Used to feed a second accountant
        the steps that the one ``make_private`` attached records.

        Raises:
            TypeError, ValueError: on an invalid argument; nothing is then recorded.
        """
        sigma = check_step_noise(noise_multiplier)
        q = check_sample_rate(sample_rate)
        if optimizer is not None:
            self._observe(optimizer)
        self._record(sigma, q)

    def get_optimizer_hook_fn(self, sample_rate: float) -> Callable[[Any], None]:
        """The hook ``make_private`` attaches to the DPOptimizer: records
        (sigma, q * accumulated_iterations) as Opacus's accountants do, after
        :meth:`_observe` has read what the accountant needs from the optimizer. The step is
        validated before anything is recorded or observed."""
        q = check_sample_rate(sample_rate)

        def hook_fn(optim: Any) -> None:
            sigma = check_step_noise(
                accounting_noise_multiplier(optim), "optimizer.noise_multiplier"
            )
            rate = check_sample_rate(
                q * optim.accumulated_iterations, "sample_rate * accumulated_iterations"
            )
            with self._lock:
                self._observe(optim)
                self._record(sigma, rate)

        return hook_fn

    # -- subclass hooks ---------------------------------------------------------------------

    def _after_step(self, noise_multiplier: float, sample_rate: float) -> None:
        """Called after a validated step was recorded."""

    def _after_reset(self) -> None:
        """Called after the history was replaced (assignment or load_state_dict)."""

    def _observe(self, optim: Any) -> None:
        """Read what the accountant needs from the optimizer before a step is recorded."""

    def _extra_state(self) -> dict[str, Any]:
        """Accountant-specific entries of :meth:`state_dict`."""
        return {}

    def _check_extra_state(self, state_dict: Mapping[str, Any]) -> Any:
        """Validate the accountant-specific entries; return what _load_extra_state takes."""
        return None

    def _load_extra_state(self, checked: Any) -> None:
        """Apply what :meth:`_check_extra_state` validated (must not fail)."""

    # -- state ----------------------------------------------------------------------------------

    @synchronized
    def state_dict(self, destination: Any = None) -> Any:
        """Opacus-compatible state ``{"history": [...], "mechanism": name, ...}``."""
        if destination is None:
            destination = OrderedDict()
        destination["history"] = self.history
        destination["mechanism"] = self.mechanism()
        if self._sampling is not None:
            destination["sampling"] = self._sampling.as_dict()
            destination["sampling_declared"] = self._sampling_declared
        destination.update(self._extra_state())
        return destination

    def check_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Validate a state as :meth:`load_state_dict` does, without loading it.

        Raises:
            TypeError, ValueError: as :meth:`load_state_dict` would; nothing changes.
        """
        self._checked_state(state_dict)

    def _checked_state(
        self, state_dict: Mapping[str, Any]
    ) -> tuple[tuple[TrainingSegment, ...], SamplingScheme | None, Any]:
        if not isinstance(state_dict, Mapping):
            raise TypeError(
                f"`state_dict` must be a mapping with keys 'history' and 'mechanism', "
                f"got {type(state_dict).__name__}."
            )
        for key in ("history", "mechanism"):
            if key not in state_dict:
                raise ValueError(
                    f"`state_dict` must have the key {key!r}, "
                    f"got keys {sorted(map(str, state_dict))}."
                )
        mechanism = _mechanism_name(state_dict["mechanism"])
        if mechanism != self.mechanism():
            raise ValueError(
                f"`state_dict['mechanism']` must be {self.mechanism()!r}, got {mechanism!r}: "
                f"the state of another accountant cannot be loaded into {type(self).__name__}."
            )
        segments = validate_history(state_dict["history"], "state_dict['history']")
        sampling = _state_sampling(state_dict, segments)
        declared = state_dict.get("sampling_declared", False)
        if not isinstance(declared, bool):
            raise TypeError(f"`state_dict['sampling_declared']` must be a bool, got {declared!r}.")
        return segments, sampling, self._check_extra_state(state_dict)

    @synchronized
    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load a state from :meth:`state_dict`, after validating all of it.

        Raises:
            TypeError, ValueError: if the state is not a mapping, lacks ``"history"`` or
                ``"mechanism"``, is of another mechanism, or has an invalid entry; the
                accountant is then unchanged.
        """
        segments, sampling, extra = self._checked_state(state_dict)
        self._set_sampling(sampling)
        self._sampling_declared = bool(state_dict.get("sampling_declared", False)) and (
            sampling is not None
        )
        self._set_segments(segments)
        self._externally_assigned = False
        self._zero_noise_warned = False
        self._load_extra_state(extra)


def _state_sampling(
    state_dict: Mapping[str, Any], segments: tuple[TrainingSegment, ...]
) -> SamplingScheme | None:
    """The validated ``state_dict["sampling"]`` (absent: the accountant knew no scheme)."""
    data = state_dict.get("sampling")
    if data is None:
        return None
    try:
        scheme = sampling_from_dict(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"`state_dict['sampling']` is not a sampling scheme: {exc}") from exc
    check_sampling_matches(scheme, [s.sample_rate for s in segments], "state_dict['sampling']")
    return scheme
