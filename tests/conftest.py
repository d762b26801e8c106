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
* The light install (``make test-light``, ``scripts/test_light.sh``): with
  ``OPACUS_LASTITERATE_LIGHT=1`` the files of :data:`NEEDS_TORCH` are not collected, and a
  test skipped for any reason other than torch or Opacus missing is an error, so that the
  tests meant to run without torch (the JAX example's included) cannot pass by skipping.
"""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path

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


LIGHT = os.environ.get("OPACUS_LASTITERATE_LIGHT") == "1"
"""Set by ``scripts/test_light.sh``: the tests run in an environment without torch/Opacus."""

# Test files of the light selection (LIGHT_SELECTION) that import torch, Opacus or a part of
# the package that needs them at the top (for Opacus's own numbers as the reference); the
# light run leaves them out. tests/test_light_install.py checks the list against the imports.
NEEDS_TORCH: frozenset[str] = frozenset({
    "tests/analysis/baselines/test_subsampled_gaussian_rdp.py",
    "tests/analysis/normalisation/test_opacus_arithmetic.py",
    "tests/analysis/test_poisson_models.py",
    "tests/analysis/test_route_conformance.py",
})
# What scripts/test_light.sh runs (rootdir-relative): the mathematics and audit statistics,
# the light install's own checks and the JAX example.
LIGHT_SELECTION: tuple[str, ...] = (
    "tests/analysis",
    "tests/test_light_install.py",
    "tests/examples/test_jax_privacy_example.py",
)
# a skip that the light run accepts: the test needs torch or Opacus (importorskip's reason,
# or "opacus is not installed")
_TORCH_SKIP = re.compile(r"could not import '(torch|opacus)(\.[\w.]+)?'|(torch|opacus) is not installed")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if LIGHT:
        try:
            relative = collection_path.resolve().relative_to(config.rootpath).as_posix()
        except ValueError:
            return None
        if relative in NEEDS_TORCH:
            return True
    return None


_light_skips: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if LIGHT and report.skipped and not hasattr(report, "wasxfail"):
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
        if not _TORCH_SKIP.search(reason):
            _light_skips.append(f"{report.nodeid}: {reason}")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    pytest_runtest_logreport(report)  # type: ignore[arg-type]  (a module skipped whole)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if LIGHT and _light_skips:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if LIGHT and _light_skips:
        terminalreporter.section("OPACUS_LASTITERATE_LIGHT=1", red=True)
        terminalreporter.line("skipped for a reason other than torch/Opacus missing (an error "
                              "in the light run):\n  " + "\n  ".join(_light_skips))


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
