"""The private ``warn`` helper attributes warnings to the first frame outside the libraries."""

from __future__ import annotations

import os
import sys

import pytest

import opacus_lastiterate
from opacus_lastiterate import _warn
from opacus_lastiterate.analysis.audit import one_run_epsilon_bound
from opacus_lastiterate.exceptions import OneRunDeltaWarning, OpacusLastIterateWarning


def test_direct_call_points_at_the_caller() -> None:
    with pytest.warns(OpacusLastIterateWarning, match="here") as record:
        line = sys._getframe().f_lineno + 1
        _warn.warn("here", OpacusLastIterateWarning)
    assert record[0].filename == __file__
    assert record[0].lineno == line


def test_warning_from_nested_package_code_points_at_the_user_line() -> None:
    # one_run_epsilon_bound -> warn_one_run -> warn: two package frames to skip
    with pytest.warns(OneRunDeltaWarning) as record:
        line = sys._getframe().f_lineno + 1
        one_run_epsilon_bound(100, 10, 10, delta=0.01)
    assert [(w.filename, w.lineno) for w in record] == [(__file__, line)]


def test_prefixes_cover_imported_packages_only() -> None:
    prefixes = _warn.skipped_prefixes()
    package_dir = os.path.dirname(os.path.abspath(opacus_lastiterate.__file__))
    assert os.path.join(package_dir, "") in prefixes
    assert all(p.endswith(os.sep) for p in prefixes)  # "opacus/" must not match "opacus_x/"
    unimported = [n for n in _warn.SKIPPED_PACKAGES if n not in sys.modules]
    _warn.skipped_prefixes()
    assert all(n not in sys.modules for n in unimported)


def test_stacklevel_falls_back_to_the_outermost_frame() -> None:
    frame = sys._getframe()
    depth = 0
    f = frame
    while f is not None:
        depth += 0 if _warn._is_internal(f) else 1
        f = f.f_back
    # every frame "inside": the outermost frame; no frame inside: the caller
    assert _warn._external_stacklevel(frame, ("/", os.sep, "")) == depth
    assert _warn._external_stacklevel(frame, ()) == 2
