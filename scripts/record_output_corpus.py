#!/usr/bin/env python
"""Record, or check, a corpus of the package's outputs (the safety net of a refactor).

Every entry is one deterministic computation: the ``--json`` output of a command of the CLI
(run in this process through :func:`opacus_lastiterate.cli.main`), or a short Python
computation (a PrivacyMonitor's JSONL over a tiny Opacus training run, the accountant's
answers, an in-training canary audit, every ScoreAudit analysis, an audit runner). Each is
stored as ``tests/output_corpus/NAME.json`` together with the command or the parameters
that produced it (floats are stored with ``repr``, which round-trips exactly).
``tests/test_output_corpus.py`` recomputes the entries and compares floats at the tolerances
it states (``TOLERANCES``): numpy, scipy and torch pick their SIMD kernels for the CPU at run
time, so the last bits of a value depend on the machine. ``--check`` here compares bit for
bit: a developer's check on the machine that recorded the corpus.

Usage (from the repository root)::

    python scripts/record_output_corpus.py --write            # record every entry
    python scripts/record_output_corpus.py --check            # exit 1 unless bit-identical
    python scripts/record_output_corpus.py --check --quick    # the fast entries only
    python scripts/record_output_corpus.py --check --only 'epsilon_*' --only monitor_sgd
    python scripts/record_output_corpus.py --list

Nothing machine-dependent is recorded: no timings, no absolute paths (temporary
paths are replaced by ``<TMP>``), and the monitor's cadences are integers or "doubling",
never "auto" (which depends on the machine's speed). Torch and BLAS run on one thread inside
every entry (``_deterministic``), so the values do not depend on the process's thread count.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fnmatch
import importlib.util
import io
import json
import math
import struct
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # this checkout's package, not an installed copy
    sys.path.insert(0, str(REPO))
CORPUS_DIR = REPO / "tests" / "output_corpus"
INPUTS_DIR = CORPUS_DIR / "inputs"
RECORDS_FIXTURE = INPUTS_DIR / "audit_runs.jsonl"
FORMAT = "opacus-lastiterate/output-corpus/1"
TMP_MARK = "<TMP>"
MACHINE_KEYS = frozenset({"elapsed_seconds"})
"""Keys dropped from every output, at any depth: wall-clock timings (``reproduce --json``)."""

# --------------------------------------------------------------------------- JSON values


def jsonable(obj: Any) -> Any:
    """``obj`` as plain JSON data (dict, list, str, int, float, bool, None), exactly.

    numpy and torch scalars and arrays become Python numbers and lists (float32 values are
    widened exactly), dataclasses the dict of their fields, tuples lists.
    """
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if type(obj).__module__.startswith("torch") and hasattr(obj, "detach"):
        return jsonable(obj.detach().cpu().numpy())
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    raise TypeError(f"cannot record a {type(obj).__name__}: {obj!r}")


def strip_tmp(obj: Any, tmp: str, mark: str = TMP_MARK) -> Any:
    """Replace the directory ``tmp`` in every string by ``mark`` (default ``<TMP>``)."""
    if isinstance(obj, str):
        return obj.replace(tmp, mark)
    if isinstance(obj, dict):
        return {k: strip_tmp(v, tmp, mark) for k, v in obj.items()}
    if isinstance(obj, list):
        return [strip_tmp(v, tmp, mark) for v in obj]
    return obj


def drop_machine_keys(obj: Any) -> Any:
    """``obj`` without the keys of :data:`MACHINE_KEYS` (at any depth)."""
    if isinstance(obj, dict):
        return {k: drop_machine_keys(v) for k, v in obj.items() if k not in MACHINE_KEYS}
    if isinstance(obj, list):
        return [drop_machine_keys(v) for v in obj]
    return obj


def dumps(data: Any) -> str:
    return json.dumps(data, indent=1, ensure_ascii=False, allow_nan=True) + "\n"


# --------------------------------------------------------------------------- comparison


def _ulps(a: float, b: float) -> int | None:
    """Distance in units in the last place of two finite floats of the same sign."""
    if not (math.isfinite(a) and math.isfinite(b)) or (a < 0) != (b < 0):
        return None

    def bits(x: float) -> int:
        return struct.unpack("<q", struct.pack("<d", abs(x)))[0]

    return abs(bits(a) - bits(b))


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "str"
    if isinstance(v, list):
        return "list"
    if isinstance(v, dict):
        return "dict"
    return type(v).__name__


def _short(v: Any, width: int = 100) -> str:
    text = repr(v) if isinstance(v, (float, str)) else json.dumps(v, allow_nan=True)
    return text if len(text) <= width else text[: width - 3] + "..."


@dataclass(frozen=True)
class Tolerance:
    """Floats of the entries named by ``entry`` (a name or glob) under a dict key matching
    ``key`` (a glob; any key on the value's path, ``"*"``: every value) agree when
    ``|new - old| <= max(rel * max(|old|, |new|), abs)``. ``abs`` is the floor for values
    near zero; ``why`` says where the drift between machines comes from."""

    entry: str
    key: str
    rel: float
    abs: float
    why: str = ""

    def applies(self, entry: str, keys: Sequence[str]) -> bool:
        return fnmatch.fnmatchcase(entry, self.entry) and (
            self.key == "*" or any(fnmatch.fnmatchcase(k, self.key) for k in keys)
        )

    def allows(self, old: float, new: float) -> bool:
        if not (math.isfinite(old) and math.isfinite(new)):
            return repr(old) == repr(new)
        return abs(new - old) <= max(self.rel * max(abs(old), abs(new)), self.abs)


ToleranceOf = Callable[[tuple[str, ...]], Tolerance | None]
"""The tolerance of a float from the dict keys on its path (``None``: bit-identical)."""


def tolerance_of(rules: Sequence[Tolerance], entry: str) -> ToleranceOf:
    """The first of ``rules`` that applies to a value of ``entry`` (``None`` if none does)."""
    mine = [r for r in rules if fnmatch.fnmatchcase(entry, r.entry)]
    return lambda keys: next((r for r in mine if r.applies(entry, keys)), None)


def compare(
    old: Any, new: Any, path: str = "", tolerance: ToleranceOf | None = None,
    keys: tuple[str, ...] = (),
) -> list[str]:
    """Every difference between two JSON values, one line each: ``path: old ... new ...``.

    Same JSON type (an int is not a float), dict keys and list lengths equal, other values
    equal. Floats: within ``tolerance(keys)`` (``keys``: the dict keys on the path) where it
    gives one, NaN equal to NaN and infinities to themselves; otherwise bit-identical
    (their ``repr``s agree, so -0.0 differs from 0.0).
    """
    where = path or "<root>"
    ko, kn = _kind(old), _kind(new)
    if ko != kn:
        return [f"{where}: type {ko} -> {kn}: old {_short(old)}, new {_short(new)}"]
    if ko == "float":
        if repr(old) == repr(new):
            return []
        tol = tolerance(keys) if tolerance is not None else None
        if tol is not None and tol.allows(old, new):
            return []
        ulps = _ulps(old, new)
        extra = ""
        if ulps is not None:
            rel = abs(new - old) / (max(abs(old), abs(new)) or 1.0)
            extra = f" ({ulps} ulp, relative {rel:.3g}"
            extra += f"; tolerance relative {tol.rel:g}, absolute {tol.abs:g})" if tol else ")"
        return [f"{where}: old {old!r}, new {new!r}{extra}"]
    if ko == "dict":
        out: list[str] = []
        for k in old:
            if k not in new:
                out.append(f"{where}: key {k!r} missing (old value {_short(old[k])})")
        for k in new:
            if k not in old:
                out.append(f"{where}: key {k!r} added (new value {_short(new[k])})")
        for k in old:
            if k in new:
                out.extend(compare(old[k], new[k], f"{path}.{k}" if path else str(k),
                                   tolerance, (*keys, k)))
        return out
    if ko == "list":
        out = []
        if len(old) != len(new):
            out.append(f"{where}: length {len(old)} -> {len(new)}")
        for i, (a, b) in enumerate(zip(old, new)):
            out.extend(compare(a, b, f"{path}[{i}]", tolerance, keys))
        return out
    if old != new:
        return [f"{where}: old {_short(old)}, new {_short(new)}"]
    return []


# --------------------------------------------------------------------------- determinism


@contextlib.contextmanager
def _deterministic() -> Iterator[None]:
    """One BLAS / OpenMP thread and one torch thread inside an entry (restored after), and
    warnings that do not leak into the caller's filters.

    Needed: with several BLAS threads some values change in their last bits (the weighted
    heuristic's accuracy, PLD deltas, the FEASGM epsilon: 2 to 10^5 ulp between 1 and 4
    threads). numpy and scipy each load their own OpenBLAS, and threadpoolctl limits only the
    libraries already loaded, so scipy is imported first; torch is limited by
    ``torch.set_num_threads`` when an entry imports it.
    """
    import scipy.linalg  # noqa: F401  (scipy's own OpenBLAS: loaded before the limit)
    from threadpoolctl import threadpool_limits

    torch = sys.modules.get("torch")
    _TORCH_THREADS.clear()
    if torch is not None:
        _TORCH_THREADS.append(torch.get_num_threads())
        torch.set_num_threads(1)
    with threadpool_limits(limits=1), warnings.catch_warnings():
        try:
            yield
        finally:
            torch = sys.modules.get("torch")
            if torch is not None and _TORCH_THREADS:
                torch.set_num_threads(_TORCH_THREADS[0])
            _TORCH_THREADS.clear()


_TORCH_THREADS: list[int] = []
"""torch's thread count before the running entry (restored by :func:`_deterministic`)."""


def _torch_single_thread() -> Any:
    """torch, on one intra-op thread until the entry ends (also when it is imported now)."""
    import torch

    if not _TORCH_THREADS:
        _TORCH_THREADS.append(torch.get_num_threads())
    torch.set_num_threads(1)
    return torch


# --------------------------------------------------------------------------- entries


@dataclass(frozen=True)
class Entry:
    """One corpus entry: ``compute(params, tmp)`` returns its JSON-able output."""

    name: str
    kind: str  # "cli" or "python"
    params: dict[str, Any]
    compute: Callable[[dict[str, Any], str], Any]
    slow: bool = False
    description: str = ""
    tags: tuple[str, ...] = field(default=())


def run_cli(argv: Sequence[str], tmp: str) -> dict[str, Any]:
    """Run ``opacus-lastiterate ARGV`` in this process; its exit status, its JSON output and
    the warning lines it printed (stderr lines that start with the program name)."""
    from opacus_lastiterate.cli import main

    # <TMP> is the entry's temporary folder; committed inputs (tests/output_corpus/...) are
    # given relative to the repository and run from it, whatever the working directory.
    root = str(REPO) + "/"
    args = [
        root + a if a.startswith("tests/output_corpus/") else a.replace(TMP_MARK, tmp)
        for a in argv
    ]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(args)
        except SystemExit as stop:  # usage errors and invalid values
            status = stop.code if isinstance(stop.code, int) else 1
    text = out.getvalue()
    try:
        payload: Any = json.loads(text) if text.strip() else None
    except ValueError:
        payload = {"unparsed_stdout": text}
    lines = [  # the CLI's own warnings and errors (not third-party log lines)
        line
        for line in err.getvalue().splitlines()
        if line.startswith(("opacus-lastiterate", "Error:"))
    ]
    return strip_tmp(
        strip_tmp({"exit_code": status, "json": payload, "stderr": lines}, tmp), root, ""
    )


def _run_cli_entry(p: dict[str, Any], tmp: str) -> dict[str, Any]:
    out = run_cli(p["argv"], tmp)
    if "runs_file" in p:  # the run lines of a record file the command wrote (not its
        # header: it names the trainer's module, which a refactor may move)
        lines = Path(tmp, p["runs_file"]).read_text().splitlines()
        out["runs"] = [r for r in map(json.loads, lines) if r.get("type") == "run"]
    return out


def _cli(
    name: str, argv: str, *, slow: bool = False, description: str = "", runs_file: str = ""
) -> Entry:
    tokens = argv.split() + (["--json"] if "--json" not in argv.split() else [])
    params: dict[str, Any] = {"argv": tokens}
    if runs_file:
        params["runs_file"] = runs_file
    return Entry(name, "cli", params, _run_cli_entry, slow=slow, description=description)


CLI_ENTRIES: list[Entry] = [
    # -- epsilon -------------------------------------------------------------------------
    _cli("epsilon_at_delta", "epsilon --steps 1000 --sample-rate 0.01 --noise-multiplier 1 "
         "--delta 1e-5"),
    _cli("epsilon_delta_at_epsilon", "epsilon --steps 1000 --sample-rate 0.01 "
         "--noise-multiplier 1 --epsilon 2"),
    _cli("epsilon_delta_at_epsilon_coarse", "epsilon --steps 20 --sample-rate 0.05 "
         "--noise-multiplier 1 --epsilon 1.5 --value-discretization-interval 1e-3"),
    _cli("epsilon_calibrate_default", "epsilon --steps 1000 --sample-rate 0.01 --delta 1e-5 "
         "--target-epsilon 2"),
    _cli("epsilon_calibrate_heuristic_full_batch", "epsilon --steps 1000 --sample-rate 0.01 "
         "--delta 1e-5 --target-epsilon 2 --calibrate heuristic --calibrate full_batch"),
    _cli("epsilon_calibrate_robust_coarse", "epsilon --steps 200 --sample-rate 0.02 "
         "--delta 1e-6 --target-epsilon 1 --calibrate robust_heuristic --calibrate standard "
         "--value-discretization-interval 1e-3"),
    _cli("epsilon_cosine_momentum", "epsilon --steps 1000 --sample-rate 0.01 "
         "--noise-multiplier 1 --delta 1e-5 --lr-schedule cosine --momentum 0.9"),
    _cli("epsilon_step_nesterov", "epsilon --steps 300 --sample-rate 0.02 "
         "--noise-multiplier 1.2 --delta 1e-6 --lr-schedule step --step-size 100 --gamma 0.5 "
         "--momentum 0.5 --nesterov"),
    _cli("epsilon_momentum_dampening", "epsilon --steps 300 --sample-rate 0.02 "
         "--noise-multiplier 1.2 --delta 1e-6 --momentum 0.5 --dampening 0.1 --accuracy 1e-2"),
    _cli("epsilon_schedule_file", f"epsilon --steps 40 --sample-rate 0.05 "
         f"--noise-multiplier 1 --delta 1e-5 --lr-schedule {TMP_MARK}/schedule.txt"),
    _cli("epsilon_cosine_delta_at_epsilon", "epsilon --steps 300 --sample-rate 0.02 "
         "--noise-multiplier 1.2 --epsilon 1 --lr-schedule cosine", slow=True),
    _cli("epsilon_zero_steps", "epsilon --steps 0 --sample-rate 0.5 --noise-multiplier 1 "
         "--delta 1e-5"),
    _cli("epsilon_full_batch_rate", "epsilon --steps 20 --sample-rate 1 --noise-multiplier 5 "
         "--delta 1e-5"),
    _cli("epsilon_usage_error", "epsilon --steps 300 --sample-rate 0.02 --delta 1e-5 "
         "--target-epsilon 3 --lr-schedule cosine --calibrate heuristic"),
    _cli("epsilon_invalid_nesterov", "epsilon --steps 30 --sample-rate 0.02 "
         "--noise-multiplier 1.2 --delta 1e-6 --momentum 0.5 --dampening 0.1 --nesterov"),
    # -- plan ----------------------------------------------------------------------------
    _cli("plan_cifar_epochs", "plan --dataset-size 50000 --epochs 200 "
         "--batch-sizes 4096,1024,512,256 --target-epsilon 6 --delta 1e-5"),
    _cli("plan_steps_robust", "plan --dataset-size 10000 --steps 500 --batch-sizes 1000,100 "
         "--target-epsilon 2 --delta 1e-5 --accountant robust_heuristic"),
    _cli("plan_steps_standard", "plan --dataset-size 10000 --steps 500 "
         "--batch-sizes 1000,100 --target-epsilon 2 --delta 1e-5 --accountant standard "
         "--value-discretization-interval 1e-3"),
    # -- normalisation -------------------------------------------------------------------
    _cli("normalisation_docs", "normalisation --dataset-size 60000 --batch-size 256 "
         "--noise-multiplier 1 --epochs 1 --delta 1e-5"),
    _cli("normalisation_dimension", "normalisation --dataset-size 50000 --batch-size 250 "
         "--noise-multiplier 1 --epochs 1 --delta 1e-5 --dimension 10000"),
    _cli("normalisation_drop_last", "normalisation --dataset-size 1000 --batch-size 64 "
         "--noise-multiplier 0.8 --epochs 3 --delta 1e-5 --drop-last --dimension 100"),
    # -- compare-versions ----------------------------------------------------------------
    _cli("versions_all_small", "compare-versions --dataset-size 147 --batch-size 3 "
         "--noise-multiplier 1 --epochs 1 --delta 1e-5"),
    _cli("versions_two", "compare-versions --dataset-size 60000 --batch-size 256 "
         "--noise-multiplier 1.1 --epochs 1 --delta 1e-5 --versions 1.4.0,1.6.0"),
    _cli("versions_sum_no_poisson", "compare-versions --dataset-size 1000 --batch-size 50 "
         "--noise-multiplier 1 --steps 50 --delta 1e-5 --dimension 1000 "
         "--loss-reduction sum --no-poisson"),
    _cli("versions_drop_last_range", "compare-versions --dataset-size 1000 --batch-size 64 "
         "--noise-multiplier 1 --epochs 2 --delta 1e-5 --drop-last --versions 0.9.0..1.0.0"),
    # -- counterexample ------------------------------------------------------------------
    _cli("counterexample_docs", "counterexample --steps 3 --sample-rate 0.1 "
         "--noise-multiplier 1 --delta 1e-6"),
    _cli("counterexample_alpha_small", "counterexample --steps 100 --sample-rate 0.05 "
         "--noise-multiplier 1.5 --delta 1e-5 --alpha 0.1"),
    _cli("counterexample_alpha_one", "counterexample --steps 50 --sample-rate 0.1 "
         "--noise-multiplier 1 --delta 1e-5 --alpha 1"),
    _cli("counterexample_alpha_zero", "counterexample --steps 50 --sample-rate 0.1 "
         "--noise-multiplier 1 --delta 1e-5 --alpha 0"),
    # -- audit records (the committed fixture tests/output_corpus/inputs/audit_runs.jsonl) -
    *[
        _cli(f"audit_records_{name}", f"audit records {{records}} {extra}".strip())
        for name, extra in [
            ("default", ""),
            ("bonferroni", "--threshold bonferroni"),
            ("held_out", "--threshold held-out --confidence 0.99 --seed 3"),
            ("multi_split", "--threshold multi-split --seed 1"),
            ("naive_max", "--threshold naive-max"),
            ("gaussian_dp", "--method gaussian-dp --delta 1e-6"),
            ("first_runs", "--num-runs 100 --threshold bonferroni --method gaussian-dp"),
        ]
    ],
    _cli("audit_digits_quick", f"audit digits --quick --no-progress --records {TMP_MARK}/runs.jsonl",
         slow=True, runs_file="runs.jsonl"),
    _cli("audit_digits_quick_input", "audit digits --quick --no-progress --canary input "
         "--threshold held-out", slow=True),
    # -- reproduce -----------------------------------------------------------------------
    *[
        _cli(f"reproduce_{fig.replace('-', '_')}_quick",
             f"reproduce {fig} --quick --no-plot", slow=fig == "normalisation-fig2")
        for fig in ("last-iterate-fig1", "last-iterate-fig3", "last-iterate-fig5",
                    "last-iterate-table1", "cebere-fig4", "normalisation-fig2")
    ],
    *[
        _cli(f"reproduce_{fig.replace('-', '_')}_default", f"reproduce {fig} --no-plot",
             slow=True)
        for fig in ("last-iterate-fig1", "last-iterate-fig3", "last-iterate-fig5",
                    "last-iterate-table1", "cebere-fig4")
    ],
]

# The records placeholder is a path relative to the repository (a committed input).
_RECORDS_ARG = "tests/output_corpus/inputs/audit_runs.jsonl"
CLI_ENTRIES = [
    dataclasses.replace(
        e,
        params={**e.params, "argv": (argv := [_RECORDS_ARG if a == "{records}" else a
                                              for a in e.params["argv"]])},
        description=e.description or f"opacus-lastiterate {' '.join(argv)}",
    )
    for e in CLI_ENTRIES
]


def _schedule_file_setup(tmp: str) -> None:
    """The learning-rate file of ``epsilon_schedule_file``: 40 rates, a warm-up then decay."""
    rates = [0.1 * (i + 1) / 10 if i < 10 else 0.1 * 0.95 ** (i - 10) for i in range(40)]
    Path(tmp, "schedule.txt").write_text("".join(f"{r!r}\n" for r in rates))


# -- Python entries --------------------------------------------------------------------------


def _tiny_dp(
    params: dict[str, Any], augment: Callable[[Any], Any] | None = None
) -> tuple[Any, Any, Any, Any, Any]:
    """(engine, model, optimizer, loader, scheduler) of a tiny Opacus run, Poisson sampling
    (``augment``: maps the training set to the one actually used, e.g. with canaries)."""
    torch = _torch_single_thread()
    from opacus import PrivacyEngine
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import opacus_lastiterate.accountants  # noqa: F401  (registers accountant="last_iterate")

    torch.manual_seed(params["seed"])
    n, d = params["dataset_size"], params["features"]
    x, y = torch.randn(n, d), torch.randint(0, 2, (n,))
    data = TensorDataset(x, y) if augment is None else augment(TensorDataset(x, y))
    model = nn.Sequential(nn.Linear(d, params["hidden"]), nn.ReLU(), nn.Linear(params["hidden"], 2))
    optimizer = torch.optim.SGD(
        model.parameters(), lr=params["lr"], momentum=params.get("momentum", 0.0)
    )
    engine = PrivacyEngine(accountant="last_iterate")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optimizer, loader = engine.make_private(
            module=model,
            optimizer=optimizer,
            data_loader=DataLoader(data, batch_size=params["batch_size"]),
            noise_multiplier=params["noise_multiplier"],
            max_grad_norm=1.0,
            poisson_sampling=True,
        )
    scheduler = None
    if params.get("schedule") == "cosine":
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=params["steps"])
    return engine, model, optimizer, loader, scheduler


