"""The output corpus: every recorded output is recomputed and compared at stated tolerances.

``tests/output_corpus/NAME.json`` holds one entry of ``scripts/record_output_corpus.py`` (the
command or parameters, and the output recorded before a refactor). Each test recomputes one
entry and compares the two JSON values: same keys, same list lengths, same JSON types, equal
strings, ints and booleans, and floats within the first rule of ``TOLERANCES`` that applies:
``|new - old| <= max(rel * max(|old|, |new|), abs)``; NaN and infinities must match exactly.
Fast entries run in the default suite, the others are marked ``slow``.

Why not bit for bit: numpy, scipy and torch pick SIMD kernels for the CPU at run time (AVX-512,
AVX2 or SSE), and those round differently in the last bits. Recomputed on an AVX-512 CPU with
numpy limited to its baseline kernels (``NPY_DISABLE_CPU_FEATURES="X86_V3 X86_V4 AVX512_ICL
AVX512_SPR"``), 41 of the 57 entries differ bit for bit (510 floats); limited to AVX2
(``NPY_DISABLE_CPU_FEATURES="X86_V4 AVX512_ICL AVX512_SPR" OPENBLAS_CORETYPE=Haswell
ATEN_CPU_CAPABILITY=avx2``), 43 (655 floats). All are within the tolerances below, the
largest at 0.29 of its tolerance. The drift, by kind:

* **PLD composition** (``standard``, ``standard_epsilon``: dp_accounting's privacy loss
  distributions, composed by FFT): the FFT's rounding is relative to the largest probability
  mass (about 1), not to the tail that delta sums, so a delta moves by an absolute amount
  (measured at most 3.7e-14; a delta of 3.4e-12 moved by 0.9%), and an epsilon at a target
  delta by that amount over the slope of delta(epsilon), which shrinks with delta: 2.9e-7
  relative at delta = 1e-8 (the smallest delta in the corpus), at most 3.7e-8 for the other
  standard epsilons. Tolerance: relative 1e-6 (3.5x the largest), absolute 1e-12. An entry
  with a delta below 1e-8 needs a wider one.
* **float32 training** (``canary_audit``'s canary scores and the thresholds chosen among
  them): torch computes in float32 (unit roundoff 6e-8) and 100 SGD steps compound its
  rounding: measured at most 8e-6 relative on scores above 1e-2 and 1.8e-7 absolute below.
  Tolerance: relative 1e-4, absolute 1e-6. The audits' epsilons, from counts, stay under
  the default.
* **everything else** (default): float64 elementwise kernels differ by a few ulp (closed
  forms: at most 4e-14 relative); a root of a smooth function (epsilon at delta, a
  calibrated noise multiplier) moves by the function's drift over its slope, and a bisection
  on a predicate by one step of its stopping tolerance (cebere fig4's exact epsilons,
  bisected to 1e-9: one moved by one step, 9.3e-10 or 1.4e-9 relative); values computed from
  a PLD indirectly (the normalisation accountants, noise multipliers calibrated on the
  standard epsilon, Opacus versions' corrected epsilons) moved at most 1.2e-9. Tolerance:
  relative 1e-8, about 7x the largest, and absolute 1e-14 for values that are differences of
  quantities of order 1.

``OUTPUT_CORPUS_EXACT=1`` (``make test-corpus-exact``) compares every float bit for bit
instead: a developer's check on the machine that recorded the corpus, not part of
``make test``. ``python scripts/record_output_corpus.py --check`` is the same check outside
pytest.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest

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

_PLD = "dp_accounting's PLD, composed by FFT: an absolute error on delta, amplified in epsilon"
_FLOAT32 = "torch's float32 training, rounding compounded over the SGD steps"
TOLERANCES: list[Any] = [
    corpus.Tolerance("*", "standard", rel=1e-6, abs=1e-12, why=_PLD),
    corpus.Tolerance("*", "standard_epsilon", rel=1e-6, abs=1e-12, why=_PLD),
    corpus.Tolerance("canary_audit", "*_scores", rel=1e-4, abs=1e-6, why=_FLOAT32),
    corpus.Tolerance("canary_audit", "threshold", rel=1e-4, abs=1e-6, why=_FLOAT32),
    corpus.Tolerance("*", "*", rel=1e-8, abs=1e-14,
                     why="float64 kernels a few ulp apart, roots and bisections to 1e-9"),
]
"""The rules of the module docstring; a float takes the first that applies (its entry and a
dict key on its path match)."""

EXACT = os.environ.get("OUTPUT_CORPUS_EXACT", "") not in ("", "0")
"""``OUTPUT_CORPUS_EXACT=1``: every float bit for bit (the developer's check)."""


def _param(entry: Any) -> Any:
    return pytest.param(entry, id=entry.name, marks=[pytest.mark.slow] if entry.slow else [])


@pytest.mark.parametrize("entry", [_param(e) for e in corpus.ENTRIES.values()])
def test_output_matches_the_record(entry: Any) -> None:
    path = corpus.path_of(entry.name)
    assert path.exists(), f"{path} is not recorded: run scripts/record_output_corpus.py --write"
    diffs = corpus.check_entry(entry, tolerances=None if EXACT else TOLERANCES)
    assert not diffs, "\n" + corpus.format_diffs(entry.name, diffs)


def test_every_recorded_file_is_an_entry() -> None:
    """A corpus file without an entry would silently stop being checked."""
    names = {p.stem for p in corpus.CORPUS_DIR.glob("*.json")}
    assert names == set(corpus.ENTRIES), names ^ set(corpus.ENTRIES)


def test_every_tolerance_applies_to_a_recorded_value() -> None:
    """A rule whose entry or key matches nothing recorded is a typo, not a tolerance."""
    for rule in TOLERANCES:
        assert any(
            rule.applies(name, keys)
            for name in corpus.ENTRIES
            for keys in _key_paths(corpus.load(name)["output"])
        ), rule


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


def _key_paths(value: Any) -> list[tuple[str, ...]]:
    """The dict keys on the path of each float of ``value``."""
    return [tuple(k for k in path if isinstance(k, str)) for path, _ in _floats(value)]


def _set(data: Any, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        data = data[key]
    data[path[-1]] = value


def _rule(entry: str, path: tuple) -> Any:
    return corpus.tolerance_of(TOLERANCES, entry)(tuple(k for k in path if isinstance(k, str)))


def test_one_ulp_is_reported_in_exact_mode() -> None:
    """Perturb one recorded float by one ulp: the exact comparison names its path and both
    values."""
    stored = corpus.load("epsilon_at_delta")
    path, value = next((p, v) for p, v in _floats(stored["output"]) if v > 0 and math.isfinite(v))
    changed = copy.deepcopy(stored["output"])
    _set(changed, path, math.nextafter(value, math.inf))
    diffs = corpus.compare(stored["output"], changed, "output")
    assert len(diffs) == 1
    assert repr(value) in diffs[0] and repr(math.nextafter(value, math.inf)) in diffs[0]
    assert "1 ulp" in diffs[0] and ".".join(str(k) for k in path) in diffs[0]


@pytest.mark.parametrize("name", ["privacy_models_history", "canary_audit"])
def test_a_perturbation_beyond_its_tolerance_is_reported(name: str) -> None:
    """For one recorded float under each rule that applies in the entry: moved by twice its
    tolerance it is reported (with the tolerance), by half of it not."""
    stored = corpus.load(name)["output"]
    tolerance = corpus.tolerance_of(TOLERANCES, name)
    chosen: dict[Any, tuple] = {}
    for path, value in _floats(stored):
        rule = _rule(name, path)
        if value != 0 and math.isfinite(value) and rule not in chosen:
            chosen[rule] = (path, value)
    assert len(chosen) == {"privacy_models_history": 2, "canary_audit": 4}[name], chosen
    for rule, (path, value) in chosen.items():
        step = max(rule.rel * abs(value), rule.abs)
        for factor, reported in [(2.0, True), (0.5, False)]:
            changed = copy.deepcopy(stored)
            _set(changed, path, value + factor * step)
            diffs = corpus.compare(stored, changed, "output", tolerance)
            assert bool(diffs) == reported, (rule, path, factor, diffs)
            if reported:
                assert len(diffs) == 1 and f"tolerance relative {rule.rel:g}" in diffs[0]


def test_check_entry_fails_beyond_the_tolerance_and_on_one_ulp_in_exact_mode() -> None:
    """End to end (against this machine's own output, so that the test holds on any CPU):
    one float moved by twice its tolerance fails check_entry; by one ulp it passes at the
    tolerances and fails the exact comparison."""
    entry = corpus.ENTRIES["counterexample_docs"]
    stored = corpus.load(entry.name)
    stored["output"] = corpus.compute(entry, stored["params"])
    assert corpus.check_entry(entry, stored=stored) == []
    (path, value), *_ = [(p, v) for p, v in _floats(stored["output"]) if v != 0]
    rule = _rule(entry.name, path)
    moved = copy.deepcopy(stored)
    _set(moved["output"], path, value * (1 + 2 * rule.rel))
    (diff,) = corpus.check_entry(entry, stored=moved, tolerances=TOLERANCES)
    assert "tolerance relative" in diff
    _set(stored["output"], path, math.nextafter(value, -math.inf))
    assert corpus.check_entry(entry, stored=stored, tolerances=TOLERANCES) == []
    (diff,) = corpus.check_entry(entry, stored=stored)
    assert "1 ulp" in diff


def test_tolerance_is_relative_with_an_absolute_floor() -> None:
    t = corpus.Tolerance("*", "*", rel=1e-8, abs=1e-14)
    assert t.allows(1.0, 1.0 + 0.9e-8) and not t.allows(1.0, 1.0 + 1.1e-8)
    assert t.allows(-1e6, -1e6 * (1 + 0.9e-8)) and not t.allows(-1e6, -1e6 * (1 + 1.1e-8))
    assert t.allows(0.0, 0.9e-14) and not t.allows(0.0, 1.1e-14)  # the floor near zero
    assert t.allows(0.0, -0.0)
    assert t.allows(math.nan, math.nan) and t.allows(math.inf, math.inf)
    assert not t.allows(math.inf, -math.inf) and not t.allows(math.inf, 1e308)
    assert not t.allows(math.nan, 1.0)


def test_rules_apply_by_entry_and_by_any_key_on_the_path() -> None:
    assert _rule("epsilon_at_delta", ("json", "standard")).rel == 1e-6
    assert _rule("privacy_models_history", ("standard", "epsilon", "1e-08")).rel == 1e-6
    assert _rule("epsilon_at_delta", ("json", "heuristic")).rel == 1e-8
    assert _rule("canary_audit", ("gradient_scores", 3)).rel == 1e-4
    assert _rule("monitor_sgd", ("gradient_scores", 3)).rel == 1e-8  # float32: one entry only
    assert _rule("canary_audit", ("report", "standard_epsilon")).rel == 1e-6


def test_comparison_is_strict_apart_from_float_tolerance() -> None:
    for tolerance in (None, corpus.tolerance_of(TOLERANCES, "epsilon_at_delta")):
        def c(old: Any, new: Any) -> list[str]:
            return corpus.compare(old, new, tolerance=tolerance)

        assert c({"a": 1.0}, {"a": 1.0}) == []
        assert c(float("nan"), float("nan")) == []
        assert c(1, 1.0) != [] and c(True, 1) != []  # JSON types differ
        assert c(1, 2) != [] and c("robust", "robust_heuristic") != [] and c(None, 0.0) != []
        assert c({"a": 1}, {"b": 1}) and c([1, 2], [1, 2, 3])
        assert c({"a": 1.0}, {"a": 1.0, "b": 2}) != []  # an added key is reported
        (diff,) = c({"x": [1.0, {"y": 2.0}]}, {"x": [1.0, {"y": 2.5}]})
        assert diff.startswith("x[1].y: old 2.0, new 2.5")
    assert corpus.compare(0.0, -0.0) != []  # exact: bit-identical, not ==
    assert corpus.compare(0.0, -0.0, tolerance=lambda keys: TOLERANCES[-1]) == []


def test_recorded_files_round_trip_exactly() -> None:
    """Every file is what the recorder writes for its own data (floats written by repr)."""
    for p in corpus.CORPUS_DIR.glob("*.json"):
        text = p.read_text()
        assert corpus.dumps(json.loads(text)) == text, p.name
