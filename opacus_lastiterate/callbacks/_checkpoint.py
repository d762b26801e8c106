"""The checkpoint of a privacy monitor: its state as plain Python values, and back.

:func:`monitor_state` builds the dictionary that
:meth:`~opacus_lastiterate.callbacks.monitor.PrivacyMonitor.state_dict` returns (format 2,
JSON-serialisable: the accountants' histories as lists of lists, the optimizer trace's
columns as base64 text); :func:`restore` validates
such a state whole, then loads the accountants' parts into the accountants and returns
the rest as a :class:`RestoredState` for the monitor to take over; :func:`rewind` takes the
sinks back to the restored step. Lightning and Hugging Face checkpoints do not save Opacus's
accountant, so the monitor's state carries it.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from opacus_lastiterate.accountants.any_accountant import check_accountant_state
from opacus_lastiterate.accountants.incremental_rdp import IncrementalRDP
from opacus_lastiterate.accountants.optimizer_trace import trace_as_text
from opacus_lastiterate.callbacks.records import FIELDS, EpsilonRecord

__all__ = ["FORMAT", "RDP_RTOL", "RestoredState", "monitor_state", "restore", "rewind"]

FORMAT = 2
"""The format :func:`monitor_state` writes and :func:`restore` reads."""

_KEYS = frozenset({
    "format", "accountant", "corrected_accountant", "rdp", "should_stop", "stop_reason",
    "records_emitted", "physical_steps", "last_record",
})
"""The keys of a :func:`monitor_state`."""

_TUPLE_KEYS = ("history",)
"""An accountant state's keys whose entries are tuples (lists in the plain state)."""


def _plain(state: Mapping[str, Any]) -> dict[str, Any]:
    """An accountant's state with its lists of tuples as lists of lists and its optimizer
    traces' columns of bytes as base64 text (JSON; the accountant reads both back)."""
    out: dict[str, Any] = {}
    for k, v in state.items():
        if isinstance(v, list):
            v = [list(e) for e in v]
        elif k in ("optimizer_trace", "adaptive_trace") and isinstance(v, Mapping):
            v = trace_as_text(v)
        out[k] = v
    return out