@contextlib.contextmanager
def _package_warnings(into: list[str]) -> Iterator[None]:
    """Collect the distinct warnings the package raises (``Category: message``), in order."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        if w.category.__module__.startswith("opacus_lastiterate"):
            line = f"{w.category.__name__}: {w.message}"
            if line not in into:
                into.append(line)


def _train(model: Any, optimizer: Any, loader: Any, steps: int, scheduler: Any = None) -> None:
    from torch import nn

    done = 0
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ff]ull backward hook")
        while done < steps:
            for x, y in loader:
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
                done += 1
                if done == steps:
                    return


def _monitor_entry(params: dict[str, Any], tmp: str) -> dict[str, Any]:
    """A PrivacyMonitor with a JsonlSink over a tiny run; the JSONL lines and the accountant's
    answers after the run."""
    from opacus_lastiterate.callbacks import JsonlSink, PrivacyMonitor

    engine, model, optimizer, loader, scheduler = _tiny_dp(params)
    corrected = None
    if params.get("corrected_accountant") == "feasgm":
        from opacus_lastiterate.accountants import FEASGMAccountant

        corrected = FEASGMAccountant().configure(
            dataset_size=params["dataset_size"], batch_size=params["batch_size"]
        )
    path = Path(tmp, "monitor.jsonl")
    caught: list[str] = []
    with _package_warnings(caught):
        monitor = PrivacyMonitor(
            engine,
            delta=params["delta"],
            sinks=[JsonlSink(path)],
            optimizer=optimizer,
            corrected_accountant=corrected,
            **params["monitor"],
        )
        _train(model, optimizer, loader, params["steps"], scheduler)
        final = monitor.finish()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    acc = engine.accountant
    delta = params["delta"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out: dict[str, Any] = {
            "jsonl": lines,
            "records_emitted": monitor.records_emitted,
            "final_record": None if final is None else final.as_dict(),
            "history": acc.history,
            "get_epsilon": engine.get_epsilon(delta),
            "get_epsilon_robust": acc.get_epsilon(delta, robust=True),
            "get_delta_at_1": acc.get_delta(1.0),
            "describe": acc.describe(),
            "describe_delta": acc.describe(delta),
            "warnings": caught,
        }
        if corrected is not None:
            out["corrected_get_epsilon"] = corrected.get_epsilon(delta)
            out["corrected_history"] = corrected.history
    return jsonable(out)


_TINY = {"seed": 0, "dataset_size": 200, "features": 8, "hidden": 4, "batch_size": 20,
         "noise_multiplier": 1.0, "lr": 0.1, "delta": 1e-5}
_CADENCES = {"heuristic_every": 1, "weighted_every": 10, "robust_every": 50,
             "standard_every": "doubling", "flush_every": 100}


def _canary_entry(params: dict[str, Any], tmp: str) -> dict[str, Any]:
    """InTrainingCanaryAudit (gradient and input canaries) of a tiny run: its report, the
    canaries' coordinates, coins, insertions and scores."""
    torch = _torch_single_thread()
    from torch.utils.data import TensorDataset

    from opacus_lastiterate.auditing.input_space import make_input_canaries
    from opacus_lastiterate.callbacks import InTrainingCanaryAudit

    gen = torch.Generator().manual_seed(params["seed"] + 1)
    source = TensorDataset(  # held-out examples the input canaries are drawn from
        torch.randn(params["input_pool"], params["features"], generator=gen),
        torch.randint(0, 2, (params["input_pool"],), generator=gen),
    )
    made: list[Any] = []

    def augment(train: Any) -> Any:
        data, canaries = make_input_canaries(
            train, source, params["input_canaries"], num_classes=2, seed=params["seed"]
        )
        made.append(canaries)
        return data

    engine, model, optimizer, loader, _ = _tiny_dp(params, augment)
    canaries = made[0]
    audit = InTrainingCanaryAudit(
        optimizer,
        num_canaries=params["gradient_canaries"],
        sample_rate=1 / len(loader),
        seed=params["seed"],
        accountant=engine.accountant,
        input_canaries=canaries,
    )
    caught: list[str] = []
    with _package_warnings(caught):
        _train(model, optimizer, loader, params["steps"])
        report = audit.report(delta=params["delta"], confidence=0.95, model=model)
    return jsonable({
        "report": report.as_dict(),
        "warnings": caught,
        "steps": audit.steps,
        "coordinates": audit.coordinates,
        "coins": audit.coins,
        "insertions": audit.insertions(),
        "gradient_scores": audit.gradient_scores(),
        "input_canary_indices": canaries.source_indices,
        "input_canary_labels": canaries.labels,
        "input_canary_included": canaries.included,
        "input_scores": canaries.scores(model),
    })


