"""Shared test settings: the CLI's on-disk answer cache is off (``cli/_cache.py``), so every
test computes what it checks; ``tests/test_cli_cache.py`` turns it on in a temporary folder."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_cli_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPACUS_LASTITERATE_CACHE_DIR", "off")
