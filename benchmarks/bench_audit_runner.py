"""Benchmark: audit runs per hour on one CPU for the digits audit, per runner backend.

The training function is the one of ``examples/audit_digits.py`` with its defaults
(``OpacusDigitsTrainer``: softmax regression on 400 digits, T = 50 DP-SGD steps, B = 64,
sigma = 0.5, gradient canary). Each backend trains ``--runs`` models from a standing start
(worker start-up and imports included) on one CPU:

* ``serial``: in this process (``workers=0``), one intra-op thread: the cost of a run alone;
* ``process``: the local process pool with one worker (``workers=1``, one thread);
* ``ray``: a local one-CPU Ray cluster (``ray.init(num_cpus=1)``), ``cpus_per_run=1``;
  skipped with a note when Ray is not installed.

It prints wall-clock seconds, runs per hour of wall-clock time, each backend's rate relative
to ``serial``, and runs per CPU-hour from the CPU time of this process and its pool workers
(what one dedicated CPU would sustain; not available for Ray's workers). On a shared
machine the wall-clock rates fall with the load (printed), the CPU-time rate much less.

    python benchmarks/bench_audit_runner.py [--runs N] [--backends serial,process,ray]
"""

from __future__ import annotations

import argparse
import os
import time

try:
    import resource
except ImportError:  # pragma: no cover - Windows
    resource = None  # type: ignore[assignment]

import torch

from opacus_lastiterate.auditing import AuditRunner, OpacusDigitsTrainer


def _cpu_seconds() -> float:
    """CPU time of this process and of its waited-for children (pool workers)."""
    own = time.process_time()
    if resource is None:  # pragma: no cover - Windows
        return own
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own + children.ru_utime + children.ru_stime


def time_backend(backend: str, trainer: OpacusDigitsTrainer, runs: int) -> tuple[float, float]:
    """Wall-clock and CPU seconds to train and score ``runs`` models with ``backend``
    (CPU seconds count this process and the pool's workers, not Ray's)."""
    options: dict = {"workers": 0}
    if backend == "process":
        options = {"workers": 1, "threads_per_worker": 1}
    elif backend == "ray":
        options = {"backend": "ray", "cpus_per_run": 1}
    runner = AuditRunner(trainer, trainer.score, num_runs=runs, seed=0, progress=False, **options)
    start, cpu = time.perf_counter(), _cpu_seconds()
    records = runner.run()
    assert len(records) == runs
    return time.perf_counter() - start, _cpu_seconds() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60, help="models per backend")
    parser.add_argument("--backends", default="serial,process,ray")
    args = parser.parse_args()
    torch.set_num_threads(1)
    trainer = OpacusDigitsTrainer(steps=50, noise_multiplier=0.5)
    backends = args.backends.split(",")
    if "ray" in backends:
        # A one-node cluster on this machine: keep Ray on the loopback interface (read when
        # Ray is imported).
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        try:
            import ray
        except ImportError:
            print("ray: not installed (pip install opacus-lastiterate[ray]); skipped")
            backends.remove("ray")
        else:
            ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"digits audit (examples/audit_digits.py defaults: T = {trainer.steps}, "
        f"B = {trainer.batch_size}, N = {trainer.num_examples}), {args.runs} runs per "
        f"backend on one CPU; {os.cpu_count()} CPUs, load average {load:.1f}"
    )
    print("backend     wall s   runs/hour (wall)   vs serial   runs per CPU-hour (CPU time)")
    serial = None
    for backend in backends:
        secs, cpu = time_backend(backend, trainer, args.runs)
        rate = args.runs / secs * 3600
        serial = rate if backend == "serial" else serial
        ratio = f"{rate / serial:9.2f}x" if serial else " " * 10
        per_cpu = f"{args.runs / cpu * 3600:12,.0f}" if backend != "ray" else "  (not seen)"
        print(f"{backend:<8} {secs:9.1f} {rate:17,.0f}  {ratio}  {per_cpu}")
    if "ray" in backends:
        ray.shutdown()


if __name__ == "__main__":
    main()
