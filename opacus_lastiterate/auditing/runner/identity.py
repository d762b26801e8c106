"""The identity of an audit's configuration: what a record file's hash is computed from.

A callable is described by its qualified name plus what the name does not show (dataclass
fields, a partial's arguments, a digest of a function's code and closure or of an instance's
attributes), so that two configurations that train differently hash differently; the
configuration is written as canonical JSON and hashed with SHA-256. Used by the record files
(:mod:`~opacus_lastiterate.auditing.runner.records`), the runner and the model cache of the input-space audits.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = []


def _qualified_name(obj: Any) -> str:
    return (
        f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"
    )


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _state_digest(fn: Any) -> str | None:
    """SHA-256 of what a name does not show: a function's code, defaults and closure values,
    or a plain instance's attributes (reprs with memory addresses removed, so that the same
    configuration hashes alike in a later session)."""
    parts: list[str] = []
    code = getattr(fn, "__code__", None)
    if code is not None:
        parts += [code.co_code.hex(), repr(code.co_consts), repr(getattr(fn, "__defaults__", None))]
        parts += [repr(c.cell_contents) for c in (getattr(fn, "__closure__", None) or ())]
    elif hasattr(fn, "__dict__") and not inspect.isclass(fn):
        parts.append(repr(sorted(vars(fn).items())))
    if not parts:
        return None
    return hashlib.sha256(_ADDRESS.sub("", "\0".join(parts)).encode()).hexdigest()


def callable_identity(fn: Any) -> Any:
    """JSON-able description of a callable: its qualified name, plus the fields of a
    dataclass instance, the bound instance of a method, a partial's arguments, or a digest of
    a function's code and closure / a plain instance's attributes (so that ``make(0.0)`` and
    ``make(50.0)`` closures, or ``Trainer(0)`` and ``Trainer(50)``, are told apart)."""
    if isinstance(fn, functools.partial):
        return {
            "partial": callable_identity(fn.func),
            "args": [repr(a) for a in fn.args],
            "keywords": {k: repr(v) for k, v in sorted(fn.keywords.items())},
        }
    if inspect.ismethod(fn):
        return {"method": _qualified_name(fn.__func__), "self": callable_identity(fn.__self__)}
    if inspect.isbuiltin(fn) or inspect.isclass(fn):
        return _qualified_name(fn)
    if inspect.isfunction(fn):
        return {"function": _qualified_name(fn), "state": _state_digest(fn)}
    ident: dict[str, Any] = {"instance": _qualified_name(type(fn))}
    if dataclasses.is_dataclass(fn):
        ident["fields"] = {f.name: repr(getattr(fn, f.name)) for f in dataclasses.fields(fn)}
    else:
        ident["state"] = _state_digest(fn)
    return ident


def canonical_json(obj: Any) -> str:
    """``obj`` as compact JSON with sorted keys (non-finite numbers refused): the form that is
    hashed and written."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def config_hash(config: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the canonical JSON of ``config``."""
    return hashlib.sha256(canonical_json(config).encode()).hexdigest()


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict) and obj:
        out: dict[str, Any] = {}
        for key, value in obj.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: obj}


def config_diff(stored: Mapping[str, Any], current: Mapping[str, Any]) -> str:
    """The configuration entries that differ, one ``key: stored -> current`` each."""
    a, b = _flatten(dict(stored)), _flatten(dict(current))
    keys = sorted(k for k in a.keys() | b.keys() if a.get(k, "<absent>") != b.get(k, "<absent>"))
    return "; ".join(
        f"{k}: {canonical_json(a.get(k, '<absent>'))} -> {canonical_json(b.get(k, '<absent>'))}"
        for k in keys
    )


def check_json(name: str, value: Any) -> dict[str, Any]:
    """``value`` (a mapping of JSON data, or None for ``{}``) as a plain dict; TypeError naming
    ``name`` otherwise."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(
            f"`{name}` must be a mapping of JSON data or None, got {type(value).__name__}."
        )
    try:
        out = json.loads(canonical_json(dict(value)))
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"`{name}` must contain JSON data only (finite numbers), got {value!r}."
        ) from exc
    return dict(out)
