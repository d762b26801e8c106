"""The short text form of a privacy unit (``"record"``, ``"user(k)"``, ``"group(k)"``: the
monitor's records, the CLI) reads back to the same unit; anything else is refused, named."""

from __future__ import annotations

import pytest

from opacus_lastiterate.analysis.privacy_unit import PrivacyUnit


@pytest.mark.parametrize(
    ("unit", "code"),
    [(PrivacyUnit.record(), "record"), (PrivacyUnit.user(16), "user(16)"),
     (PrivacyUnit.group(4), "group(4)"), (PrivacyUnit.user(1), "user(1)")],
)
def test_code_round_trips(unit: PrivacyUnit, code: str) -> None:
    assert unit.code() == code
    assert PrivacyUnit.parse(code) == unit
    assert PrivacyUnit.parse(f" {code} ") == unit


@pytest.mark.parametrize(
    ("text", "error"),
    [("user", ValueError), ("user(0)", ValueError), ("user(2.5)", ValueError),
     ("record(2)", ValueError), ("person(3)", ValueError), ("", ValueError), (3, TypeError),
     (None, TypeError)],
)
def test_bad_codes_are_named(text: object, error: type) -> None:
    with pytest.raises(error, match="`privacy_unit`"):
        PrivacyUnit.parse(text, "privacy_unit")
