"""The checkpoint of a privacy monitor: its state as plain Python values, and back.

:func:`monitor_state` builds the dictionary that
:meth:`~opacus_lastiterate.callbacks.monitor.PrivacyMonitor.state_dict` returns (format 2,
JSON-serialisable: the accountants' histories as lists of lists); :func:`restore` validates
such a state, loads the accountants' parts into the accountants and returns
the rest as a :class:`RestoredState` for the monitor to take over; :func:`rewind` takes the
sinks back to the restored step. Lightning and Hugging Face checkpoints do not save Opacus's
accountant, so the monitor's state carries it.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opacus_lastiterate.callbacks.records import FIELDS, EpsilonRecord

__all__ = ["FORMAT", "RestoredState", "monitor_state", "restore", "rewind"]

FORMAT = 2
"""The format :func:`monitor_state` writes and :func:`restore` reads."""

_KEYS = frozenset({
    "format", "accountant", "corrected_accountant", "rdp", "should_stop", "stop_reason",
    "records_emitted", "physical_steps", "last_record",
})
"""The keys of a :func:`monitor_state`."""

_TUPLE_KEYS = ("history", "optimizer_trace")
"""An accountant state's keys whose entries are tuples (lists in the plain state)."""


def _plain(state: Mapping[str, Any]) -> dict[str, Any]:
    """An accountant's state with its lists of tuples as lists of lists."""
    return {k: ([list(e) for e in v] if isinstance(v, list) else v) for k, v in state.items()}


def _tuples(state: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`_plain` for the keys whose entries are tuples."""
    return {k: ([tuple(e) for e in v] if k in _TUPLE_KEYS else v) for k, v in state.items()}


def monitor_state(
    *,
    accountant: Any,
    corrected: Any,
    rdp: Iterable[float],
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
        rdp: the evaluator's RDP vector.
        should_stop, stop_reason, records_emitted, physical_steps, last_record: the
            monitor's attributes of these names.
    """
    return {
        "format": FORMAT,
        "accountant": _plain(accountant.state_dict()),
        "corrected_accountant": None if corrected is None else _plain(corrected.state_dict()),
        "rdp": [float(v) for v in rdp],
        "should_stop": should_stop,
        "stop_reason": stop_reason,
        "records_emitted": records_emitted,
        "physical_steps": physical_steps,
        "last_record": None if last_record is None else last_record.as_dict(),
    }


@dataclass(frozen=True)
class RestoredState:
    """What :func:`restore` read for the monitor itself (the accountants are loaded)."""

    rdp: Sequence[float]
    """The evaluator's RDP vector."""
    should_stop: bool
    stop_reason: str | None
    records_emitted: int
    physical_steps: int
    last_record: EpsilonRecord | None


def restore(state: Mapping[str, Any], accountant: Any, corrected: Any) -> RestoredState:
    """Validate a :func:`monitor_state`, load its accountants' histories into
    ``accountant`` and ``corrected`` (the corrected accountant the monitor feeds itself, or
    None: its part is then ignored) and return the rest.

    Raises:
        ValueError: if ``state`` is not such a state; nothing is loaded then (an accountant
            may still reject its part).
    """
    if not isinstance(state, Mapping) or state.get("format") != FORMAT:
        raise ValueError(f"`state` must be a PrivacyMonitor.state_dict() (format {FORMAT}).")
    missing = sorted(_KEYS - set(state))
    if missing:
        raise ValueError(f"`state` lacks the keys {missing} of a PrivacyMonitor.state_dict().")
    last = state.get("last_record")
    if last is not None:
        if not isinstance(last, Mapping):
            raise ValueError(f"`state['last_record']` must have the keys {FIELDS}.")
        try:
            last_record: EpsilonRecord | None = EpsilonRecord.from_dict(last)
        except (TypeError, ValueError) as err:
            raise ValueError(f"`state['last_record']` must have the keys {FIELDS}.") from err
    else:
        last_record = None
    rdp = state["rdp"]
    if not isinstance(rdp, (list, tuple)) or not all(isinstance(v, numbers.Real) for v in rdp):
        raise ValueError("`state['rdp']` must be a list of numbers.")
    accountant.load_state_dict(_tuples(state["accountant"]))
    if corrected is not None and state.get("corrected_accountant") is not None:
        corrected.load_state_dict(_tuples(state["corrected_accountant"]))
    return RestoredState(
        rdp=rdp,
        should_stop=bool(state["should_stop"]),
        stop_reason=state["stop_reason"],
        records_emitted=int(state["records_emitted"]),
        physical_steps=int(state["physical_steps"]),
        last_record=last_record,
    )


def rewind(sinks: Iterable[object], step: int) -> None:
    """Call ``rewind(step)`` on the sinks that have it (the JSONL and CSV sinks drop their
    records after ``step``), so that a resumed run neither repeats nor skips a step in them."""
    for sink in sinks:
        rewind_sink = getattr(sink, "rewind", None)
        if callable(rewind_sink):
            rewind_sink(step)
