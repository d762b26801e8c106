"""A long run under a schedule: the accountant's memory, state size and load time.

Records ``--steps`` steps of SGD with momentum 0.9 (or, with ``--optimizer adamw``, AdamW with
weight decay 0.01) and a cosine learning rate (a new rate at every step) into a
``LastIterateAccountant`` through ``replay_step``, as a replica of the accountant is fed,
then times the first and a second ``get_epsilon``, ``state_dict()``, its
size pickled (and the bytes of the learning-rate column per entry, that is per step whose
settings change), through ``torch.save`` and as JSON (the optimizer traces as base64 text,
as the monitor's checkpoint holds them), ``torch.load``
with ``weights_only=True``, ``load_state_dict`` into a fresh accountant (and, of it, the
validation of the stored optimizer traces) and its first query,
and checks that the loaded accountant continues with the same floats (both take three
more steps, each queried). Prints the load (``torch.load`` plus ``load_state_dict``) in all, and
the process's peak resident memory after the imports, after each stage and at the end (the
goal of issue 37: under 500 MB up to the load, state at most about 16 bytes per step whose
settings change, load under 1 s). Times are wall clock with the process's CPU seconds
beside them, and the load average is printed at the start and the end: on a shared machine
the wall time measures the neighbours too.

    python benchmarks/bench_long_run.py                    # T = 10^6, sigma 20
    python benchmarks/bench_long_run.py --steps 100000 --noise-multiplier 6
    python benchmarks/bench_long_run.py --optimizer adamw --steps 100000
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import pickle
import resource
import sys
import time
import warnings


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS


def _timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    value = fn(*args, **kwargs)
    return time.perf_counter() - t0, value


def _load_average() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--noise-multiplier", type=float, default=20.0)
    parser.add_argument("--sample-rate", type=float, default=0.0445)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    args = parser.parse_args()

    import torch

    from opacus_lastiterate.accountants import LastIterateAccountant
    from opacus_lastiterate.accountants.adaptive_trace import decode_traces
    from opacus_lastiterate.accountants.optimizer_trace import trace_as_text
    from opacus_lastiterate.analysis.last_iterate.adaptive_steps import AdaptiveStep
    from opacus_lastiterate.analysis.last_iterate.adaptive_weights import AdaptiveSettings
    from opacus_lastiterate.analysis.last_iterate.optimizer_weights import SGDSettings

    warnings.simplefilter("ignore")
    print(f"peak RSS after imports: {_peak_rss_mb():.0f} MB; {_load_average()}")
    steps, sigma, q, delta = args.steps, args.noise_multiplier, args.sample_rate, args.delta
    adamw = args.optimizer == "adamw"
    trace_key = "adaptive_trace" if adamw else "optimizer_trace"

    def settings_of(lr: float):
        if adamw:  # the noise on the averaged gradient, sigma C / B with C = 1, B = 256
            return AdaptiveStep(AdaptiveSettings("adamw", lr, weight_decay=0.01), sigma / 256)
        return SGDSettings(lr, 0.9, 0.0, False, 0.0)

    acc = LastIterateAccountant()
    t0, cpu = time.perf_counter(), time.process_time()
    base = 1e-3 if adamw else 0.05
    for t in range(steps):
        acc.replay_step(sigma, q, settings_of(base * 0.5 * (1.0 + math.cos(math.pi * t / steps))))
    replay, cpu = time.perf_counter() - t0, time.process_time() - cpu
    what = "AdamW (weight decay 0.01)" if adamw else "momentum 0.9"
    print(
        f"T = {steps:,}, sigma {sigma:g}, q {q:g}, {what} + cosine: replay_step "
        f"{replay:.1f} s ({cpu:.1f} CPU s; {replay / steps * 1e6:.1f} us a step); peak RSS "
        f"{_peak_rss_mb():.0f} MB"
    )
    cpu = time.process_time()
    first, eps = _timed(acc.get_epsilon, delta)
    cpu = time.process_time() - cpu
    again, _ = _timed(acc.get_epsilon, delta)
    print(
        f"first get_epsilon({delta:g}) {first:.2f} s ({cpu:.2f} CPU s; epsilon {eps:.4f}), "
        f"second {again * 1e3:.2f} ms; peak RSS {_peak_rss_mb():.0f} MB"
    )

    took, state = _timed(acc.state_dict)
    sizes = {key: len(pickle.dumps(value)) for key, value in state.items()}
    buffer = io.BytesIO()
    saved, _ = _timed(torch.save, state, buffer)
    pickled = len(pickle.dumps(state))
    as_json = len(json.dumps(dict(state, **{trace_key: trace_as_text(state[trace_key])})))
    lr = state[trace_key]["lr"]
    entries = len(lr["steps"]) // 8
    per_change = (len(lr["values"]) + len(lr["steps"])) / max(entries, 1)
    print(
        f"state_dict {took:.2f} s; pickled {pickled / 1e6:.1f} MB "
        f"({pickled / steps:.1f} bytes a step; {trace_key} "
        f"{sizes[trace_key] / 1e6:.1f} MB, weighted_characteristic "
        f"{sizes.get('weighted_characteristic', 0) / 1e3:.0f} kB; {entries:,} learning-rate "
        f"entries, {per_change:.1f} bytes each); torch.save "
        f"{buffer.tell() / 1e6:.1f} MB in {saved:.2f} s; JSON {as_json / 1e6:.1f} MB; peak RSS "
        f"{_peak_rss_mb():.0f} MB"
    )
    buffer.seek(0)
    cpu = time.process_time()
    read, loaded_state = _timed(torch.load, buffer, weights_only=True)
    read_cpu = time.process_time() - cpu
    fresh = LastIterateAccountant()
    load, _ = _timed(fresh.load_state_dict, loaded_state)
    cpu = time.process_time() - cpu
    loaded_rss = _peak_rss_mb()
    probe = LastIterateAccountant()  # a query changes the kept engine: asked of a copy
    probe.load_state_dict(loaded_state)
    after, eps_loaded = _timed(probe.get_epsilon, delta)
    del probe
    check_cpu = time.process_time()
    check, _ = _timed(decode_traces, loaded_state)  # of load_state_dict: the stored traces
    check_cpu = time.process_time() - check_cpu
    print(
        f"torch.load(weights_only=True) {read:.2f} s ({read_cpu:.2f} CPU s); load_state_dict "
        f"{load:.2f} s ({cpu - read_cpu:.2f} CPU s; validating the stored traces {check:.2f} s, "
        f"{check_cpu:.2f} CPU s); load in all {read + load:.2f} s ({cpu:.2f} CPU s); first "
        f"get_epsilon after loading {after * 1e3:.1f} ms (epsilon {eps_loaded:.4f}); peak RSS "
        f"after loading {loaded_rss:.0f} MB"
    )
    same = True
    for t in range(3):  # both continue: the same floats
        settings = settings_of(base * 0.01 * (t + 1))
        for a in (acc, fresh):
            a.replay_step(sigma, q, settings)
        same = same and acc.get_epsilon(delta) == fresh.get_epsilon(delta)
    print(f"the loaded accountant continues with the same floats: {same}")
    print(
        f"peak RSS at the end (three accountants of T steps alive): {_peak_rss_mb():.0f} MB; "
        f"{_load_average()}"
    )


if __name__ == "__main__":
    main()
