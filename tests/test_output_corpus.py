"""The output corpus: every recorded output is recomputed and must be bit-identical.

``tests/output_corpus/NAME.json`` holds one entry of ``scripts/record_output_corpus.py`` (the
command or parameters, and the output recorded before a refactor). Each test recomputes one
entry and compares the two JSON values exactly: same keys, same list lengths, same JSON types,
floats with equal ``repr`` (bit-identical). Fast entries run in the default suite, the others
are marked ``slow``.

A deliberate renaming is declared here, never by re-recording; the values must still agree:

* ``RENAMED_KEYS``: ``{"old_key": "new_key"}`` renames a dict key everywhere in the recorded
  outputs; ``{"ENTRY::old_key": "new_key"}`` (``ENTRY`` a name or glob, e.g. ``monitor_*``)
  only in the matching entries. Example: ``{"monitor_*::robust_epsilon":
  "robust_heuristic_epsilon"}``.
* ``RENAMED_COMMANDS``: ``{"old": "new"}`` replaces CLI tokens in the recorded command lines
  before they are run: a command (``"compare-versions": "versions"``), an option
  (``"--calibrate": "--accountant"``), a value, or several consecutive tokens separated by
  spaces (``"--calibrate robust": "--calibrate robust_heuristic"``).
* ``RENAMED_VALUES``: ``{"ENTRY::=old": "new"}`` replaces a recorded string equal to
  ``old``; ``{"ENTRY::old": "new"}`` every occurrence of ``old`` inside recorded strings.
* ``ADDED_KEYS``: keys that may appear only in the new outputs, e.g. ``{"monitor_*::
  standard_rdp_epsilon"}``; nothing recorded may disappear or change.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

RENAMED_KEYS: dict[str, str] = {
    # the monitor's record fields are named <model>_epsilon after the privacy-model registry
    "monitor_*::robust_epsilon": "robust_heuristic_epsilon",
    "monitor_*::standard_epsilon_rdp": "opacus_rdp_epsilon",
    # Opacus's RDP accountant, named apart from the registry's "standard_rdp" (dp_accounting)
    "monitor_*::standard_rdp_epsilon": "opacus_rdp_epsilon",
    "monitor_*::standard_epsilon_pld": "standard_epsilon",
}
"""Old record key -> new key, applied to the recorded outputs before comparing."""

RENAMED_COMMANDS: dict[str, str] = {}
"""Old CLI token(s) -> new, applied to the recorded command lines before running them."""

RENAMED_VALUES: dict[str, str] = {
    # one name per privacy model: the robust heuristic is "robust_heuristic" everywhere
    "epsilon_calibrate_*::=robust": "robust_heuristic",
    "plan_steps_robust::=robust": "robust_heuristic",
    "plan_steps_robust::under the robust accountant": "under the robust_heuristic accountant",
}
"""Old string value -> new, applied to the recorded outputs before comparing."""

ADDED_KEYS: set[str] = {
    # the monitor's records carry the physical step count beside the logical step (issue 25)
    "monitor_*::physical_steps",
    # ... and the sampling scheme with the Poisson-assumed value beside (issue 22)
    "monitor_*::sampling",
    "monitor_*::poisson_assumed_epsilon",
}
"""Keys (``"key"`` or ``"ENTRY::key"``) that the new outputs may have in addition; every
recorded key is still compared."""

_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "record_output_corpus.py"


def _load_script() -> Any:
    name = "record_output_corpus"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


corpus = _load_script()


def _param(entry: Any) -> Any:
    return pytest.param(entry, id=entry.name, marks=[pytest.mark.slow] if entry.slow else [])


@pytest.mark.parametrize("entry", [_param(e) for e in corpus.ENTRIES.values()])
def test_output_is_identical(entry: Any) -> None:
    path = corpus.path_of(entry.name)
    assert path.exists(), f"{path} is not recorded: run scripts/record_output_corpus.py --write"
    diffs = corpus.check_entry(
        entry, RENAMED_KEYS, RENAMED_COMMANDS, added_keys=ADDED_KEYS, renamed_values=RENAMED_VALUES
    )
    assert not diffs, "\n" + corpus.format_diffs(entry.name, diffs)


def test_every_recorded_file_is_an_entry() -> None:
    """A corpus file without an entry would silently stop being checked."""
    names = {p.stem for p in corpus.CORPUS_DIR.glob("*.json")}
    assert names == set(corpus.ENTRIES), names ^ set(corpus.ENTRIES)


def test_corpus_is_small() -> None:
    size = sum(p.stat().st_size for p in corpus.CORPUS_DIR.rglob("*") if p.is_file())
    assert size < 2_000_000, size


# -- the checker itself ------------------------------------------------------------------------


def _floats(value: Any, path: tuple = ()) -> list[tuple[tuple, float]]:
    if isinstance(value, float):
        return [(path, value)]
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in _floats(v, (*path, k))]
    if isinstance(value, list):
        return [x for i, v in enumerate(value) for x in _floats(v, (*path, i))]
    return []


def _set(data: Any, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        data = data[key]
    data[path[-1]] = value


def test_one_ulp_is_reported() -> None:
    """Perturb one recorded float by one ulp: the comparison names its path and both values."""
    stored = corpus.load("epsilon_at_delta")
    path, value = next((p, v) for p, v in _floats(stored["output"]) if v > 0 and math.isfinite(v))
    changed = copy.deepcopy(stored["output"])
    _set(changed, path, math.nextafter(value, math.inf))
    diffs = corpus.compare(stored["output"], changed, "output")
    assert len(diffs) == 1
    assert repr(value) in diffs[0] and repr(math.nextafter(value, math.inf)) in diffs[0]
    assert "1 ulp" in diffs[0] and ".".join(str(k) for k in path) in diffs[0]


def test_perturbed_record_fails_check_entry() -> None:
    """End to end: a recorded file with one float off by one ulp fails check_entry."""
    entry = corpus.ENTRIES["counterexample_docs"]
    stored = corpus.load(entry.name)
    (path, value), *_ = [(p, v) for p, v in _floats(stored["output"]) if v != 0]
    _set(stored["output"], path, math.nextafter(value, -math.inf))
    diffs = corpus.check_entry(entry, stored=stored)
    assert len(diffs) == 1 and "1 ulp" in diffs[0], diffs


def test_comparison_is_strict() -> None:
    c = corpus.compare
    assert c({"a": 1.0}, {"a": 1.0}) == []
    assert c(float("nan"), float("nan")) == []
    assert c(0.0, -0.0) != []  # bit-identical, not ==
    assert c(1, 1.0) != [] and c(True, 1) != []  # JSON types differ
    assert c({"a": 1}, {"b": 1}) and c([1, 2], [1, 2, 3])
    (diff,) = c({"x": [1.0, {"y": 2.0}]}, {"x": [1.0, {"y": 2.5}]})
    assert diff.startswith("x[1].y: old 2.0, new 2.5")


def test_renamings_are_applied_and_values_still_compared() -> None:
    old = {"records": [{"robust_epsilon": 1.5, "step": 1}]}
    new = {"records": [{"robust_heuristic_epsilon": 1.5, "step": 1}]}
    assert corpus.compare(old, new)  # undeclared: reported
    renamed = corpus.rename_keys(old, {"monitor_*::robust_epsilon": "robust_heuristic_epsilon"},
                                 "monitor_sgd")
    assert corpus.compare(renamed, new) == []
    assert corpus.rename_keys(old, {"other::robust_epsilon": "x"}, "monitor_sgd") == old
    changed = {"records": [{"robust_heuristic_epsilon": 1.25, "step": 1}]}
    assert corpus.compare(renamed, changed)  # a renamed key must keep its value
    extra = {"records": [{"robust_epsilon": 1.5, "step": 1, "new_field": 2.0}]}
    assert corpus.compare(old, extra)  # an undeclared addition is reported
    assert corpus.compare(old, extra, added=corpus.scoped({"monitor_*::new_field"},
                                                           "monitor_sgd")) == []
    assert corpus.scoped({"monitor_*::new_field"}, "epsilon_at_delta") == frozenset()
    argv = ["epsilon", "--calibrate", "robust", "--json"]
    assert corpus.rename_argv(argv, {"--calibrate robust": "--calibrate robust_heuristic"}) == [
        "epsilon", "--calibrate", "robust_heuristic", "--json"]
    assert corpus.rename_argv(["compare-versions", "--json"], {"compare-versions": "versions"}) \
        == ["versions", "--json"]


def test_recorded_files_round_trip_exactly() -> None:
    """Every file is what the recorder writes for its own data (floats written by repr)."""
    for p in corpus.CORPUS_DIR.glob("*.json"):
        text = p.read_text()
        assert corpus.dumps(json.loads(text)) == text, p.name
