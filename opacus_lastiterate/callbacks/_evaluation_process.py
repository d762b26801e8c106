"""The evaluation process of ``PrivacyMonitor(evaluation="process")`` (``docs/callbacks.md``,
"Evaluation in a separate process").

The child is a plain ``python -m opacus_lastiterate.callbacks._evaluation_process`` started
with :class:`subprocess.Popen` (not a ``multiprocessing`` start method: those import the
user's ``__main__`` again, and a training script without an ``if __name__ == "__main__"``
guard would train a second time in the child). It holds a *headless* ``PrivacyMonitor``: one
built on a pickled copy of the accountant, with the same delta and cadences, no sinks, no
optimizer, no automatic flush.

Messages are pickles over the child's stdin and stdout (a pickle stream is self-delimiting):

* parent -> child: the configuration (once, first), then ``("batch", entries, corrected)``
  (queued steps; the corrected accountant's settings), ``("final",)`` or ``("stop",)``;
* child -> parent: ``("ready",)`` once its monitor is built, then per request
  ``("records", [EpsilonRecord, ...], warnings)`` or ``("final", EpsilonRecord, warnings)``,
  ``warnings`` being the ``(message, category)`` pairs raised while computing them.

The child exits on ``("stop",)`` or at the end of its stdin, so it dies with its parent.
In the parent, a writer thread pickles and writes the requests and a reader thread reads
the answers into a :class:`queue.Queue`; neither blocks the training thread.
"""

from __future__ import annotations

import os
import pickle
import queue
import subprocess
import sys
import threading
import warnings
import weakref
from typing import Any, BinaryIO

_STOP = object()  # the writer thread's last request
_PROTOCOL = pickle.HIGHEST_PROTOCOL
_WARM_ALLOCATION = 31 << 20  # bytes: below glibc's largest dynamic mmap threshold (32 MiB)


# -- the parent's side ----------------------------------------------------------------------


def _write(stdin: BinaryIO, outbox: queue.Queue[Any], inbox: queue.Queue[Any]) -> None:
    """Writer thread: pickle and send each request of ``outbox`` (bytes are sent as they are)."""
    try:
        while True:
            msg = outbox.get()
            if msg is _STOP:
                pickle.dump(("stop",), stdin, protocol=_PROTOCOL)
                stdin.flush()
                return
            stdin.write(msg if isinstance(msg, bytes) else pickle.dumps(msg, protocol=_PROTOCOL))
            stdin.flush()
    except (OSError, ValueError) as exc:  # a broken pipe, or stdin closed by a kill
        inbox.put(("dead", f"writing to it failed: {type(exc).__name__}: {exc}"))
    finally:
        try:
            stdin.close()
        except (OSError, ValueError):
            pass


def _read(
    stdout: BinaryIO, inbox: queue.Queue[Any], ready: threading.Event, ended: threading.Event
) -> None:
    """Reader thread: unpickle the child's answers into ``inbox`` until its stdout ends."""
    try:
        while True:
            msg = pickle.load(stdout)
            if msg[0] == "ready":
                ready.set()
            else:
                inbox.put(msg)
    except EOFError:
        inbox.put(("dead", "it ended"))
    except Exception as exc:  # a truncated or unreadable answer
        inbox.put(("dead", f"reading from it failed: {type(exc).__name__}: {exc}"))
    finally:
        stdout.close()
        ended.set()
        ready.set()


def _shutdown(process: subprocess.Popen[bytes], outbox: queue.Queue[Any], how: str) -> None:
    """Stop the child. ``how``: ``"ask"``: send it "stop" (it exits once it has read it);
    ``"wait"``: also wait up to 5 s, then kill it; ``"kill"``: kill it at once."""
    if process.poll() is None and how != "kill":
        outbox.put(_STOP)
        if how == "ask":
            return
        try:
            process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass
    if process.poll() is None:
        process.kill()
        process.wait()


_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
"""Thread-pool sizes set to 1 in the evaluation process unless the user set them."""


