"""The standard (all iterates released) number of a balls-in-bins run: random allocation.

**The mechanism.** Balls-in-bins puts each record in one of the b = ``steps_per_epoch`` steps
of each epoch, uniformly and independently of the other records and of other epochs. For one
record and one epoch this is *random allocation* of the record to 1 of b steps (Feldman and
Shenfeld, "Privacy amplification by random allocation", arXiv 2502.08202). With Gaussian
noise sigma (in units of the clipping norm) the epoch's releases are dominated by the pair of
Chua et al. ("Balls-and-Bins Sampling for DP-SGD", arXiv 2412.16802):
P = (1/b) sum_j N(e_j, sigma^2 I_b) against Q = N(0, sigma^2 I_b), for *add/remove*
neighbours (the other records keep their steps, so adding or removing a record changes one
step's clipped sum by at most C). Epochs compose adaptively (the product of the epochs'
pairs dominates the run; Zhu, Dong and Wang, "Optimal Accounting of Differential Privacy via
Characteristic Function", arXiv 2106.08567).

**The computation** is delegated to the package ``pld-accounting``
(import name ``PLD_accounting``; Feldman and Shenfeld, "Efficient privacy loss accounting for
subsampling and random allocation", arXiv 2602.17284). For one epoch of b steps it builds the
privacy loss distribution of the pair above with ``BoundType.DOMINATES``, which the package
states is a pessimistic (upper) bound: losses are rounded up onto its grid and truncated tail
mass is moved to an infinite loss. We use its geometric convolution (``ConvolutionMethod.GEOM``;
its FFT route is faster but, measured here, far from tight for hundreds of steps per epoch).
Epochs are composed with dp_accounting (``self_compose`` / ``compose`` of the pessimistic PLDs,
which stay pessimistic).

**The grid.** Every ``loss_discretization`` gives an upper bound; the grid only sets how far
above the exact value it lies and what it costs. The excess shrinks about linearly with the
grid, while the time grows about quadratically (the geometric convolution costs the square of
the number of grid points). A fixed grid is either loose where epsilon is small or slow where
a coarse one is already tight, so by default :class:`BallsInBinsBound` chooses the grid from
the run (:meth:`BallsInBinsBound.loss_discretization_for`): at ``grid_delta``
(:data:`GRID_DELTA`, 1e-5) it computes epsilon at the grids 0.05 and 0.025, takes the excess
to be linear in the grid (slope from the two; the exact value estimated at a zero grid), and
takes the coarsest grid of :data:`GRID_LADDER` whose predicted excess is at most
:data:`TARGET_RELATIVE_EXCESS` (0.8 %), but none finer than the last rung (0.005). Every query
then reports the smallest value of these (at most three) grids, each an upper bound, so that
epsilon(delta) and delta(epsilon) describe one curve. Measured (``docs/samplers.md``), this is
0.4 to 0.8 % above the exact value at four settings where the grid 0.05 is 1.4 to 7 % above,
and costs only the two coarse probes where they already meet the target. Runs with many epochs
and a small epsilon can need a grid finer than the last rung (their excess grows with the
number of epochs): pass ``loss_discretization`` to fix the grid. ``numba`` (part of the extra)
makes the fine grids several times faster. The epsilon reported is the smaller of this value
and :class:`~.sampling_standard.NoAmplificationBound`'s (both are upper bounds).

**What the run adds, and what we rely on.**

* *A partial epoch* (the run starts or stops inside an epoch) counts as a whole epoch: the
  releases of the steps that ran are a post-processing (a prefix) of the releases of the whole
  epoch, so the whole epoch's pair dominates them. The bound is therefore constant inside an
  epoch and exact (up to discretisation) at epoch ends, the same convention as
  :class:`~.sampling_standard.NoAmplificationBound`.
* *Noise that changes inside an epoch*: the epoch is accounted at its smallest sigma (a step
  with more noise is a post-processing of the same step with less: add independent Gaussian
  noise). Epochs with different sigma are composed. If their PLDs do not share a grid,
  every epoch is accounted at the run's smallest sigma (still an upper bound).

**Without pld-accounting** (it is the optional extra ``opacus-lastiterate[allocation]``)
:class:`BallsInBinsBound` reports :class:`~.sampling_standard.NoAmplificationBound`'s value,
and its label says so.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import warnings
from collections import Counter
from typing import Any

import numpy as np

from opacus_lastiterate.analysis._validation import check_delta
from opacus_lastiterate.analysis.privacy_model import PrivacyModel
from opacus_lastiterate.analysis.run import RunLike, as_run
from opacus_lastiterate.analysis.sampling import BallsInBins, UnknownSampling
from opacus_lastiterate.analysis.sampling_heuristic import epoch_layout, epoch_scheme_of
from opacus_lastiterate.analysis.sampling_standard import NoAmplificationBound

__all__ = [
    "BallsInBinsBound",
    "random_allocation_pld",
]

DEFAULT_LOSS_DISCRETIZATION = 0.05
"""The grid of :func:`random_allocation_pld` and :func:`balls_in_bins_pld` when none is given
(pld-accounting's own default is 0.01): fast, 1 to 7 % above the exact value at the settings of
``docs/samplers.md``. :class:`BallsInBinsBound` chooses a finer grid where needed."""

GRID_LADDER = (0.05, 0.025, 0.015, 0.01, 0.0075, 0.005)
"""The grids :class:`BallsInBinsBound` chooses among (a short list, so that the per-epoch PLDs
are cached and shared across queries); the first two are its probes."""

GRID_DELTA = 1e-5
"""The delta at which :class:`BallsInBinsBound` sizes its grid by default."""

TARGET_RELATIVE_EXCESS = 0.008
"""The predicted excess over the exact epsilon that :class:`BallsInBinsBound`'s grid aims at
(0.8 %, leaving room for the error of the linear prediction under 1 %)."""

DEFAULT_TAIL_TRUNCATION = 1e-12
"""pld-accounting's ``tail_truncation``: mass moved to an infinite loss (adds at most this to
delta, per epoch)."""

_EXTRA = "pip install 'opacus-lastiterate[allocation]'"


def allocation_available() -> bool:
    """Whether ``pld-accounting`` (import name ``PLD_accounting``) is installed."""
    return importlib.util.find_spec("PLD_accounting") is not None


def _check_positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"`{name}` must be a positive number, got {value!r}.")
    v = float(value)
    if not (v > 0 and math.isfinite(v)):
        raise ValueError(f"`{name}` must be a positive finite number, got {value!r}.")
    return v


@functools.lru_cache(maxsize=64)
def _epoch_pld(
    sigma: float, steps_per_epoch: int, loss_discretization: float, tail_truncation: float
) -> Any:
    with warnings.catch_warnings():
        # pld-accounting warns (ImportWarning) when numba is absent: it then uses numpy.
        warnings.simplefilter("ignore", ImportWarning)
        import PLD_accounting as pa

    params = pa.PrivacyParams(
        sigma=sigma, num_steps=steps_per_epoch, num_selected=1, num_epochs=1
    )
    config = pa.AllocationSchemeConfig(
        loss_discretization=loss_discretization,
        tail_truncation=tail_truncation,
        convolution_method=pa.ConvolutionMethod.GEOM,
    )
    return pa.gaussian_allocation_pld(
        params=params, config=config, bound_type=pa.BoundType.DOMINATES
    )


def random_allocation_pld(
    noise_multiplier: float,
    steps_per_epoch: int,
    epochs: int = 1,
    *,
    loss_discretization: float = DEFAULT_LOSS_DISCRETIZATION,
    tail_truncation: float = DEFAULT_TAIL_TRUNCATION,
) -> Any:
    """The pessimistic dp_accounting PLD of ``epochs`` epochs of random allocation (each record
    in 1 of ``steps_per_epoch`` steps per epoch) with Gaussian noise ``noise_multiplier``, for
    add/remove neighbours (module docstring). One epoch is cached per arguments.

    Raises:
        ImportError: pld-accounting is not installed.
        TypeError, ValueError: an argument out of range (named).
    """
    sigma = _check_positive("noise_multiplier", noise_multiplier)
    for name, value in (("steps_per_epoch", steps_per_epoch), ("epochs", epochs)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"`{name}` must be an integer >= 1, got {value!r}.")
        if value < 1:
            raise ValueError(f"`{name}` must be an integer >= 1, got {value!r}.")
    disc = _check_positive("loss_discretization", loss_discretization)
    tail = _check_positive("tail_truncation", tail_truncation)
    if not allocation_available():
        raise ImportError(f"random_allocation_pld needs pld-accounting: {_EXTRA}.")
    one = _epoch_pld(sigma, int(steps_per_epoch), disc, tail)
    return one if epochs == 1 else one.self_compose(int(epochs))


def _composed(plds: list[Any]) -> Any:
    """The composition of ``plds``, or ``None`` when dp_accounting cannot compose them (their
    grids differ)."""
    out = plds[0]
    for p in plds[1:]:
        try:
            out = out.compose(p)
        except ValueError:
            return None
    return out


def balls_in_bins_pld(
    run: RunLike,
    *,
    loss_discretization: float = DEFAULT_LOSS_DISCRETIZATION,
    tail_truncation: float = DEFAULT_TAIL_TRUNCATION,
) -> Any:
    """The pessimistic dp_accounting PLD of a balls-in-bins run (module docstring: each epoch
    the run touches counts whole, at its smallest sigma). ``None`` for a run without steps.

    Raises:
        ValueError: the run's scheme is not balls-in-bins, or a step has no noise.
        ImportError: pld-accounting is not installed.
    """
    r = as_run(run)
    scheme = epoch_scheme_of(r)
    if not isinstance(scheme, BallsInBins):
        raise ValueError(f"`run.sampling` must be BallsInBins, got {r.sampling!r}.")
    if r.num_steps == 0:
        return None
    if r.has_zero_noise:
        raise ValueError("`run` has a step without noise: no finite bound.")
    layout = epoch_layout(r)
    smallest = [float(layout.sigmas[layout.epoch == e].min()) for e in np.unique(layout.epoch)]
    counts = Counter(smallest)
    b = scheme.steps_per_epoch

    def build(groups: dict[float, int]) -> list[Any]:
        return [
            random_allocation_pld(
                s, b, n, loss_discretization=loss_discretization, tail_truncation=tail_truncation
            )
            for s, n in sorted(groups.items())
        ]

    out = _composed(build(dict(counts)))
    if out is None:
        out = build({min(counts): len(smallest)})[0]
    return out


class BallsInBinsBound(PrivacyModel):
    """Upper bound for all iterates of a balls-in-bins run: random allocation, composed over
    epochs (module docstring; add/remove neighbours). Registry: ``"standard"`` on a
    balls-in-bins run. Without pld-accounting: the no-amplification bound, so labelled.

    Attributes:
        amplified: whether the random-allocation PLD was used (pld-accounting installed).
        loss_discretization: the fixed grid, or ``None`` (the default): chosen from the run.
        grid_delta: the delta at which the grid is chosen.
    """

    kind = "upper_bound"

    def __init__(
        self,
        run: RunLike,
        *,
        value_discretization_interval: float | None = None,
        orders: object = None,
        loss_discretization: float | None = None,
        tail_truncation: float = DEFAULT_TAIL_TRUNCATION,
        grid_delta: float = GRID_DELTA,
    ) -> None:
        """``value_discretization_interval`` and ``orders`` are accepted so that the registry's
        ``"standard"`` takes its usual parameters; the grid is pld-accounting's
        ``loss_discretization`` instead: a number fixes it, ``None`` chooses it from the run at
        ``grid_delta`` (module docstring; at a larger delta, where epsilon is smaller, the
        relative excess is larger)."""
        the_run = as_run(run)
        scheme = epoch_scheme_of(the_run)
        if not isinstance(scheme, BallsInBins):
            raise ValueError(f"`run.sampling` must be BallsInBins, got {the_run.sampling!r}.")
        grid = (
            None
            if loss_discretization is None
            else _check_positive("loss_discretization", loss_discretization)
        )
        tail = _check_positive("tail_truncation", tail_truncation)
        at_delta = check_delta(grid_delta, "grid_delta")
        self.run, self.scheme = the_run, scheme
        self.loss_discretization, self.tail_truncation, self.grid_delta = grid, tail, at_delta
        self.amplified = allocation_available()
        self._fallback = NoAmplificationBound(self.run)
        self._plds: dict[float, Any] = {}
        self._grids: list[float] | None = None

    @property
    def label(self) -> str:  # type: ignore[override]
        """What the number is, for which scheme and neighbours."""
        prefix = "assumes " if isinstance(self.run.sampling, UnknownSampling) else ""
        head = f"standard composition (all iterates released) for {prefix}{self.scheme.describe()}: "
        if self.amplified:
            return head + (
                "upper bound by random allocation, composed over epochs (add/remove neighbours; "
                "pld-accounting PLD, Feldman and Shenfeld arXiv 2602.17284)"
            )
        return head + (
            "upper bound without amplification (add/remove neighbours; one Gaussian mechanism "
            f"per epoch): pld-accounting is not installed ({_EXTRA})"
        )

    def _pld_at(self, grid: float) -> Any:
        if grid not in self._plds:
            self._plds[grid] = balls_in_bins_pld(
                self.run, loss_discretization=grid, tail_truncation=self.tail_truncation
            )
        return self._plds[grid]

    def _epsilon_at(self, grid: float, delta: float) -> float:
        return float(self._pld_at(grid).get_epsilon_for_delta(delta))

    def loss_discretization_for(self, delta: float) -> float:
        """The grid that meets the target at ``delta``: the fixed one, else the coarsest of
        :data:`GRID_LADDER` whose excess, predicted linearly from the grids 0.05 and 0.025, is
        at most :data:`TARGET_RELATIVE_EXCESS` of the predicted exact epsilon (the last rung
        where none is). Computes the two probes (pld-accounting must be installed).

        Raises:
            TypeError, ValueError: ``delta`` is not a number in (0, 1).
            ImportError: pld-accounting is not installed.
        """
        delta = check_delta(delta)
        if self.loss_discretization is not None:
            return self.loss_discretization
        coarse, probe = GRID_LADDER[0], GRID_LADDER[1]
        at_coarse, at_probe = self._epsilon_at(coarse, delta), self._epsilon_at(probe, delta)
        slope = (at_coarse - at_probe) / (coarse - probe)
        if not (slope > 0 and math.isfinite(at_probe)):
            return probe
        exact = max(at_probe - slope * probe, 0.0)
        fits = [g for g in GRID_LADDER[1:] if g <= TARGET_RELATIVE_EXCESS * exact / slope]
        return fits[0] if fits else GRID_LADDER[-1]

    def _grid_set(self) -> list[float]:
        """The grids whose values are combined (the smallest is reported): the fixed grid, else
        the two probes and the grid chosen at ``grid_delta``; one set for every query, so that
        epsilon(delta) and delta(epsilon) describe one curve."""
        if self.loss_discretization is not None:
            return [self.loss_discretization]
        if self._grids is None:
            chosen = self.loss_discretization_for(self.grid_delta)
            self._grids = sorted({*GRID_LADDER[:2], chosen}, reverse=True)
        return self._grids

    def _epsilon(self, delta: float) -> float:
        bound = self._fallback.epsilon(delta)
        if not self.amplified:
            return bound
        return min(bound, *(self._epsilon_at(g, delta) for g in self._grid_set()))

    def _delta(self, epsilon: float) -> float:
        bound = self._fallback.delta(epsilon)
        if not self.amplified:
            return bound
        return min(
            bound,
            *(float(self._pld_at(g).get_delta_for_epsilon(epsilon)) for g in self._grid_set()),
        )
