"""Shared test settings.

* The CLI's on-disk answer cache is off (``cli/_cache.py``), so every test computes what it
  checks; ``tests/test_cli_cache.py`` turns it on in a temporary folder.
* ``MOVED_TO_SLOW``: the slowest tests of ``make test`` run in ``make test-slow`` instead
  (issue 26: ``make test`` within 5 minutes on 2 quiet cores). Each is a heavier variant of
  a check that stays in the default suite (named beside it), or a whole-page snippet run; no
  check is dropped. The seconds are ``--durations`` of one default run on a 2-core machine
  shared with other jobs (about 5x a quiet machine's), 4,200 s of worker time in all.
  A pattern that matches no collected test is an error (a renamed test would silently move
  back), checked only in files collected whole: selecting one test by its node id
  (``pytest tests/x.py::test_y``) runs it.
"""

from __future__ import annotations

import fnmatch

import pytest

MOVED_TO_SLOW: dict[str, str] = {
    # 274 s: trains the page's models; the page's other kinds of blocks stay in make test
    "tests/docs/test_snippets.py::test_python_blocks_run[[]docs/input_audits.md[]]":
        "274 s",
    # FEASGM through the PLD and PRV routes: up to 54 s each; the same properties stay
    # checked in make test for feasgm-rdp, asgm and last_iterate
    "tests/accountants/test_accountant_properties.py::*[[]feasgm-pld[]]": "up to 54 s each",
    "tests/accountants/test_accountant_properties.py::*[[]feasgm-prv[]]": "up to 51 s each",
    # the one-step PLD against dp_accounting at interval 1e-4 and sigma 0.5 (the widest
    # PLDs, 25-50 s each); every (q, sigma) stays checked at interval 1e-3, sigma >= 1 at 1e-4
    "tests/analysis/baselines/test_subsampled_gaussian_pld.py::"
    "test_one_step_pld_is_dp_accountings[[]0.0001-*-0.5[]]": "25-50 s each",
    "tests/accountants/test_normalisation_accountants.py::test_feasgm_curve_composes_segments_exactly":
        "50 s",
    "tests/callbacks/test_sinks.py::test_a_killed_writer_leaves_whole_lines": "60 s",
    # the registration in any import order: "package-first" stays in make test
    "tests/test_import_light.py::test_privacy_engine_finds_our_accountants_in_any_import_order"
    "[[]lazy-name-first[]]": "27 s",
    "tests/test_import_light.py::test_privacy_engine_finds_our_accountants_in_any_import_order"
    "[[]opacus-first[]]": "26 s",
}


def _files_selected_by_node_id(config: pytest.Config) -> set[str]:
    """The test files (rootdir-relative, as in node ids) that the command line names with a
    node id (``tests/x.py::test_y``): only part of each is collected."""
    files = set()
    for arg in config.args:
        path, sep, _ = arg.partition("::")
        if sep:
            resolved = (config.invocation_params.dir / path).resolve()
            try:
                files.add(resolved.relative_to(config.rootpath).as_posix())
            except ValueError:  # outside the rootdir: no pattern names it
                continue
    return files


@pytest.hookimpl(tryfirst=True)  # before -m 'not slow' deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    partial = _files_selected_by_node_id(config)
    whole_files = {item.nodeid.split("::")[0] for item in items} - partial
    unmatched = []
    for pattern in MOVED_TO_SLOW:
        matched = [item for item in items if fnmatch.fnmatchcase(item.nodeid, pattern)]
        for item in matched:
            item.add_marker(pytest.mark.slow)
        if not matched and pattern.split("::")[0] in whole_files:
            unmatched.append(pattern)
    if unmatched:  # a renamed test would silently move back: say so
        raise pytest.UsageError("tests/conftest.py MOVED_TO_SLOW names no collected test: "
                                + ", ".join(unmatched))


@pytest.fixture(autouse=True)
def _no_cli_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPACUS_LASTITERATE_CACHE_DIR", "off")
