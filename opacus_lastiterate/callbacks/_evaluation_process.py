"""The evaluation process of ``PrivacyMonitor(evaluation="process")`` (``docs/callbacks.md``,
"Where the records are computed").

:class:`ProcessEvaluator` is the monitor's evaluator (the
:class:`~opacus_lastiterate.callbacks.evaluator.Evaluator` protocol) that hands the queued
steps to a child process and returns the records that have come back. The child is a plain
``python -m opacus_lastiterate.callbacks._evaluation_child`` started with
:class:`subprocess.Popen` (not a ``multiprocessing`` start method: those import the user's
``__main__`` again, and a training script without an ``if __name__ == "__main__"`` guard
would train a second time in the child). It runs an
:class:`~opacus_lastiterate.callbacks.evaluator.InlineEvaluator` built on a pickled copy of
the accountant, with the same delta and cadences (``"auto"`` there means ``"doubling"``).
If the process fails, the evaluator evaluates inline from then on, with one
:class:`~opacus_lastiterate.exceptions.MonitorWarning`.

Messages are pickles over the child's stdin and stdout (a pickle stream is self-delimiting):

* parent -> child: the configuration (once, first), then ``("batch", entries, configuration)``
  (queued steps; the corrected accountant's configuration when it changed), ``("final",)``
  or ``("stop",)``;
* child -> parent: ``("ready",)`` once its monitor is built, then per request
  ``("records", [EpsilonRecord, ...], warnings, seconds)`` or
  ``("final", EpsilonRecord, warnings, seconds)``, ``warnings`` being the
  ``(message, category)`` pairs raised while computing them and ``seconds`` the time it
  took; and ``("alive",)`` every :data:`HEARTBEAT_EVERY` seconds from a thread of its own.

The child exits on ``("stop",)`` or at the end of its stdin, so it dies with its parent.
In the parent, a writer thread pickles and writes the requests and a reader thread reads
the answers into a :class:`queue.Queue`; neither blocks the training thread.

Liveness: the child counts as failed (killed, and the evaluation falls back inline, with
one warning naming why) when it has not started :data:`START_WITHIN` seconds after its
launch, when it has sent nothing for :data:`STALL_AFTER` seconds once started (stopped,
frozen or gone), or when it has answered no request for :data:`ANSWER_WITHIN` seconds plus
:data:`ANSWER_SLACK` times the longest it has taken for a request (or per step, times the
steps of its oldest unanswered request, if more): alive, but not progressing. These are checked at every hand-over on
the training thread (without waiting) and throughout every wait for an answer, so no wait
for the process is unbounded.
"""

from __future__ import annotations

import os
import pickle
import queue
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any, BinaryIO

import numpy as np

from opacus_lastiterate._warn import warn
from opacus_lastiterate.accountants import (
    RunAccountant,
)
from opacus_lastiterate.accountants.base import trim_history
from opacus_lastiterate.analysis.run import append_steps
from opacus_lastiterate.callbacks.cadence import Cadences, OverheadBudget
from opacus_lastiterate.callbacks.evaluator import (
    InlineEvaluator,
    QueuedStep,
    corrected_accountant_of,
    evaluated_state,
)
from opacus_lastiterate.callbacks.records import EpsilonRecord
from opacus_lastiterate.exceptions import MonitorWarning

_STOP = object()  # the writer thread's last request
SEND_EVERY = 10
"""While a process evaluates, the queued steps are sent to it every this many steps (at most
``flush_every``), so that little is left to wait for at the end."""
_PROTOCOL = pickle.HIGHEST_PROTOCOL

HEARTBEAT_EVERY = 0.5
"""Seconds between the started child's signs of life (sent by a thread of its own, so also
while it computes)."""
STALL_AFTER = 5.0
"""Seconds without any message from the started child after which it counts as failed
(stopped, e.g. by SIGSTOP, frozen or gone)."""
START_WITHIN = 120.0
"""Seconds after its launch by which the child must have started (imported the package and
built its monitor)."""
ANSWER_WITHIN = 60.0
"""Seconds within which the child must answer its oldest request, plus ``ANSWER_SLACK``
times the longest it has taken for a request (or per step, times the request's steps, if
more); counted from the latest of the request's sending, the previous answer and the child's
start."""
ANSWER_SLACK = 4.0
"""See :data:`ANSWER_WITHIN`."""
_POLL = 0.1  # seconds between liveness checks while waiting for an answer
_CONFIRM = 1.0  # seconds to wait for a sign of life already sent before declaring a stall


# -- the parent's side ----------------------------------------------------------------------


