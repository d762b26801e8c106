"""The Ray backend of the audit runner: one Ray task per run, retried when its worker
process or node dies (``docs/auditing.md``, "Running on a Ray cluster"). Ray is imported
only when this backend runs (extra ``opacus-lastiterate[ray]``).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import Any

from opacus_lastiterate.auditing.runner.contract import (
    ScoreFunction,
    Task,
    TrainFunction,
    _execute_run,
    _init_worker,
)

__all__: list[str] = []


def _execute_ray_run(
    train: TrainFunction,
    score: ScoreFunction,
    index: int,
    seed: int,
    include_canary: bool,
    threads: int,
) -> tuple[int, float]:
    """One run as a Ray task: set the worker's threads, then train and score."""
    _init_worker(threads)
    return _execute_run(train, score, index, seed, include_canary)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            "backend='ray' needs Ray, which is not installed: pip install opacus-lastiterate[ray]"
        ) from exc
    return ray


_RAY_DEFAULT_IN_FLIGHT = 1000  # runs submitted at once when `workers` is None


def _ray(
    train: TrainFunction,
    score: ScoreFunction,
    tasks: Sequence[Task],
    in_flight: int | None,
    options: Mapping[str, Any],
    threads: int,
) -> Generator[tuple[int, float], None, None]:
    """One Ray task per run; results in completion order.

    ``options`` (``num_cpus``, ``num_gpus``, ``max_retries``) go to ``.options()``: Ray
    schedules a run where its resources are free and re-executes it, up to ``max_retries``
    times, when its worker process or node dies. Exceptions raised by ``train`` or ``score``
    are not retried (a deterministic run would fail again).
    """
    ray = _import_ray()
    if not ray.is_initialized():
        ray.init()  # honours RAY_ADDRESS; call ray.init(...) yourself to pick a cluster
    remote = ray.remote(_execute_ray_run).options(retry_exceptions=False, **options)
    train_ref, score_ref = ray.put(train), ray.put(score)
    window = min(len(tasks), _RAY_DEFAULT_IN_FLIGHT if in_flight is None else max(1, in_flight))
    queue = list(reversed(tasks))
    pending: dict[Any, Task] = {}
    try:
        while queue or pending:
            while queue and len(pending) < window:
                i, s, c = queue.pop()
                pending[remote.remote(train_ref, score_ref, i, s, c, threads)] = (i, s, c)
            done, _ = ray.wait(list(pending), num_returns=1)
            i, s, _c = pending.pop(done[0])
            try:
                result = ray.get(done[0])
            except ray.exceptions.RayTaskError as exc:  # raised by train or score
                cause = getattr(exc, "cause", None) or exc
                raise RuntimeError(f"run {i} (seed {s}) failed: {cause!r}") from exc
            except ray.exceptions.RayError as exc:  # the worker, its node or Ray failed
                raise RuntimeError(
                    f"run {i} (seed {s}) failed in Ray ({options['max_retries']} retries "
                    f"allowed, max_retries): {exc}. The finished runs are recorded: with a "
                    "record `path`, running the audit again resumes."
                ) from exc
            yield result
    finally:
        for ref in pending:
            ray.cancel(ref)
