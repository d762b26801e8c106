"""What one privacy guarantee protects: the privacy unit (``docs/privacy_units.md``).

A :class:`PrivacyUnit` is a small, immutable, validated part of the run description
(:class:`~.run.DPSGDRun`), in the style of the sampling schemes:

* ``PrivacyUnit.record()``: one training record (every number of the package before units
  existed; the default of a run);
* ``PrivacyUnit.user(max_records=k)``: all records of one user, who owns at most k of them,
  each record sampled as the run samples records;
* ``PrivacyUnit.group(k)``: any k records (group privacy of size k);
* ``PrivacyUnit.sampled_user()``: all records of one user under *user-level sampling*: the
  batches are drawn over users (Poisson or shuffled over users), and each sampled user's
  records form one contribution whose gradient (sum or mean over them) is clipped to C as a
  whole (:mod:`opacus_lastiterate.user_samplers`). The mechanism then sees one "record" per
  user, whatever the number of records a user owns: its numbers are the record-level ones
  with the dataset size, batch size and sample rate counted in users, so ``max_records`` is 1.

Neighbouring datasets differ in the unit: the records of one user, or k records, are added or
removed (or, for fixed-size batches, zeroed out) together. For every model of this package a
user with at most k records and a group of k records get the same number: the worst user owns
exactly k records, and a group of k is one such user; only the label differs.

:meth:`PrivacyUnit.as_dict` gives the JSON form and :meth:`PrivacyUnit.from_dict` reads it back;
:meth:`PrivacyUnit.code` gives the short text form (``"record"``, ``"user(16)"``,
``"group(4)"``: the monitor's records, the CLI) and :meth:`PrivacyUnit.parse` reads it back.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from opacus_lastiterate.analysis._validation import check_int

__all__ = [
    "PrivacyUnit",
]

UnitKind = Literal["record", "user", "group", "sampled_user"]
"""The :attr:`PrivacyUnit.kind` literal."""
UNIT_KINDS: tuple[str, ...] = ("record", "user", "group", "sampled_user")
"""Every unit kind, in the order of the module docstring."""

_CODE = re.compile(r"(record|sampled_user)|(?:(user|group)\(\s*(\d+)\s*\))")


@dataclass(frozen=True, slots=True)
class PrivacyUnit:
    """The privacy unit of a run (module docstring).

    Attributes:
        kind: ``"record"``, ``"user"``, ``"group"`` or ``"sampled_user"``.
        max_records: k, the most contributions one unit makes to the clipped sums of an
            iteration of the sampler (1 for a record; a user's cap on its records; a group's
            size; 1 for a user under user-level sampling, whose records are clipped together),
            an integer >= 1.
    """

    kind: UnitKind = "record"
    max_records: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str):
            raise TypeError(f"`kind` must be a string, got {self.kind!r}.")
        if self.kind not in UNIT_KINDS:
            raise ValueError(f"`kind` must be one of {', '.join(UNIT_KINDS)}, got {self.kind!r}.")
        k = check_int("max_records", self.max_records, minimum=1)
        if self.kind in ("record", "sampled_user") and k != 1:
            raise ValueError(
                f"`max_records` must be 1 for the unit {self.kind!r}, got {k}; "
                "use PrivacyUnit.user(max_records=k) or PrivacyUnit.group(k)."
            )
        object.__setattr__(self, "max_records", k)

    @classmethod
    def record(cls) -> PrivacyUnit:
        """One training record."""
        return cls("record", 1)

    @classmethod
    def user(cls, max_records: int) -> PrivacyUnit:
        """All records of one user, who owns at most ``max_records`` records."""
        return cls("user", max_records)

    @classmethod
    def group(cls, size: int) -> PrivacyUnit:
        """Any ``size`` records (group privacy)."""
        return cls("group", check_int("size", size, minimum=1))

    @classmethod
    def sampled_user(cls) -> PrivacyUnit:
        """One user under user-level sampling (users sampled, each user's records clipped
        together as one contribution)."""
        return cls("sampled_user", 1)

    @property
    def is_record(self) -> bool:
        """Whether the unit is one record."""
        return self.kind == "record"

    @property
    def single_record(self) -> bool:
        """Whether the unit holds one record at most (a record, a user with one record, a
        group of one): the record-level models then answer, with the record-level numbers."""
        return self.max_records == 1

    def describe(self) -> str:
        """One line: what a neighbouring dataset changes."""
        if self.kind == "record":
            return "one record"
        if self.kind == "user":
            return f"one user with at most {self.max_records} records"
        if self.kind == "sampled_user":
            return "one user (users sampled, each user's records clipped together)"
        return f"a group of {self.max_records} records"

    def label(self) -> str:
        """The short form used in model labels: ``"record-level"``, ``"user-level, k
        records"``, ``"group of k records"`` or ``"user-level sampling"``."""
        if self.kind == "record":
            return "record-level"
        if self.kind == "user":
            return f"user-level, {self.max_records} records"
        if self.kind == "sampled_user":
            return "user-level sampling"
        return f"group of {self.max_records} records"

    def code(self) -> str:
        """The short text form: ``"record"``, ``"user(k)"``, ``"group(k)"`` or
        ``"sampled_user"`` (:meth:`parse` reads it back)."""
        if self.kind in ("record", "sampled_user"):
            return self.kind
        return f"{self.kind}({self.max_records})"

    @classmethod
    def parse(cls, text: object, name: str = "unit") -> PrivacyUnit:
        """The unit of :meth:`code`'s output.

        Raises:
            TypeError: ``text`` is not a string; ValueError: it is not such a form (both
                naming ``name``).
        """
        if not isinstance(text, str):
            raise TypeError(f"`{name}` must be a string such as 'user(16)', got {text!r}.")
        found = _CODE.fullmatch(text.strip())
        if found is None:
            raise ValueError(
                f"`{name}` must be 'record', 'user(k)', 'group(k)' with k an integer >= 1, or "
                f"'sampled_user', got {text!r}."
            )
        if found.group(1):
            return cls.record() if found.group(1) == "record" else cls.sampled_user()
        try:
            return cls(found.group(2), int(found.group(3)))  # type: ignore[arg-type]
        except ValueError as err:
            raise ValueError(f"`{name}` {text!r}: {err}") from err

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe form (:meth:`from_dict` reads it back)."""
        return {"kind": self.kind, "max_records": self.max_records}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyUnit:
        """The unit of :meth:`as_dict`'s output (``max_records`` defaults to 1)."""
        if not isinstance(data, Mapping):
            raise TypeError(f"`data` must be a mapping, got {data!r}.")
        unknown = sorted(set(data) - {"kind", "max_records"})
        if unknown:
            raise ValueError(f"`data` has unknown key(s) {', '.join(map(repr, unknown))}.")
        if "kind" not in data:
            raise ValueError("`data['kind']` is missing.")
        return cls(data["kind"], data.get("max_records", 1))