def usable_cores() -> int:
    """The CPU cores this process may run on (``evaluation="auto"`` moves the evaluation to
    a separate process only when there are at least two)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


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
    stdout: BinaryIO,
    inbox: queue.Queue[Any],
    ready: threading.Event,
    ended: threading.Event,
    heard: _Heard,
) -> None:
    """Reader thread: unpickle the child's answers into ``inbox`` until its stdout ends
    (each message, signs of life included, noted in ``heard``)."""
    try:
        while True:
            msg = pickle.load(stdout)
            heard.note()
            if msg[0] == "ready":
                ready.set()
            elif msg[0] != "alive":
                inbox.put(msg)
    except EOFError:
        inbox.put(("dead", "it ended"))
    except Exception as exc:  # a truncated or unreadable answer
        inbox.put(("dead", f"reading from it failed: {type(exc).__name__}: {exc}"))
    finally:
        stdout.close()
        ended.set()
        ready.set()


class _Heard:
    """When the child was last heard from (any message), with a wait for the next one."""

    def __init__(self) -> None:
        self.at = time.monotonic()
        self._condition = threading.Condition()

    def note(self) -> None:
        with self._condition:
            self.at = time.monotonic()
            self._condition.notify_all()

    def silent_for(self, seconds: float) -> bool:
        """Whether nothing was heard for ``seconds``, after waiting up to ``_CONFIRM`` for a
        message (one sent while this process, not the child, was held up)."""
        with self._condition:
            if time.monotonic() - self.at <= seconds:
                return False
            self._condition.wait(_CONFIRM)
            return time.monotonic() - self.at > seconds


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
        process.kill()  # SIGKILL: it also ends a stopped process, which SIGTERM does not
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
        child = "opacus_lastiterate.callbacks._evaluation_child"
        self._launched = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", child, repr(HEARTBEAT_EVERY)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self._outbox: queue.Queue[Any] = queue.Queue()
        self._inbox: queue.Queue[Any] = queue.Queue()
        self._ready = threading.Event()
        self._ended = threading.Event()
        self._heard = _Heard()
        self._outbox.put(config)
        for target, args in (
            (_write, (self.process.stdin, self._outbox, self._inbox)),
            (_read, (self.process.stdout, self._inbox, self._ready, self._ended, self._heard)),
        ):
            threading.Thread(target=target, args=args, daemon=True).start()
        # garbage-collected (with its monitor): ask the child to stop, without waiting
        self._finalizer = weakref.finalize(self, _shutdown, self.process, self._outbox, "ask")

    def send(self, request: tuple[Any, ...]) -> None:
        """Queue a request (never blocks; a failure shows as a ``("dead", reason)`` answer)."""
        self._outbox.put(request)

    def receive(self, timeout: float) -> tuple[Any, ...] | None:
        """The next answer: ``("records", ...)``, ``("final", ...)`` or ``("dead", reason)``;
        None if there is none within ``timeout`` seconds (0: none waiting)."""
        try:
            if timeout <= 0:
                return self._inbox.get_nowait()  # type: ignore[no-any-return]
            return self._inbox.get(timeout=timeout)  # type: ignore[no-any-return]
        except queue.Empty:
            return None

    def stalled(self) -> str | None:
        """Why the child counts as failed for lack of a sign of life (module docs), or
        None."""
        if not self._ready.is_set():
            if time.monotonic() - self._launched > START_WITHIN:
                return f"it had not started {START_WITHIN:g} s after its launch"
            return None
        if self._heard.silent_for(STALL_AFTER):
            return f"no sign of life for {STALL_AFTER:g} s: it is stopped, frozen or unreachable"
        return None

    @property
    def starting(self) -> bool:
        """Whether the child is still starting (not ready, not ended)."""
        return not self._ready.is_set()

    def wait_ready(self, timeout: float | None) -> bool:
        """Wait until the child has built its monitor; False on timeout (None: at most
        until ``START_WITHIN`` after its launch) or if it died."""
        if timeout is None:
            timeout = max(0.0, self._launched + START_WITHIN - time.monotonic())
        return self._ready.wait(timeout) and not self._ended.is_set()

    def stop(self, kill: bool = False) -> None:
        """Stop the child: ask it and wait up to 5 s (``kill``: kill it at once)."""
        self._finalizer.detach()
        _shutdown(self.process, self._outbox, "kill" if kill else "wait")


class ProcessEvaluator:
    """Evaluates in a separate process (module docs); the arguments are those of
    :class:`~opacus_lastiterate.callbacks.evaluator.InlineEvaluator`, whose cadences it uses
    if it has to evaluate inline."""

    def __init__(
        self,
        accountant: Any,
        *,
        delta: float,
        cadences: Cadences,
        corrected: RunAccountant | None = None,
        overhead: OverheadBudget | None = None,
        dropped: int = 0,
        rdp: Sequence[float] | np.ndarray | None = None,
        last_lr: float | None = None,
    ) -> None:
        self._accountant = accountant
        self.delta = delta
        self.cadences = cadences
        self._own_corrected = corrected
        self._corrected = corrected_accountant_of(accountant, corrected)
        self._overhead = overhead
        self.history, self.evaluated, self.rdp = evaluated_state(
            trim_history(accountant.history, dropped), rdp
        )
        self.last_lr = last_lr
        # batches sent and not answered, with the RDP vector and the learning rate before each
        self._in_flight: list[tuple[list[QueuedStep], np.ndarray, float | None]] = []
        self._warnings: list[tuple[str, type[Warning]]] = []  # raised in the child
        self._configuration: Any = None  # the corrected accountant's, as last sent
        self._waiting_since = 0.0  # the oldest request's sending, or the last answer since
        self._longest = self._per_step = 0.0  # seconds the child took: a request, a step
        self._inline: InlineEvaluator | None = None  # after a failure
        self._worker: EvaluationWorker | None = None
        self._failure = ""
        if not self._start(dropped):
            self._fall_back(self._failure, [])

    # -- the Evaluator protocol -------------------------------------------------------------

    @property
    def rdp_vector(self) -> np.ndarray:
        return self._inline.rdp_vector if self._inline is not None else self.rdp.rdp

    @property
    def in_flight(self) -> int:
        return sum(len(b[0]) for b in self._in_flight)

    @property
    def offloads(self) -> bool:
        """Whether a process evaluates (False once it failed, or after :meth:`close`)."""
        return self._worker is not None

    @property
    def worker(self) -> EvaluationWorker | None:
        """The running process (None after a failure or :meth:`close`)."""
        return self._worker

    def wait_ready(self, timeout: float | None) -> bool:
        if self._worker is None:
            return False
        return self._worker.wait_ready(timeout)

    def evaluate(
        self, queue: list[QueuedStep], out: list[EpsilonRecord] | None = None
    ) -> list[EpsilonRecord]:
        out = [] if out is None else out
        if self._inline is not None:
            return self._sync_inline(self._inline.evaluate(queue, out=out))
        if queue and self._worker is None:  # closed by finish(): training went on
            if not self._start(dropped=len(queue)):  # queue: evaluated inline from now on
                return self._sync_inline(self._fall_back(self._failure, queue, out))
        self._send(queue)
        out.extend(self._collect(wait=False))
        return out

    def drain(self) -> list[EpsilonRecord]:
        return self._collect(wait=True)

    def final_record(self) -> EpsilonRecord:
        if self._inline is None and self._worker is not None:
            self._worker.send(("final",))
            self._waiting_since = time.monotonic()
            answer = self._answer(wait=True, steps=0)
            assert answer is not None
            if answer[0] == "final":
                self._warnings.extend(answer[2])
                self._reissue_warnings()
                return answer[1]  # type: ignore[no-any-return]
            self._fall_back(answer[1], [])
        elif self._inline is None:
            self._fall_back("it was stopped", [])
        assert self._inline is not None
        return self._inline.final_record()

    def evaluate_inline_unless_started(self) -> list[EpsilonRecord] | None:
        """If the process is still starting (importing), stop it and evaluate inline from
        now on: the records of the steps sent to it, or None if it has started (or ended)
        (``evaluation="auto"`` at the end of a run too short for the process to pay off: no
        warning, it is not a failure)."""
        if self._worker is None or not self._worker.starting:
            return None
        return self._fall_back("", [], quiet=True)

    def close(self, kill: bool = False) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop(kill)

    # -- the process ------------------------------------------------------------------------

    def _start(self, dropped: int) -> bool:
        """Start a process at the evaluated state (the accountant without its last
        ``dropped`` steps); False if it could not be started (the reason in
        ``_failure``)."""
        config = {
            "accountant": self._accountant,
            "corrected": self._own_corrected,
            "dropped": dropped,
            "delta": self.delta,
            "cadences": self.cadences.off_thread(),
            "rdp": self.rdp.rdp,
            "last_lr": self.last_lr,
        }
        try:
            self._worker = EvaluationWorker(pickle.dumps(config, protocol=_PROTOCOL))
            self._configuration = None
            return True
        except Exception as exc:  # accounting must never stop training
            self._failure = f"it could not be started: {type(exc).__name__}: {exc}"
            return False

    def _send(self, queue: list[QueuedStep]) -> None:
        """Send ``queue``; the history, the RDP vector and the learning rate move on at once
        (a checkpoint needs nothing more)."""
        if not queue:
            return
        assert self._worker is not None
        if not self._in_flight:
            self._waiting_since = time.monotonic()
        self._in_flight.append((queue, self.rdp.rdp, self.last_lr))
        self.rdp.advance([(sigma, q) for _, sigma, q, _, _ in queue], self.delta)
        for _, sigma, q, _, _ in queue:
            append_steps(self.history, sigma, q)
        self.evaluated += len(queue)
        self.last_lr = queue[-1][3]
        configuration = None
        if self._corrected is not None:
            current = self._corrected.state_dict().get("configuration")
            if current != self._configuration:
                configuration = self._configuration = current
        self._worker.send(("batch", queue, configuration))

    def _collect(self, wait: bool) -> list[EpsilonRecord]:
        """The records of the answered batches (``wait``: until every sent step is
        answered)."""
        out: list[EpsilonRecord] = []
        while self._worker is not None and self._in_flight:
            answer = self._answer(wait, steps=len(self._in_flight[0][0]))
            if answer is None:
                break
            if answer[0] != "records":
                out.extend(self._fall_back(answer[1], []))
                break
            _, records, caught, seconds = answer
            batch = self._in_flight.pop(0)[0]
            self._longest = max(self._longest, seconds)
            self._per_step = max(self._per_step, seconds / len(batch))
            self._waiting_since = time.monotonic()
            out.extend(records)
            self._warnings.extend(caught)
        self._reissue_warnings()
        return out

    def _answer(self, wait: bool, steps: int) -> tuple[Any, ...] | None:
        """The process's next answer, or ``("dead", reason)`` once it counts as failed
        (module docs: checked while waiting); None if there is none yet and not ``wait``
        (the oldest request has ``steps`` steps)."""
        worker = self._worker
        assert worker is not None
        while True:
            answer = worker.receive(_POLL if wait else 0.0)
            if answer is not None:
                return answer
            reason = worker.stalled()
            now = time.monotonic()
            if worker.starting:  # bounded by START_WITHIN; answers are counted from then on
                self._waiting_since = now
            allowed = ANSWER_WITHIN + ANSWER_SLACK * max(self._longest, self._per_step * steps)
            waited = now - self._waiting_since
            if reason is None and waited > allowed:
                reason = f"it answered no request for {waited:.0f} s (allowed: {allowed:.0f} s)"
            if reason is not None:
                return ("dead", reason)
            if not wait:
                return None

    def _reissue_warnings(self) -> None:
        """Warn here what the evaluation process warned (the user's filters apply)."""
        caught, self._warnings = self._warnings, []
        for message, category in caught:
            warn(message, category)

    def _fall_back(
        self,
        reason: str,
        pending: list[QueuedStep],
        out: list[EpsilonRecord] | None = None,
        quiet: bool = False,
    ) -> list[EpsilonRecord]:
        """The process failed (``quiet``: was stopped): evaluate inline from now on. The
        steps sent and not answered (and ``pending``) are evaluated again here, from the
        accountant's state without them; their records are returned."""
        self.close(kill=True)
        if not quiet:
            warn(
                f"PrivacyMonitor: the evaluation process failed ({reason}) and was ended; the "
                "records are computed on the training thread from now on "
                "(evaluation='inline'), those it had not returned included.",
                MonitorWarning,
            )
        unanswered = [entry for batch, _, _ in self._in_flight for entry in batch]
        if self._in_flight:
            _, rdp, self.last_lr = self._in_flight[0]
            self._in_flight = []
        else:
            rdp = self.rdp.rdp
        self._inline = InlineEvaluator(
            self._accountant,
            delta=self.delta,
            cadences=self.cadences,
            corrected=self._corrected,
            overhead=self._overhead,
            dropped=len(unanswered) + len(pending),
            rdp=rdp,
            last_lr=self.last_lr,
        )
        return self._sync_inline(self._inline.evaluate(unanswered + pending, out=out))

    def _sync_inline(self, records: list[EpsilonRecord]) -> list[EpsilonRecord]:
        """Mirror the inline evaluator's progress (what the monitor reads from here)."""
        assert self._inline is not None
        self.evaluated, self.last_lr = self._inline.evaluated, self._inline.last_lr
        return records
