"""The on-disk answer cache of ``opacus-lastiterate epsilon`` (``cli/_cache.py``): a repeated
configuration gives the same bytes without importing the analysis or dp_accounting; a change
of any input, of the code or of a library computes again; a warning, an unreadable file or
``off`` never gives a stale or missing answer."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import opacus_lastiterate.analysis.comparison as comparison
from opacus_lastiterate.analysis import StandardComposition
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.cli import _cache, main

ROOT = Path(__file__).resolve().parent.parent
ARGS = ["epsilon", "--steps", "30", "--sample-rate", "0.05", "--noise-multiplier", "1.1"]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(_cache.CACHE_ENV, str(tmp_path))
    return tmp_path


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the computations of the comparison (the expensive, PLD-composing path)."""
    seen: list[int] = []
    original = comparison.compare_epsilons_for_history

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(comparison, "compare_epsilons_for_history", counting)
    return seen


def _out(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_a_repeated_call_reads_the_same_answer_back(cache, calls, capsys) -> None:  # type: ignore[no-untyped-def]
    first = _out(capsys, *ARGS, "--delta", "1e-5", "--json")
    assert calls == [1] and (cache / "epsilon-cli.json").exists()
    second = _out(capsys, *ARGS, "--delta", "1e-5", "--json")
    assert calls == [1] and second == first  # no computation, byte-identical output
    text = _out(capsys, *ARGS, "--delta", "1e-5")
    assert calls == [1] and "standard" in text and "PLD interval" in text
    # the value read back is the one computed independently, bit for bit
    run = DPSGDRun.constant(steps=30, sample_rate=0.05, noise_multiplier=1.1)
    assert json.loads(second)["standard"] == StandardComposition(run).epsilon(1e-5)


def test_the_cache_gives_what_no_cache_gives(cache, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    for extra in (["--delta", "1e-6"], ["--epsilon", "1.2"]):
        _out(capsys, *ARGS, *extra, "--json")
        warm = _out(capsys, *ARGS, *extra, "--json")
        monkeypatch.setenv(_cache.CACHE_ENV, "off")
        assert _out(capsys, *ARGS, *extra, "--json") == warm
        monkeypatch.setenv(_cache.CACHE_ENV, str(cache))


@pytest.mark.parametrize("change", [
    ["--delta", "2e-5"], ["--steps", "31"], ["--sample-rate", "0.051"],
    ["--noise-multiplier", "1.2"], ["--value-discretization-interval", "1e-3"],
])
def test_each_input_is_part_of_the_key(cache, calls, capsys, change) -> None:  # type: ignore[no-untyped-def]
    argv = dict(zip(ARGS[1::2], ARGS[2::2]))
    argv["--delta"] = "1e-5"
    _out(capsys, "epsilon", *[w for kv in argv.items() for w in kv])
    argv.update([change])
    _out(capsys, "epsilon", *[w for kv in argv.items() for w in kv])
    assert calls == [1, 1]


def test_a_change_of_code_or_library_computes_again(cache, calls, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _out(capsys, *ARGS, "--delta", "1e-5")
    monkeypatch.setattr(_cache, "_fingerprint", lambda: "another version of dp-accounting")
    _out(capsys, *ARGS, "--delta", "1e-5")
    assert calls == [1, 1]


def test_the_fingerprint_follows_the_analysis_sources(cache, monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    fake = tmp_path / "analysis"
    fake.mkdir()
    (fake / "m.py").write_text("x = 1\n")
    monkeypatch.setattr(_cache, "_ANALYSIS", fake)
    before = _cache._fingerprint()
    (fake / "m.py").write_text("x = 22\n")
    assert _cache._fingerprint() != before


def test_answers_that_warned_are_not_stored(cache, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    original = comparison.compare_epsilons_for_history

    def noisy(*args, **kwargs):  # type: ignore[no-untyped-def]
        warnings.warn("something the user should know", UserWarning, stacklevel=2)
        return original(*args, **kwargs)

    monkeypatch.setattr(comparison, "compare_epsilons_for_history", noisy)
    for _ in range(2):  # the warning each time: nothing was cached
        assert main([*ARGS, "--delta", "1e-5"]) == 0
        assert "something the user should know" in capsys.readouterr().err
    assert not (cache / "epsilon-cli.json").exists()


def test_an_unreadable_cache_is_ignored_and_off_writes_nothing(cache, calls, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    (cache / "epsilon-cli.json").write_text("{not json")
    first = _out(capsys, *ARGS, "--delta", "1e-5", "--json")
    assert calls == [1] and json.loads((cache / "epsilon-cli.json").read_text())
    monkeypatch.setenv(_cache.CACHE_ENV, "off")
    assert _cache.cache_dir() is None
    (cache / "epsilon-cli.json").unlink()
    assert _out(capsys, *ARGS, "--delta", "1e-5", "--json") == first
    assert calls == [1, 1] and not (cache / "epsilon-cli.json").exists()


def test_a_warm_call_imports_neither_the_analysis_nor_dp_accounting(tmp_path: Path) -> None:
    """The light path, in a fresh interpreter: the second call of a configuration."""
    probe = ("import sys; from opacus_lastiterate.cli import main; "
             f"main({[*ARGS, '--delta', '1e-5']!r}); "
             "print([m for m in ('dp_accounting', 'scipy.stats', "
             "'opacus_lastiterate.analysis.comparison') if m in sys.modules])")
    env = {"OPACUS_LASTITERATE_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(ROOT)}
    loaded = [subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                             text=True, check=True, cwd=tmp_path).stdout.splitlines()[-1]
              for _ in range(2)]
    assert "dp_accounting" in loaded[0]  # the cold call computes (so the probe can fail)
    assert loaded[1] == "[]", loaded[1]


def _entry(data: dict) -> dict:  # type: ignore[type-arg]
    """The one answer of a cache file holding one configuration."""
    (key,) = data
    return data[key]  # type: ignore[no-any-return]


def _set(path: str, value: object):  # type: ignore[no-untyped-def]
    """A corruption that replaces the item at ``path`` (keys joined by '/') of the entry."""
    def corrupt(data: dict) -> dict:  # type: ignore[type-arg]
        *parents, last = path.split("/")
        target = _entry(data)
        for part in parents:
            target = target[part]
        target[last] = value
        return data
    return corrupt


def _drop(path: str):  # type: ignore[no-untyped-def]
    def corrupt(data: dict) -> dict:  # type: ignore[type-arg]
        *parents, last = path.split("/")
        target = _entry(data)
        for part in parents:
            target = target[part]
        del target[last]
        return data
    return corrupt


CORRUPTIONS = {
    "values a string": _set("values", "abc"),
    "keys a string": _set("keys", "heuristic"),
    "labels a list": _set("labels", ["x"]),
    "entry a list": lambda data: {k: [1, 2] for k in data},
    "entry a string": lambda data: {k: "abc" for k in data},
    "value a string": _set("values/heuristic", "1.27"),
    "value a bool": _set("values/robust_heuristic", True),
    "value null": _set("values/standard", None),
    "value negative": _set("values/full_batch", -1.0),
    "value NaN": _set("values/heuristic", float("nan")),
    "value missing": _drop("values/standard"),
    "extra value": _set("values/unexpected", 1.0),
    "key unknown": _set("keys", ["heuristic", "nonsense"]),
    "keys empty": _set("keys", []),
    "label missing": _drop("labels/heuristic"),
    "label a number": _set("labels/standard", 3),
}


FAST = [*ARGS, "--value-discretization-interval", "1e-2"]  # a coarse PLD: 0.1 s a call
_FRESH: dict[str, str] = {}


def _fresh(capsys, monkeypatch, argv: list[str]) -> str:  # type: ignore[no-untyped-def]
    """What the command prints without a cache (computed once per command line)."""
    key = " ".join(argv)
    if key not in _FRESH:
        monkeypatch.setenv(_cache.CACHE_ENV, "off")
        _FRESH[key] = _out(capsys, *argv)
    return _FRESH[key]


CASES = [(c, "--delta", "1e-5") for c in sorted(CORRUPTIONS)] + [
    (c, "--epsilon", "1.2") for c in ("values a string", "value missing", "label missing")
]


@pytest.mark.parametrize(("corruption", "option", "value"), CASES)
def test_a_malformed_entry_is_computed_again_and_overwritten(  # type: ignore[no-untyped-def]
    cache, calls, capsys, monkeypatch, corruption, option, value
) -> None:
    """Whatever shape a stored answer has, the command answers as without a cache (exit 0,
    the same bytes), computes it again, and stores a good entry in its place."""
    argv = [*FAST, option, value, "--json"]
    fresh = _fresh(capsys, monkeypatch, argv)
    monkeypatch.setenv(_cache.CACHE_ENV, str(cache))
    _out(capsys, *argv)
    computed = len(calls)
    path = cache / "epsilon-cli.json"
    path.write_text(json.dumps(CORRUPTIONS[corruption](json.loads(path.read_text()))))
    assert _out(capsys, *argv) == fresh
    if option == "--delta":  # `calls` counts the epsilon comparison only
        assert len(calls) == computed + 1
    stored = _entry(json.loads(path.read_text()))  # the good answer took the bad one's place
    assert isinstance(stored["values"], dict) and stored["keys"]
    assert _out(capsys, *argv) == fresh
    if option == "--delta":
        assert len(calls) == computed + 1  # read back, not computed a third time
    assert "heuristic" in _out(capsys, *argv[:-1])  # the table too


@pytest.mark.parametrize("keep", [0.0, 0.3, 0.5, 0.999])
def test_a_truncated_file_is_computed_again_and_rewritten(  # type: ignore[no-untyped-def]
    cache, calls, capsys, keep
) -> None:
    argv = [*FAST, "--delta", "1e-5", "--json"]
    first = _out(capsys, *argv)
    path = cache / "epsilon-cli.json"
    text = path.read_bytes()
    path.write_bytes(text[: int(len(text) * keep)])
    assert _out(capsys, *argv) == first and calls == [1, 1]
    assert _out(capsys, *argv) == first and calls == [1, 1]  # the rewritten file is read