class EvaluationWorker:
    """A running evaluation process, seen from the parent.

    Args:
        config: the pickled configuration of the headless monitor (pickled by the caller,
            on the training thread, so that the accountant is not read while it changes).

    Raises:
        OSError: if the process cannot be started.
    """

    def __init__(self, config: bytes) -> None:
        path = [p or os.getcwd() for p in sys.path]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
        for name in _THREAD_VARIABLES:  # one core: leave the others to training
            env.setdefault(name, "1")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "opacus_lastiterate.callbacks._evaluation_process"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self._outbox: queue.Queue[Any] = queue.Queue()
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._ready = threading.Event()
        self._ended = threading.Event()
        self._outbox.put(config)
        for target, args in (
            (_write, (self.process.stdin, self._outbox, self._inbox)),
            (_read, (self.process.stdout, self._inbox, self._ready, self._ended)),
        ):
            threading.Thread(target=target, args=args, daemon=True).start()
        # garbage-collected (with its monitor): ask the child to stop, without waiting
        self._finalizer = weakref.finalize(self, _shutdown, self.process, self._outbox, "ask")

    def send(self, request: tuple[Any, ...]) -> None:
        """Queue a request (never blocks; a failure shows as a ``("dead", reason)`` answer)."""
        self._outbox.put(request)

    def receive(self, wait: bool) -> tuple[Any, ...] | None:
        """The next answer: ``("records", ...)``, ``("final", ...)`` or ``("dead", reason)``;
        None if ``wait`` is False and there is none yet."""
        try:
            return self._inbox.get(block=wait)  # type: ignore[no-any-return]
        except queue.Empty:
            return None

    def wait_ready(self, timeout: float | None) -> bool:
        """Wait until the child has built its monitor; False on timeout or if it died."""
        return self._ready.wait(timeout) and not self._ended.is_set()

    def stop(self, kill: bool = False) -> None:
        """Stop the child: ask it and wait up to 5 s (``kill``: kill it at once)."""
        self._finalizer.detach()
        _shutdown(self.process, self._outbox, "kill" if kill else "wait")


# -- the child's side -----------------------------------------------------------------------


def _headless_monitor(config: dict[str, Any]) -> Any:
    """A PrivacyMonitor at the parent's evaluated state (``config["dropped"]``: steps that the
    accountant recorded after it), with no sinks, no optimizer and no automatic flush."""
    import numpy as np

    from opacus_lastiterate.callbacks.monitor import PrivacyMonitor, _drop_last_steps

    accountant = config["accountant"]
    if config["dropped"]:
        accountant.load_state_dict(_drop_last_steps(accountant.state_dict(), config["dropped"]))
    with warnings.catch_warnings():  # the parent's own monitor raised them already
        warnings.simplefilter("ignore")
        monitor = PrivacyMonitor(
            accountant,
            delta=config["delta"],
            heuristic_every=config["heuristic_every"],
            weighted_every=config["weighted_every"],
            robust_every=config["robust_every"],
            standard_every=config["standard_every"],
            flush_every=None,
            corrected_accountant=config["corrected"],
        )
    monitor._rdp.rdp = np.asarray(config["rdp"], dtype=float)
    monitor._last_lr = config["last_lr"]
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
    return monitor


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


def _serve(stdin: BinaryIO, stdout: BinaryIO) -> int:
    try:
        config = pickle.load(stdin)
    except EOFError:
        return 0
    monitor = _headless_monitor(config)

    def answer(msg: tuple[Any, ...]) -> None:
        pickle.dump(msg, stdout, protocol=_PROTOCOL)
        stdout.flush()

    answer(("ready",))
    while True:
        try:
            request = pickle.load(stdin)
        except EOFError:
            return 0
        if request[0] == "stop":
            return 0
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if request[0] == "batch":
                _, entries, corrected = request
                if corrected is not None and monitor._corrected is not None:
                    monitor._corrected._config, monitor._corrected._observed_dimension = corrected
                monitor._queue.extend(entries)
                monitor._evaluate()
                records, monitor._ready = monitor._ready, []
                reply: tuple[Any, ...] = ("records", records)
            else:  # "final"
                reply = ("final", monitor._final_record())
        answer((*reply, _caught(caught)))


def main() -> int:
    """Serve the parent over stdin/stdout (``print`` in the child goes to stderr)."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr
    return _serve(stdin, stdout)


if __name__ == "__main__":
    sys.exit(main())