def _scores(seed: int, n_in: int, n_out: int, shift: float, decimals: int) -> tuple[list, list]:
    rng = np.random.default_rng(seed)
    ins = np.round(rng.normal(shift, 1.0, n_in), decimals)
    outs = np.round(rng.normal(0.0, 1.0, n_out), decimals)
    return ins.tolist(), outs.tolist()


def _strategies(seed: int) -> dict[str, Any]:
    from opacus_lastiterate.analysis.audit import threshold_strategies as ts

    return {
        "rank_grid": ts.RankGridBonferroni(),
        "rank_grid_1.5": ts.RankGridBonferroni(growth=1.5),
        "bonferroni": ts.Bonferroni(),
        "bonferroni_preset": ts.Bonferroni(candidates=(-1.0, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0)),
        "held_out": ts.HeldOutSplit(seed=seed),
        "multi_split": ts.MultiSplit(num_splits=20, seed=seed),
        "explicit": ts.ExplicitThreshold(1.0),
        "naive_max": ts.NaiveMax(),
    }


def _result(r: Any) -> dict[str, Any]:
    d = jsonable(r)
    strategy = r.threshold_strategy
    d["threshold_strategy"] = None if strategy is None else strategy.describe()
    d["str"] = str(r)
    return d


def _score_audit_entry(params: dict[str, Any], tmp: str) -> dict[str, Any]:
    """Every analysis of ScoreAudit on fixed scores (multi-run form and one-run form)."""
    from opacus_lastiterate.analysis.audit import ScoreAudit

    ins, outs = params["in_scores"], params["out_scores"]
    audit = ScoreAudit(ins, outs)
    out: dict[str, Any] = {"multi_run": {}, "one_run": {}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, s in _strategies(params["seed"]).items():
            for delta in params["deltas"]:
                key = f"{name}@{delta!r}"
                out["multi_run"][key] = {
                    "clopper_pearson": _result(
                        audit.clopper_pearson(delta=delta, threshold_strategy=s)),
                }
                if delta > 0:  # Gaussian-DP needs delta in (0, 1)
                    out["multi_run"][key]["gaussian_dp"] = _result(
                        audit.gaussian_dp(delta=delta, threshold_strategy=s))
        out["multi_run"]["clopper_pearson_conf_0.99"] = _result(
            audit.clopper_pearson(delta=1e-5, confidence=0.99))
        out["auroc"] = audit.auroc()
        out["auroc_hull"] = audit.auroc(convex_hull=True)
        out["tpr_at_fpr"] = jsonable(audit.tpr_at_fpr(params["fprs"]))
        out["tpr_at_fpr_scalar"] = jsonable(audit.tpr_at_fpr(0.05))
        curve = audit.error_curve()
        every = params["error_curve_every"]
        out["error_curve"] = {
            "size": int(curve.thresholds.size),
            "thresholds": jsonable(curve.thresholds[::every]),
            "false_positives": jsonable(curve.false_positives[::every]),
            "false_negatives": jsonable(curve.false_negatives[::every]),
            "false_positive_rates": jsonable(curve.false_positive_rates[::every]),
            "false_negative_rates": jsonable(curve.false_negative_rates[::every]),
        }
        # One-run form: canary i scores ins/outs by its coin.
        coins = np.random.default_rng(params["seed"] + 7).random(len(ins) + len(outs)) < 0.5
        pool = np.concatenate([ins, outs])
        one = ScoreAudit.from_canaries(pool + coins * params["one_run_shift"], coins)
        for name, s in _strategies(params["seed"]).items():
            if name == "bonferroni_preset":
                continue
            for delta in params["one_run_deltas"]:
                key = f"{name}@{delta!r}"
                out["one_run"][key] = {
                    "one_run": _result(one.one_run(delta=delta, threshold_strategy=s)),
                    "one_run_fdp": _result(one.one_run_fdp(delta=delta, threshold_strategy=s)),
                    "one_run_fdp_gaussian": _result(one.one_run_fdp(
                        delta=max(delta, 1e-12), family="gaussian", threshold_strategy=s)),
                }
        non_random = ScoreAudit.from_canaries(pool, coins, inclusion_randomized=False)
        out["one_run"]["not_randomized"] = _result(non_random.one_run(delta=1e-6))
    return out


def _synthetic_train(include_canary: bool, seed: int) -> float:
    """A 'model' of the synthetic audit: one number, shifted by 1.5 with the canary."""
    return float(np.random.default_rng(seed).normal()) + (1.5 if include_canary else 0.0)


def _synthetic_score(model: float) -> float:
    return float(model)


def _runner(num_runs: int, seed: int, path: Path | None) -> Any:
    from opacus_lastiterate.auditing import AuditRunner

    return AuditRunner(
        _synthetic_train, _synthetic_score, num_runs=num_runs, seed=seed, path=path,
        workers=0, progress=False,
    )


def write_records_fixture(path: Path = RECORDS_FIXTURE, num_runs: int = 300) -> None:
    """The run-records file that the ``audit_records_*`` entries re-audit (written once, kept
    under version control: a later version must still read it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _runner(num_runs, 0, path).run()


def _runner_entry(params: dict[str, Any], tmp: str) -> dict[str, Any]:
    """AuditRunner in this process on a synthetic train function: each run's seed, coin and
    score, and the audits of the records."""
    from opacus_lastiterate.auditing import audit_records, read_records
    from opacus_lastiterate.auditing.runner import RECORD_FORMAT

    path = Path(tmp, "runs.jsonl")
    runner = _runner(params["num_runs"], params["seed"], path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runner.run()
        records = read_records(path)
        cp = audit_records(records, delta=1e-5)
        gdp = audit_records(records, delta=1e-5, method="gaussian-dp")
        fixture = read_records(REPO / _RECORDS_ARG)
    return {
        "record_format": RECORD_FORMAT,
        "runs": [[r.index, r.seed, r.include_canary, r.score] for r in records.records],
        "audit_clopper_pearson": _result(cp),
        "audit_gaussian_dp": _result(gdp),
        "fixture_runs": len(fixture),
        "fixture_in_scores_head": jsonable(fixture.in_scores[:10]),
    }


def _privacy_models_entry(params: dict[str, Any], tmp: str) -> dict[str, Any]:
    """The analysis layer's privacy models on a multi-segment history, epsilon at several
    deltas and delta at several epsilons; the weighted heuristic of torch SGD weights."""
    from opacus_lastiterate import analysis as a
    from opacus_lastiterate.analysis.last_iterate.weighted_heuristic import (
        weighted_heuristic_epsilon_result,
    )

    run = a.DPSGDRun.from_history([tuple(s) for s in params["history"]])
    models = {
        "heuristic": a.LastIterateHeuristic(run),
        "robust_heuristic": a.RobustLastIterateHeuristic(run),
        "standard": a.StandardComposition(run, value_discretization_interval=1e-3),
        "full_batch": a.FullBatchGaussian(run),
    }
    out: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, model in models.items():
            out[name] = {
                "kind": model.kind,
                "epsilon": {repr(d): model.epsilon(d) for d in params["deltas"]},
                "delta": {repr(e): model.delta(e) for e in params["epsilons"]},
            }
        comparison = a.compare_epsilons_for_history(
            run, 1e-5, value_discretization_interval=1e-3
        )
        out["compare_epsilons_for_history"] = comparison.as_dict()
        steps = params["weighted_steps"]
        lrs = a.builtin_schedule("cosine", 0.1, steps)
        weights = a.sgd_weights(lrs, momentum=0.9, weight_decay=1e-4)
        # recorded with the weighted heuristic function, which returned this result object; the
        # function of that name returns a float since, and this one the object
        result = weighted_heuristic_epsilon_result(
            1e-5, weights=weights, sample_rates=0.02, noise_multipliers=1.1
        )
        out["weighted"] = {"learning_rates_head": jsonable(lrs[:5]),
                           "weights_every_25": jsonable(weights[::25]),
                           "result": jsonable(result)}
    return jsonable(out)


_IN, _OUT = _scores(0, 400, 400, 1.0, 6)

PY_ENTRIES: list[Entry] = [
    Entry("monitor_sgd", "python",
          {**_TINY, "steps": 200, "monitor": dict(_CADENCES)},
          _monitor_entry,
          description="PrivacyMonitor + JsonlSink, plain SGD, 200 steps, q = 0.1"),
    Entry("monitor_sgd_flush_every_step", "python",
          {**_TINY, "steps": 60, "monitor": {**_CADENCES, "robust_every": 1,
                                             "standard_every": 20, "flush_every": 1}},
          _monitor_entry,
          description="PrivacyMonitor, plain SGD, every value every step (flush_every=1)"),
    Entry("monitor_momentum_cosine", "python",
          {**_TINY, "steps": 200, "momentum": 0.9, "schedule": "cosine",
           "monitor": dict(_CADENCES)},
          _monitor_entry,
          description="PrivacyMonitor, SGD momentum 0.9 + CosineAnnealingLR, 200 steps"),
    Entry("monitor_feasgm", "python",
          {**_TINY, "steps": 150, "corrected_accountant": "feasgm",
           "monitor": {**_CADENCES, "standard_every": 50}},
          _monitor_entry, slow=True,
          description="PrivacyMonitor with corrected_accountant=FEASGMAccountant"),
    Entry("canary_audit", "python",
          {**_TINY, "hidden": 32, "noise_multiplier": 0.5, "lr": 0.5, "steps": 100,
           "gradient_canaries": 300, "input_canaries": 30, "input_pool": 60},
          _canary_entry,
          description="InTrainingCanaryAudit report, gradient + input canaries"),
    Entry("score_audit", "python",
          {"seed": 0, "in_scores": _IN, "out_scores": _OUT, "deltas": [0.0, 1e-5],
           "one_run_deltas": [0.0, 1e-6], "one_run_shift": 1.0,
           "fprs": [0.0, 0.001, 0.01, 0.1, 0.5], "error_curve_every": 16},
          _score_audit_entry,
          description="ScoreAudit: Clopper-Pearson, Gaussian-DP, one-run, f-DP one-run, "
                      "AUROC, TPR at FPR, error curve, every threshold strategy"),
    Entry("audit_runner_synthetic", "python",
          {"num_runs": 200, "seed": 5}, _runner_entry,
          description="AuditRunner(workers=0) on a synthetic train function"),
    Entry("privacy_models_history", "python",
          {"history": [[1.0, 0.01, 300], [1.5, 0.02, 200], [0.8, 0.005, 100]],
           "deltas": [1e-3, 1e-5, 1e-8], "epsilons": [0.5, 1.0, 4.0],
           "weighted_steps": 200},
          _privacy_models_entry,
          description="analysis privacy models on a 3-segment history; weighted heuristic"),
]

ENTRIES: dict[str, Entry] = {e.name: e for e in (*CLI_ENTRIES, *PY_ENTRIES)}
SETUP: dict[str, Callable[[str], None]] = {"epsilon_schedule_file": _schedule_file_setup}


# --------------------------------------------------------------------------- record / check


def compute(entry: Entry, params: dict[str, Any] | None = None) -> Any:
    """The entry's output now (``params``: the recorded ones instead of the definition's)."""
    p = entry.params if params is None else params
    with tempfile.TemporaryDirectory(prefix="corpus-") as tmp, _deterministic():
        if entry.name in SETUP:
            SETUP[entry.name](tmp)
        out = entry.compute(p, tmp)
        # exactly what a file holds
        return json.loads(dumps(drop_machine_keys(strip_tmp(jsonable(out), tmp))))


def path_of(name: str) -> Path:
    return CORPUS_DIR / f"{name}.json"


def record(entry: Entry) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "name": entry.name,
        "kind": entry.kind,
        "slow": entry.slow,
        "description": entry.description,
        "params": entry.params,
        "output": compute(entry),
    }


def load(name: str) -> dict[str, Any]:
    return json.loads(path_of(name).read_text())


def check_entry(
    entry: Entry, stored: dict[str, Any] | None = None,
    tolerances: Sequence[Tolerance] | None = None,
) -> list[str]:
    """Recompute ``entry`` and list its differences from the recorded output (empty: equal).

    ``tolerances``: compare floats within the first rule that applies (see
    :class:`Tolerance`); ``None``: bit-identical.
    """
    if stored is None:
        stored = load(entry.name)
    diffs = [f"params.{d}" for d in compare(
        json.loads(dumps(stored["params"])), json.loads(dumps(entry.params)))]
    if diffs:
        diffs[0] += " (the definition changed: re-record deliberately)"
    tolerance = None if tolerances is None else tolerance_of(tolerances, entry.name)
    diffs.extend(compare(stored["output"], compute(entry, stored["params"]), "output", tolerance))
    return diffs


def select(only: Sequence[str] | None, quick: bool) -> list[Entry]:
    entries = list(ENTRIES.values())
    if only:
        chosen = [e for e in entries if any(fnmatch.fnmatchcase(e.name, p) for p in only)]
        missing = [p for p in only if not any(fnmatch.fnmatchcase(e.name, p) for e in entries)]
        if missing:
            raise SystemExit(f"no entry matches {missing}; --list shows the names")
        entries = chosen
    if quick:
        entries = [e for e in entries if not e.slow]
    return entries


def format_diffs(name: str, diffs: list[str], limit: int = 40) -> str:
    lines = [f"{name}: {len(diffs)} difference(s)"]
    lines += [f"  {d}" for d in diffs[:limit]]
    if len(diffs) > limit:
        lines.append(f"  ... and {len(diffs) - limit} more")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="record the selected entries")
    mode.add_argument("--check", action="store_true", help="recompute and compare")
    mode.add_argument("--list", action="store_true", help="list the entries")
    parser.add_argument("--only", action="append", metavar="NAME",
                        help="an entry name or glob (repeatable)")
    parser.add_argument("--quick", action="store_true", help="the fast entries only")
    args = parser.parse_args(argv)
    entries = select(args.only, args.quick)
    import opacus_lastiterate

    print(f"opacus_lastiterate from {Path(opacus_lastiterate.__file__).parent}", file=sys.stderr)
    if args.list:
        for e in entries:
            print(f"{e.name:45s} {'slow' if e.slow else 'fast'}  {e.description}")
        return 0
    if args.write:
        CORPUS_DIR.mkdir(parents=True, exist_ok=True)
        if not RECORDS_FIXTURE.exists():
            write_records_fixture()
            print(f"wrote {RECORDS_FIXTURE.relative_to(REPO)}")
        total = 0.0
        for e in entries:
            start = time.perf_counter()
            data = record(e)
            path_of(e.name).write_text(dumps(data))
            seconds = time.perf_counter() - start
            total += seconds
            print(f"wrote {path_of(e.name).relative_to(REPO)}  ({seconds:.1f} s)")
        print(f"{len(entries)} entries in {total:.1f} s")
        return 0
    failed = 0
    total = total_cpu = 0.0
    for e in entries:
        if not path_of(e.name).exists():
            print(f"{e.name}: not recorded (run --write --only {e.name})")
            failed += 1
            continue
        start, cpu = time.perf_counter(), time.process_time()
        diffs = check_entry(e)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        total += seconds
        total_cpu += cpu
        if diffs:
            failed += 1
            print(format_diffs(e.name, diffs))
        else:
            print(f"{e.name}: identical ({seconds:.1f} s, CPU {cpu:.1f} s)")
    print(f"{len(entries) - failed}/{len(entries)} entries identical "
          f"({total:.1f} s, CPU {total_cpu:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    # Run the module under its own name, as the tests import it, so that the functions it
    # hands to the package (the audit runner's train function) have one qualified name.
    _spec = importlib.util.spec_from_file_location("record_output_corpus", __file__)
    assert _spec is not None and _spec.loader is not None
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["record_output_corpus"] = _module
    _spec.loader.exec_module(_module)
    sys.exit(_module.main())
