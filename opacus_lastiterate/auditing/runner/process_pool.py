"""The local process-pool backend of the audit runner: spawn-safe workers, and the driver's
account of why a pool broke (a killed worker, a script without the ``__main__`` guard).

Spawned pool workers import the main script; a script that starts an audit at import time
(no ``if __name__ == "__main__":`` guard) is refused in the worker with an error that says so,
and the driver names the cause when its workers die that way.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import pickle
import signal
import sys
import time
from collections.abc import Generator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from opacus_lastiterate.auditing.runner.contract import (
    ScoreFunction,
    Task,
    TrainFunction,
    _execute_run,
    _init_worker,
)

__all__: list[str] = []


# Exit status of a spawned worker that found the audit started while it imported the main
# script (see _refuse_audit_in_bootstrapping_worker); the driver turns it into its message.
_MAIN_REIMPORTED_EXIT = 86
_GUARD_HINT = (
    "Worker processes are spawned and each one imports the main script, so the code that "
    'starts the audit must sit under `if __name__ == "__main__":` (see '
    'docs/auditing.md, "Auditing your own training").'
)


def _refuse_audit_in_bootstrapping_worker() -> None:
    """Stop a spawned worker that is running the audit while it imports the main script.

    A ``spawn`` (or ``forkserver``) child imports the parent's main module before it can run
    anything; a script without the ``__main__`` guard therefore starts the audit again in
    every worker. Continuing would train in the worker or fail on the record file's lock, so
    the worker prints what happened and exits with a status the driver recognises.
    """
    if not getattr(multiprocessing.current_process(), "_inheriting", False):
        return
    module = sys.modules.get("__mp_main__") or sys.modules.get("__main__")
    main = getattr(module, "__file__", None) or "the main script"
    print(
        f"opacus_lastiterate: AuditRunner.run() was called while this worker process was "
        f"importing {main} (before it could run anything): the script starts an audit when "
        f"it is imported. {_GUARD_HINT}",
        file=sys.stderr,
        flush=True,
    )
    raise SystemExit(_MAIN_REIMPORTED_EXIT)


class _TrackedSpawnContext(multiprocessing.context.SpawnContext):
    """The ``spawn`` context, remembering the processes it creates (to read exit codes)."""

    def __init__(self) -> None:
        super().__init__()
        self.processes: list[multiprocessing.context.SpawnProcess] = []

    def Process(  # type: ignore[override]
        self, *args: Any, **kwargs: Any
    ) -> multiprocessing.context.SpawnProcess:
        proc = multiprocessing.context.SpawnProcess(*args, **kwargs)
        self.processes.append(proc)
        return proc


def _settled_exit_codes(ctx: _TrackedSpawnContext, timeout: float = 10.0) -> list[int | None]:
    """The workers' exit codes once every worker has exited (the executor terminates the
    others once one has died), or at ``timeout``. Polled: the executor's own thread may be
    reaping a worker at the same moment, and then this thread reads no code until that
    thread has stored it."""
    deadline = time.monotonic() + timeout
    while True:
        for proc in ctx.processes:
            proc.join(timeout=0.1)
        codes = [p.exitcode for p in ctx.processes]
        if all(c is not None for c in codes) or time.monotonic() > deadline:
            return codes


def _broken_pool_message(ctx: _TrackedSpawnContext, task: Task) -> str:
    """What stopped the pool: the exit codes of its dead workers, in words."""
    codes = _settled_exit_codes(ctx)
    index, seed, _ = task
    if _MAIN_REIMPORTED_EXIT in codes:
        main = getattr(sys.modules.get("__main__"), "__file__", None) or "the main script"
        return (
            f"the worker processes stopped while importing {main}: that script starts the "
            f"audit when it is imported, so every worker started it again. {_GUARD_HINT}"
        )
    # the executor terminates the other workers (SIGTERM) once one has died
    died = [c for c in codes if c not in (None, 0, -signal.SIGTERM)] or [
        c for c in codes if c not in (None, 0)
    ]
    if not died:
        cause = "a worker process died"
    elif died[0] < 0:
        sig = signal.Signals(-died[0]).name
        cause = f"a worker process was killed by {sig}" + (
            " (killed from outside, or by the out-of-memory killer)" if sig == "SIGKILL" else ""
        )
    else:
        cause = (
            f"a worker process exited with status {died[0]} outside a run (while starting, or "
            "by os._exit or a crash in native code; its output above says more)"
        )
    return (
        f"{cause}; the pool cannot go on, so run {index} (seed {seed}) and the other unfinished "
        "runs were not recorded. The finished runs are: with a record `path`, running the "
        "audit again resumes."
    )


def _process_pool(
    train: TrainFunction,
    score: ScoreFunction,
    tasks: Sequence[Task],
    workers: int,
    threads: int,
) -> Generator[tuple[int, float], None, None]:
    ctx = _TrackedSpawnContext()
    pool = ProcessPoolExecutor(
        max_workers=workers, mp_context=ctx, initializer=_init_worker, initargs=(threads,)
    )
    try:
        futures: dict[Future[tuple[int, float]], Task] = {
            pool.submit(_execute_run, train, score, i, s, c): (i, s, c) for i, s, c in tasks
        }
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in sorted(done, key=lambda f: futures[f][0]):
                exc = fut.exception()
                if isinstance(exc, BrokenProcessPool):
                    raise RuntimeError(_broken_pool_message(ctx, futures[fut])) from exc
                if exc is not None:
                    i, s, _ = futures[fut]
                    raise RuntimeError(f"run {i} (seed {s}) failed: {exc!r}") from exc
                yield fut.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _check_picklable(name: str, obj: Any) -> None:
    try:
        pickle.dumps(obj)
    except Exception as exc:
        raise TypeError(
            f"`{name}` must be picklable (a top-level function or an instance of a top-level "
            f"class) to run in worker processes, got {obj!r} ({exc}). Use workers=0 to run "
            "in this process."
        ) from exc
