"""An on-disk cache of ``opacus-lastiterate epsilon``'s constant-rate answers.

The standard epsilon composes dp_accounting's PLD: importing dp_accounting (with
``scipy.signal`` and ``scipy.stats``) and composing T steps is most of a cold call. The
answer of one configuration never changes while the code and the libraries that compute it
stay the same, so a repeated call reads it back instead, without importing the analysis or
dp_accounting at all (``benchmarks/bench_cli_startup.py`` times both).

The key holds every input of the numbers (the command's quantity, T, q, sigma, delta or
epsilon, the PLD interval, as ``repr`` of floats) and a fingerprint of what computes them: the
size and modification time of every module of ``opacus_lastiterate/analysis`` and the
versions of dp-accounting, numpy and scipy. Values are stored as JSON floats, which read back
bit-identical. Answers whose computation warned are not stored (a cached answer would lose
the warning). An entry is used only if the caller's ``valid`` accepts it; a malformed one
(a file that is not JSON or is cut short, an entry of the wrong shape or types) is computed
again and overwritten, never an error. Where the cache folder cannot be read or written the
command computes as if there were none.

The folder is ``$OPACUS_LASTITERATE_CACHE_DIR``, else ``$XDG_CACHE_HOME/opacus-lastiterate``,
else ``~/.cache/opacus-lastiterate``; ``OPACUS_LASTITERATE_CACHE_DIR=off`` (or empty) turns the
cache off.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["CACHE_ENV", "cache_dir", "cached"]

CACHE_ENV = "OPACUS_LASTITERATE_CACHE_DIR"
_FILE = "epsilon-cli.json"
_MAX_ENTRIES = 2000
_ANALYSIS = Path(__file__).resolve().parent.parent / "analysis"


def cache_dir() -> Path | None:
    """The cache folder, or ``None`` when the cache is off."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "off", "0", "no", "false") else Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "opacus-lastiterate"


def _fingerprint() -> str:
    from importlib import metadata

    parts = []
    for folder, _, files in sorted(os.walk(_ANALYSIS)):
        for name in sorted(files):
            if name.endswith(".py"):
                stat = os.stat(os.path.join(folder, name))
                parts.append(f"{folder}/{name}:{stat.st_size}:{stat.st_mtime_ns}")
    for dist in ("dp-accounting", "numpy", "scipy"):
        try:
            parts.append(f"{dist}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{dist} missing")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _load(path: Path) -> dict[str, Any]:
    """The entries of the cache file; ``{}`` for a file that cannot be read or parsed
    (missing, cut short, not UTF-8, not JSON, nested too deep, not a JSON object)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def cached(
    inputs: dict[str, Any],
    compute: Callable[[], dict[str, Any]],
    valid: Callable[[Any], bool],
) -> dict[str, Any]:
    """``compute()`` (a JSON-able dict), or what it returned for the same ``inputs``, code and
    libraries before, if ``valid`` accepts that entry (a malformed entry is computed again
    and overwritten). ``valid`` must return a bool for any JSON value and raise nothing."""
    folder = cache_dir()
    if folder is None:
        return compute()
    key = json.dumps({"inputs": {k: repr(v) for k, v in sorted(inputs.items())},
                      "code": _fingerprint()}, sort_keys=True)
    path = folder / _FILE
    entry = _load(path).get(key)
    if isinstance(entry, dict) and valid(entry):
        return entry
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = compute()
    for w in caught:  # shown as if not caught here; such an answer is not stored
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    if caught:
        return value
    entries = _load(path)  # another process may have added entries meanwhile
    entries[key] = value
    while len(entries) > _MAX_ENTRIES:  # oldest first (dicts keep insertion order)
        entries.pop(next(iter(entries)))
    temporary = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, suffix=".tmp") as out:
            temporary = out.name
            json.dump(entries, out, allow_nan=True)
        os.replace(temporary, path)
    except OSError:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
    return value
