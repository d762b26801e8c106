"""dp_accounting's ``common.self_convolve`` for a one-step PMF composed again and again
with a growing number of steps (a run whose standard epsilon is asked at every step), with
what does not depend on the number of steps kept per PMF: the log moment generating
functions of its Chernoff window (40 log-sum-exps over the whole array) and its FFT at
each transform length used. The same operations in the same order as dp_accounting's, so
the result is the same float; a step then costs one power and one inverse FFT.
The transforms are kept by the identity of the PMF array (a few at a time): the caller
keeps its one-step PMFs (which are never modified in place) so that a growing run passes
the same arrays again.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy import fft, special

__all__ = []

_KEPT = 16  # PMFs whose transforms are kept


class _Transforms:
    """What ``self_convolve`` computes from a PMF alone: its log-MGFs at the default orders
    and its FFTs by length (at most a few lengths kept)."""

    def __init__(self, probs: NDArray[np.float64]) -> None:
        self.probs = probs  # held, so that its id stays its own
        n = len(probs)
        self.orders = np.concatenate((np.arange(-20, 0), np.arange(1, 21))) / n
        self.log_mgfs = [
            special.logsumexp(np.arange(n) * order, b=probs) for order in self.orders
        ]
        self.ffts: dict[int, Any] = {}

    def bounds(self, times: int, tail: float) -> tuple[int, int]:
        """dp_accounting's ``compute_self_convolve_bounds`` (default orders, tail > 0)."""
        upper, lower = (len(self.probs) - 1) * times, 0
        for order, log_mgf in zip(self.orders, self.log_mgfs):
            bound = (times * log_mgf + math.log(2 / tail)) / order
            if not math.isfinite(bound):
                continue
            if order > 0:
                upper = min(upper, math.ceil(bound))
            if order < 0:
                lower = max(lower, math.floor(bound))
        return lower, upper

    def fft(self, length: int) -> Any:
        out = self.ffts.get(length)
        if out is None:
            out = fft.fft(self.probs, length)
            self.ffts = {**dict(list(self.ffts.items())[-2:]), length: out}
        return out


_TRANSFORMS: dict[int, _Transforms] = {}
_LOCK = threading.Lock()


def clear_transforms() -> None:
    """Forget the kept transforms (their memory, or a cold start for a timing)."""
    with _LOCK:
        _TRANSFORMS.clear()


def _transforms(probs: NDArray[np.float64]) -> _Transforms:
    with _LOCK:
        kept = _TRANSFORMS.get(id(probs))
        if kept is not None and kept.probs is probs:
            return kept
    made = _Transforms(probs)
    with _LOCK:
        _TRANSFORMS[id(probs)] = made
        while len(_TRANSFORMS) > _KEPT:
            del _TRANSFORMS[next(iter(_TRANSFORMS))]
    return made


def self_convolve(
    probs: NDArray[np.float64], times: int, tail: float
) -> tuple[int, NDArray[np.float64]]:
    """``dp_accounting.pld.common.self_convolve(probs, times, tail)``: (offset of the first
    point kept, the ``times``-fold convolution of ``probs`` on its Chernoff window of tail
    mass ``tail``), the same float. ``probs`` must not be modified afterwards (its
    transforms are kept by identity)."""
    if tail == 0:  # no window: nothing worth keeping
        from dp_accounting.pld import common

        low, out = common.self_convolve(probs, times, tail)
        return low, np.asarray(out, dtype=float)
    kept = _transforms(probs)
    lower, upper = kept.bounds(times, tail)
    output_len = upper - lower + 1
    fast_len = fft.next_fast_len(max(output_len, len(probs)))
    convolved = np.real(fft.ifft(kept.fft(fast_len) ** times))
    return lower, np.roll(convolved, -lower)[:output_len]
