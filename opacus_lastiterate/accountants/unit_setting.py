"""The privacy unit of an accountant: how the user states it, and how it is kept and checked.

What one number protects (one record, a user with at most k records, a group of k records;
:class:`~opacus_lastiterate.analysis.privacy_unit.PrivacyUnit`, ``docs/privacy_units.md``) is
a fact about the data that Opacus never sees. The user states it on the
:class:`~opacus_lastiterate.accountants.LastIterateAccountant`
(``LastIterateAccountant(unit=...)`` or ``accountant.unit = ...``); this module holds what
that needs besides the accountant:

* :class:`UnitOwner`: the accountant's :attr:`~UnitOwner.unit` property (a mixin, with the
  accountant's lock);
* :func:`check_unit`: the one validation (None means one record);
* :func:`unit_of_new_accountants`: within the block, a new accountant starts with the unit
  (what ``make_private_with_epsilon`` needs: Opacus's calibration creates a fresh accountant by
  name, which must compute the number of the run's unit);
* :data:`STATE_KEY` and :func:`state_unit`: the accountant's ``state_dict`` stores a unit other
  than one record under one key, and a state is loaded only into an accountant of its unit
  (a state without the key is one record's).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opacus_lastiterate.accountants.base import synchronized
from opacus_lastiterate.analysis.privacy_unit import PrivacyUnit

__all__ = [
    "unit_of_new_accountants",
]

STATE_KEY = "privacy_unit"
"""The ``state_dict`` key of a unit other than one record (its
:meth:`~opacus_lastiterate.analysis.privacy_unit.PrivacyUnit.as_dict`)."""

RECORD = PrivacyUnit.record()

_NEW_ACCOUNTANT_UNIT: contextvars.ContextVar[PrivacyUnit | None] = contextvars.ContextVar(
    "opacus_lastiterate_new_accountant_unit", default=None
)


def check_unit(unit: object, name: str = "unit", *, new: bool = False) -> PrivacyUnit:
    """``unit`` as a :class:`PrivacyUnit` (None: one record, or for a ``new`` accountant the
    unit of the enclosing :func:`unit_of_new_accountants`).

    Raises:
        TypeError: naming ``name``, for anything else.
    """
    if unit is None:
        return (new and _NEW_ACCOUNTANT_UNIT.get()) or RECORD
    if not isinstance(unit, PrivacyUnit):
        raise TypeError(
            f"`{name}` must be a PrivacyUnit (PrivacyUnit.user(max_records=k), "
            f"PrivacyUnit.group(k), PrivacyUnit.record()) or None, got {unit!r}."
        )
    return unit


@contextmanager
def unit_of_new_accountants(unit: PrivacyUnit | None) -> Iterator[None]:
    """Within this block, a new accountant that takes a unit starts with ``unit`` (None: the
    accountant's own default, one record)."""
    token = _NEW_ACCOUNTANT_UNIT.set(None if unit is None else check_unit(unit))
    try:
        yield
    finally:
        _NEW_ACCOUNTANT_UNIT.reset(token)


def unit_state(unit: PrivacyUnit) -> dict[str, Any]:
    """The ``state_dict`` entries of ``unit``: none for one record."""
    return {} if unit.is_record else {STATE_KEY: unit.as_dict()}


def state_unit(state_dict: Mapping[str, Any], expected: PrivacyUnit) -> PrivacyUnit:
    """The unit stored in ``state_dict`` (absent: one record), which must be ``expected``,
    the unit of the accountant that loads it.

    Raises:
        TypeError, ValueError: naming ``state_dict['privacy_unit']``, for an entry that is not
            a unit or a unit other than ``expected``.
    """
    stored = state_dict.get(STATE_KEY)
    name = f"state_dict[{STATE_KEY!r}]"
    if stored is None:
        unit = RECORD
    elif not isinstance(stored, Mapping):
        raise TypeError(
            f"`{name}` must be a mapping (PrivacyUnit.as_dict()) or absent, got "
            f"{type(stored).__name__}."
        )
    else:
        try:
            unit = PrivacyUnit.from_dict(stored)
        except (TypeError, ValueError) as err:
            raise type(err)(f"`{name}` is not a privacy unit: {err}") from err
    if unit != expected:
        raise ValueError(
            f"`{name}` is {unit.code()!r} ({unit.describe()}), but this accountant's unit is "
            f"{expected.code()!r} ({expected.describe()}): a state is loaded only into an "
            "accountant of its unit (LastIterateAccountant(unit=...), or set accountant.unit "
            "before loading); nothing was loaded."
        )
    return unit


class UnitOwner:
    """The :attr:`unit` of an accountant (a mixin of an accountant with ``_lock``: the unit is
    set between two recorded steps, never during one)."""

    _unit: PrivacyUnit = RECORD
    _run: Any = None

    @property
    def unit(self) -> PrivacyUnit:
        """What every number of the accountant protects (``docs/privacy_units.md``): one
        record, a user with at most k records, or a group of k. Set it (a
        :class:`~opacus_lastiterate.analysis.privacy_unit.PrivacyUnit`, None for one record)
        at any time: the recorded steps stay, the numbers are those of the new unit. For a
        unit of more than one record the heuristic and the standard epsilon are computed from
        scratch (no kept engine), and the robust heuristic has no model (``ValueError``).

        Raises:
            TypeError: (when set) naming ``unit``, for anything but a unit or None; the unit
                is then unchanged.
        """
        return self._unit

    @unit.setter
    @synchronized
    def unit(self, unit: PrivacyUnit | None) -> None:
        self._unit = check_unit(unit)
        self._run = None  # the cached run description carries the unit
