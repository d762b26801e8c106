"""The one query shape of every privacy model (``docs/run_description.md``, "Privacy models").

A model is built from a :class:`~opacus_lastiterate.analysis.run.DPSGDRun` and answers
``epsilon(delta)`` and ``delta(epsilon)``; :class:`PrivacyModel` validates the argument once,
answers the cases every model shares (an empty run: 0; a step without noise: epsilon = inf,
delta = 1, ``docs/run_description.md``, "Zero noise") and hands the rest to the subclass's
``_epsilon``/``_delta``, which trust their arguments.
"""

from __future__ import annotations

import math
from typing import ClassVar

from opacus_lastiterate.analysis._validation import check_delta, check_epsilon
from opacus_lastiterate.analysis.run import DPSGDRun, RunLike, as_run
from opacus_lastiterate.analysis.sampling import PoissonSampling, effective_sampling

__all__ = [
    "PrivacyModel",
]


def poisson_run(run: RunLike, *, model: str, name: str) -> DPSGDRun:
    """``run`` validated for a model of Poisson-sampled batches (class ``model``, registry
    name ``name``).

    Raises:
        ValueError: the run's batches are not Poisson-sampled (shuffled, deterministic,
            balls-in-bins, or an unknown sampler assuming one of them): that model's number
            would describe another run; the message names the registry call that gives the
            number for the run's scheme.
    """
    checked = as_run(run)
    scheme = effective_sampling(checked.sampling)
    if scheme is None or isinstance(scheme, PoissonSampling):
        return checked
    raise ValueError(
        f"`run` draws its batches as {scheme.describe()}, but {model} is the model of "
        f"Poisson-sampled batches and its number would not describe this run; "
        f"privacy_model({name!r}, run) gives the number for the run's scheme."
    )


class PrivacyModel:
    """Base of the privacy models: ``epsilon(delta)`` and ``delta(epsilon)`` of ``run``.

    Attributes:
        kind: what the number is: "exact", "heuristic", "upper_bound" or "model".
        label: one line saying what the number describes.
    """

    kind: ClassVar[str] = ""
    units: ClassVar[bool] = False
    """Whether the model computes the number of a run whose unit is a user or a group of
    more than one record (the others are record-level: they refuse such a run, whose number
    they would not give)."""
    run: DPSGDRun

    @property
    def label(self) -> str:
        """One line saying what the number describes (subclasses override it)."""
        return ""

    def _check_unit(self) -> None:
        unit = self.run.unit
        if not self.units and unit.max_records > 1:  # one record at most: its number
            raise ValueError(
                f"`run` protects {unit.describe()}, but {type(self).__name__} gives the number "
                "of one record; privacy_model(name, run) gives the number for the run's unit."
            )

    def epsilon(self, delta: float) -> float:
        """Smallest epsilon >= 0 with delta(epsilon) <= ``delta``, for ``delta`` in (0, 1)."""
        self._check_unit()
        d = check_delta(delta)
        if self.run.num_steps == 0:
            return 0.0
        if self.run.has_zero_noise:
            return math.inf
        return self._epsilon(d)

    def delta(self, epsilon: float) -> float:
        """delta(epsilon) for ``epsilon`` >= 0."""
        self._check_unit()
        e = check_epsilon(epsilon)
        if self.run.num_steps == 0:
            return 0.0
        if self.run.has_zero_noise:
            return 1.0
        return self._delta(e)

    def _epsilon(self, delta: float) -> float:
        raise NotImplementedError

    def _delta(self, epsilon: float) -> float:
        raise NotImplementedError
