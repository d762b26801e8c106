"""The child of ``PrivacyMonitor(evaluation="process")``: ``python -m
opacus_lastiterate.callbacks._evaluation_child HEARTBEAT_SECONDS`` (the parent's side, and
the messages, are in :mod:`opacus_lastiterate.callbacks._evaluation_process`). A module of
its own, which the package never imports, so that ``-m`` runs it fresh.

It reads the configuration, builds an
:class:`~opacus_lastiterate.callbacks.evaluator.InlineEvaluator` at the parent's evaluated
state, answers ``("ready",)``, then each request: ``("batch", entries, configuration)`` with
``("records", records, warnings, seconds)``, ``("final",)`` with
``("final", record, warnings, seconds)``, until ``("stop",)`` or the end of its stdin. From
``("ready",)`` on, a thread of its own sends ``("alive",)`` every ``HEARTBEAT_SECONDS``, also
while a request is computed, so that the parent can tell a slow answer from a stopped
process.
"""

from __future__ import annotations

import pickle
import sys
import threading
import time
import warnings
from typing import Any, BinaryIO

import numpy as np

from opacus_lastiterate.callbacks.evaluator import InlineEvaluator, corrected_accountant_of

_PROTOCOL = pickle.HIGHEST_PROTOCOL
_WARM_ALLOCATION = 31 << 20  # bytes: below glibc's largest dynamic mmap threshold (32 MiB)


def _child_evaluator(config: dict[str, Any]) -> InlineEvaluator:
    """The evaluator at the parent's evaluated state (``config["dropped"]``: steps that the
    accountant recorded after it)."""
    accountant = config["accountant"]
    corrected = corrected_accountant_of(accountant, config["corrected"])
    with warnings.catch_warnings():  # the parent's own monitor raised them already
        warnings.simplefilter("ignore")
        evaluator = InlineEvaluator(
            accountant,
            delta=config["delta"],
            cadences=config["cadences"],
            corrected=corrected,
            dropped=config["dropped"],
            rdp=config["rdp"],
            last_lr=config["last_lr"],
        )
    # what the first evaluation would import, imported before "ready"
    import opacus.accountants.analysis.rdp  # noqa: F401

    import opacus_lastiterate.analysis.baselines.composition  # noqa: F401

    # glibc serves allocations above a threshold (128 KiB at first) with fresh mmaps, page
    # faults at every use, and raises the threshold (up to 32 MiB) to the size of such a
    # block when it is freed. A long-running process has done so; a new one has not, and
    # the weighted heuristic's temporary arrays then cost about 0.6 s of page faults per
    # 500 steps of the benchmark. Freeing one large block raises it at once.
    block = np.empty(_WARM_ALLOCATION, dtype=np.uint8)
    del block
    return evaluator


def _caught(caught: list[warnings.WarningMessage]) -> list[tuple[str, type[Warning]]]:
    """The (message, category) pairs of the warnings, each distinct pair once, in order."""
    out: list[tuple[str, type[Warning]]] = []
    for w in caught:
        category = w.category
        try:
            pickle.dumps(category, protocol=_PROTOCOL)
        except Exception:  # a class that cannot be sent by reference
            category = UserWarning
        pair = (str(w.message), category)
        if pair not in out:
            out.append(pair)
    return out


def _beat(answer: Any, every: float) -> None:
    """Heartbeat thread: ``("alive",)`` every ``every`` seconds until stdout is closed."""
    while True:
        time.sleep(every)
        try:
            answer(("alive",))
        except (OSError, ValueError):  # the parent is gone, or the child exits
            return


def _serve(stdin: BinaryIO, stdout: BinaryIO, heartbeat: float) -> int:
    try:
        config = pickle.load(stdin)
    except EOFError:
        return 0
    evaluator = _child_evaluator(config)
    lock = threading.Lock()  # the answers and the heartbeat share stdout

    def answer(msg: tuple[Any, ...]) -> None:
        with lock:
            pickle.dump(msg, stdout, protocol=_PROTOCOL)
            stdout.flush()

    answer(("ready",))
    threading.Thread(target=_beat, args=(answer, heartbeat), daemon=True).start()
    while True:
        try:
            request = pickle.load(stdin)
        except EOFError:
            return 0
        if request[0] == "stop":
            return 0
        start = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if request[0] == "batch":
                _, entries, configuration = request
                if configuration is not None:
                    evaluator.set_corrected_configuration(configuration)
                reply: tuple[Any, ...] = ("records", evaluator.evaluate(entries))
            else:  # "final"
                reply = ("final", evaluator.final_record())
        answer((*reply, _caught(caught), time.perf_counter() - start))


def main() -> int:
    """Serve the parent over stdin/stdout (``print`` in the child goes to stderr); the
    heartbeat's period in seconds is the first argument."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr
    return _serve(stdin, stdout, float(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(main())
