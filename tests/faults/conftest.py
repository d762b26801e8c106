"""The monitor set-up of ``tests/callbacks`` (random data, a two-layer MLP), for the faults."""

from __future__ import annotations

import warnings
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        yield