def _tuples(state: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`_plain` for the keys whose entries are tuples."""
    return {
        k: (
            [tuple(e) if isinstance(e, (list, tuple)) else e for e in v]
            if k in _TUPLE_KEYS and isinstance(v, (list, tuple))
            else v
        )
        for k, v in state.items()
    }


def monitor_state(
    *,
    accountant: Any,
    corrected: Any,
    rdp: Iterable[float] | None,
    should_stop: bool,
    stop_reason: str | None,
    records_emitted: int,
    physical_steps: int,
    last_record: EpsilonRecord | None,
) -> dict[str, Any]:
    """The monitor's state, of plain Python values.

    Args:
        accountant: the monitor's accountant.
        corrected: the corrected accountant the monitor feeds itself, or None.
        rdp: the evaluator's RDP vector, when it is the composition of the accountant's
            whole history (else None: it is composed again from the history at the load).
        should_stop, stop_reason, records_emitted, physical_steps, last_record: the
            monitor's attributes of these names.
    """
    return {
        "format": FORMAT,
        "accountant": _plain(accountant.state_dict()),
        "corrected_accountant": None if corrected is None else _plain(corrected.state_dict()),
        "rdp": None if rdp is None else [float(v) for v in rdp],
        "should_stop": should_stop,
        "stop_reason": stop_reason,
        "records_emitted": records_emitted,
        "physical_steps": physical_steps,
        "last_record": None if last_record is None else last_record.as_dict(),
    }


@dataclass(frozen=True)
class RestoredState:
    """What :func:`restore` read for the monitor itself (the accountants are loaded)."""

    rdp: Sequence[float] | None
    """The evaluator's RDP vector (None in a state saved while steps were taken without the
    monitor), checked against the history."""
    should_stop: bool
    stop_reason: str | None
    records_emitted: int
    physical_steps: int
    last_record: EpsilonRecord | None


RDP_RTOL = 1e-9
"""How far a saved RDP vector may lie from the composition of the saved history (relative,
per order): the vector is composed step by step, the check composes each segment at once."""


def _count(state: Mapping[str, Any], key: str) -> int:
    value = state.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`state[{key!r}]` must be an integer >= 0, got {value!r}.")
    if value < 0:
        raise ValueError(f"`state[{key!r}]` must be an integer >= 0, got {value!r}.")
    return int(value)


def _accountant_part(state: Mapping[str, Any], key: str, accountant: Any) -> dict[str, Any]:
    """``state[key]`` as ``accountant`` loads it, validated (nothing is loaded here)."""
    part = state.get(key)
    if not isinstance(part, Mapping):
        raise ValueError(
            f"`state[{key!r}]` must be the accountant's state_dict (a mapping), got "
            f"{type(part).__name__}."
        )
    loaded = _tuples(part)
    try:
        check_accountant_state(accountant, loaded)
    except (TypeError, ValueError) as err:
        raise type(err)(f"`state[{key!r}]`: {err}") from err
    return loaded


def _checked_rdp(rdp: object, history: Sequence[Sequence[Any]]) -> list[float] | None:
    """``state['rdp']``: None, or the RDP vector of ``history`` (composed again and compared
    at :data:`RDP_RTOL`), so that a vector of other steps cannot under-report."""
    if rdp is None:
        return None
    if not isinstance(rdp, (list, tuple)) or not all(
        isinstance(v, numbers.Real) and not isinstance(v, bool) for v in rdp
    ):
        raise ValueError("`state['rdp']` must be a list of numbers.")
    composed = IncrementalRDP()
    if len(rdp) != composed.orders.size:
        raise ValueError(
            f"`state['rdp']` must have {composed.orders.size} entries (one per RDP order), "
            f"got {len(rdp)}."
        )
    composed.reset((float(s), float(q), int(n)) for s, q, n in history)
    saved = np.asarray(rdp, dtype=float)
    if not np.allclose(saved, composed.rdp, rtol=RDP_RTOL, atol=0.0):
        raise ValueError(
            "`state['rdp']` is not the RDP vector of the saved accountant's history (it "
            f"differs by up to {float(np.nanmax(np.abs(saved - composed.rdp))):.3g} at some "
            "order): the epsilons would be reported for other steps."
        )
    return [float(v) for v in rdp]


def restore(state: Mapping[str, Any], accountant: Any, corrected: Any) -> RestoredState:
    """Validate a :func:`monitor_state` whole, then load its accountants' histories into
    ``accountant`` and ``corrected`` (the corrected accountant the monitor feeds itself, or
    None: its part is then ignored) and return the rest.

    The derived fields are checked against the history: ``rdp`` must be its RDP vector,
    ``last_record`` must be of a step it has.

    Raises:
        TypeError, ValueError: if ``state`` is not such a state, naming the field; nothing
            is loaded then.
    """
    if not isinstance(state, Mapping) or state.get("format") != FORMAT:
        raise ValueError(f"`state` must be a PrivacyMonitor.state_dict() (format {FORMAT}).")
    missing = sorted(_KEYS - set(state))
    if missing:
        named = ", ".join(f"state[{key!r}]" for key in missing)
        raise ValueError(f"`state` lacks {named} of a PrivacyMonitor.state_dict().")
    part = _accountant_part(state, "accountant", accountant)
    corrected_part = None
    if corrected is not None and state.get("corrected_accountant") is not None:
        corrected_part = _accountant_part(state, "corrected_accountant", corrected)
    history = part["history"]
    steps = sum(int(h[2]) for h in history)
    last = state.get("last_record")
    if last is not None:
        if not isinstance(last, Mapping):
            raise ValueError(f"`state['last_record']` must have the keys {FIELDS}.")
        try:
            last_record: EpsilonRecord | None = EpsilonRecord.from_dict(last)
        except (TypeError, ValueError) as err:
            raise ValueError(f"`state['last_record']` must have the keys {FIELDS}.") from err
        if last_record is not None and last_record.step > steps:
            raise ValueError(
                f"`state['last_record']` is of step {last_record.step}, after the "
                f"{steps} step(s) of the saved accountant's history."
            )
    else:
        last_record = None
    rdp = _checked_rdp(state.get("rdp"), history)
    should_stop = state.get("should_stop", False)
    if not isinstance(should_stop, bool):
        raise TypeError(f"`state['should_stop']` must be a bool, got {should_stop!r}.")
    stop_reason = state.get("stop_reason")
    if stop_reason is not None and not isinstance(stop_reason, str):
        raise TypeError(f"`state['stop_reason']` must be a str or None, got {stop_reason!r}.")
    records_emitted = _count(state, "records_emitted")
    physical_steps = _count(state, "physical_steps")
    # everything is valid: load (the accountants validated their parts above)
    accountant.load_state_dict(part)
    if corrected_part is not None:
        corrected.load_state_dict(corrected_part)
    return RestoredState(
        rdp=rdp,
        should_stop=should_stop,
        stop_reason=stop_reason,
        records_emitted=records_emitted,
        physical_steps=physical_steps,
        last_record=last_record,
    )


def rewind(sinks: Iterable[object], step: int) -> None:
    """Call ``rewind(step)`` on the sinks that have it (the JSONL and CSV sinks drop their
    records after ``step``), so that a resumed run neither repeats nor skips a step in them."""
    for sink in sinks:
        rewind_sink = getattr(sink, "rewind", None)
        if callable(rewind_sink):
            rewind_sink(step)
