"""Noise changing every step: the time of each privacy value, ours against a reference route.

The run is ``DPSGDRun.from_history([(sigma_t, q, 1) for t in range(T)])`` (one segment per
step, as Opacus's ``ExponentialNoise`` scheduler records it) with sigma_t = 0.999^t for
T = 300 and 2,000, and sigma_t = 0.99999^t for T = 100,000 (heuristic and robust only: the
noise stays above 0.36), q = 0.01, delta = 1e-5. Values and reference routes:

* ``standard_rdp``: :class:`RDPComposition` against dp_accounting's ``RdpAccountant``
  composing one ``PoissonSampledDpEvent`` per segment;
* ``standard``: :class:`StandardComposition` (PLD, interval 1e-4) with ``noise_grouping=0``
  and no work bound (every step its own PLD) against dp_accounting's ``PLDAccountant``
  composing the same events; ``standard default``: the model at its defaults (at most
  ``max_groups`` = 128 one-step PLDs, ``bounded_groups``), its settings and its excess over
  the exact value;
* ``robust_heuristic``: :class:`RobustLastIterateHeuristic` against the brute-force maximum
  of the heuristic over every suffix;
* ``heuristic``: :class:`LastIterateHeuristic` (no reference: it is one pair for any T).

A reference is run where ``T <= --reference-max-<value>`` (defaults: about a minute or two
each on one core), else reported as skipped. The standard value itself is computed up to
``--standard-max`` (1,000): as sigma_t falls to 0.135 at T = 2,000 the one-step PLD grid
grows from 57,000 points (sigma = 1) to 950,000, and the composition with it. Prints seconds per value, the ratio
reference / ours and the relative difference of the two values.

``--incremental K`` adds, for each T of ``--sizes``, the standard value asked on the growing
run every K steps (as a monitor asks it; each call composes only the steps added since the
last, ``pld_composition.incremental_pld``): the total seconds of all the calls, the slowest
call and the last one (the final record after K more steps), for each noise grouping of
``--incremental-grouping`` (default :data:`DEFAULT_NOISE_GROUPING`, 1e-3, the model's
default); ``--noise-grouping G ...`` adds
the standard value with the noise multipliers grouped within a factor 1 + G
(``StandardComposition(noise_grouping=G, max_groups=None)``, an upper bound) and its excess
over the exact one. ``--decay D`` sets sigma_t = D^t for ``--sizes`` (default 0.999).
``--rate-growth G`` makes the sample rate change instead: q_t = q (1 + G t / T) at sigma 1,
for ``--sizes`` and ``--robust-sizes``.

    python benchmarks/bench_changing_noise.py [--sizes 300 2000] [--robust-sizes 100000]
    python benchmarks/bench_changing_noise.py --sizes 2000 --robust-sizes --decay 0.9999 \
        --incremental 10 --noise-grouping 0.001 0.01
    python benchmarks/bench_changing_noise.py --sizes 2000 10000 --robust-sizes 100000 \
        --rate-growth 1 --standard-max 0 --reference-max-standard-rdp 0
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import dp_accounting
from dp_accounting.rdp import RdpAccountant

from opacus_lastiterate.analysis.baselines.composition import (
    DEFAULT_NOISE_GROUPING,
    RDPComposition,
    StandardComposition,
)
from opacus_lastiterate.analysis.baselines.pld_composition import (
    clear_kept_compositions,
    group_noise,
)
from opacus_lastiterate.analysis.last_iterate.heuristic import (
    LastIterateHeuristic,
    RobustLastIterateHeuristic,
)
from opacus_lastiterate.analysis.run import DPSGDRun

Q, DELTA, INTERVAL = 0.01, 1e-5, 1e-4
REFERENCE_MAX = {"standard_rdp": 2000, "standard": 300, "robust_heuristic": 300}
STANDARD_MAX = 1000  # beyond, sigma_t = 0.999^t falls below 0.37 and one-step PLD grids pass 250k points


def history(
    steps: int, decay: float | None = None, rate_growth: float = 0.0
) -> list[tuple[float, float, int]]:
    if rate_growth:
        return [(1.0, Q * (1 + rate_growth * t / steps), 1) for t in range(steps)]
    if decay is None:
        decay = 0.999 if steps <= 10_000 else 0.99999
    return [(decay**t, Q, 1) for t in range(steps)]


def events(h: list[tuple[float, float, int]]):
    for sigma, q, n in h:
        yield dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), n


def ref_rdp(h) -> float:
    acc = RdpAccountant()
    for event, n in events(h):
        acc.compose(event, n)
    return acc.get_epsilon(DELTA)


def ref_pld(h) -> float:
    acc = dp_accounting.pld.PLDAccountant(
        dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=INTERVAL
    )
    for event, n in events(h):
        acc.compose(event, n)
    return acc.get_epsilon(DELTA)


def ref_robust(h) -> float:
    return max(LastIterateHeuristic(h[len(h) - t :]).epsilon(DELTA) for t in range(1, len(h) + 1))


def timed(fn: Callable[[], float]) -> tuple[float, float]:
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def row(name: str, steps: int, ours: Callable[[], float], ref: Callable[[], float] | None,
        limit: int) -> None:
    t_ours, v_ours = timed(ours)
    if ref is None:
        tail = f"{'(none)':>12} {'':>8} {'':>10}"
    elif steps > limit:
        tail = f"{'skipped':>12} {'':>8} {'':>10}"
    else:
        t_ref, v_ref = timed(ref)
        tail = f"{t_ref:>12.3f} {t_ref / t_ours:>8.1f} {abs(v_ours / v_ref - 1):>10.1e}"
    print(f"{name:<17} {steps:>7} {v_ours:>10.5f} {t_ours:>10.3f} {tail}", flush=True)


def exact_standard(run: DPSGDRun) -> float:
    """The standard value without grouping or work bound: dp_accounting's composition of
    every step."""
    return StandardComposition(run, noise_grouping=0.0, max_groups=None).epsilon(DELTA)


def clear_cache() -> None:
    clear_kept_compositions()  # each value timed from a cold start


def incremental(h: list[tuple[float, float, int]], every: int, grouping: float) -> None:
    """The standard value of the growing run asked every ``every`` steps."""
    clear_cache()
    times = []
    for end in list(range(every, len(h), every)) + [len(h)]:
        t, v = timed(lambda end=end: StandardComposition(
            h[:end], noise_grouping=grouping).epsilon(DELTA))
        times.append(t)
    print(f"{f'every {every}, g={grouping:g}':<17} {len(h):>7} {v:>10.5f} {sum(times):>10.3f} "
          f"total of {len(times)} calls; slowest {max(times):.3f} s, last {times[-1]:.3f} s",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[300, 2000])
    parser.add_argument("--robust-sizes", type=int, nargs="*", default=[100_000])
    parser.add_argument("--standard-max", type=int, default=STANDARD_MAX,
                        help="largest T at which the standard (PLD) value is computed at all")
    for name, limit in REFERENCE_MAX.items():
        parser.add_argument(f"--reference-max-{name.replace('_', '-')}", type=int, default=limit)
    parser.add_argument("--decay", type=float, default=None)
    parser.add_argument("--rate-growth", type=float, default=0.0, metavar="G")
    parser.add_argument("--incremental", type=int, default=0, metavar="K")
    parser.add_argument("--noise-grouping", type=float, nargs="*", default=[], metavar="G")
    parser.add_argument("--incremental-grouping", type=float, nargs="*",
                        default=[DEFAULT_NOISE_GROUPING],
                        metavar="G", help="the noise_grouping of the --incremental rows")
    args = parser.parse_args()
    limits = {n: getattr(args, f"reference_max_{n}") for n in REFERENCE_MAX}
    warm = DPSGDRun.from_history([(1.0, Q, 1), (0.9, Q, 1)])  # imports and tables, untimed
    for model in (LastIterateHeuristic, RobustLastIterateHeuristic, RDPComposition,
                  StandardComposition):
        model(warm).epsilon(DELTA)
    print(f"q {Q}, delta {DELTA:g}, PLD interval {INTERVAL:g}; seconds per value")
    print(f"{'value':<17} {'T':>7} {'epsilon':>10} {'ours s':>10} {'reference s':>12} "
          f"{'ratio':>8} {'rel. diff':>10}")
    for steps in args.sizes:
        h = history(steps, args.decay, args.rate_growth)
        run = DPSGDRun.from_history(h)
        row("heuristic", steps, lambda: LastIterateHeuristic(run).epsilon(DELTA), None, 0)
        row("robust_heuristic", steps, lambda: RobustLastIterateHeuristic(run).epsilon(DELTA),
            lambda: ref_robust(h), limits["robust_heuristic"])
        row("standard_rdp", steps, lambda: RDPComposition(run).epsilon(DELTA),
            lambda: ref_rdp(h), limits["standard_rdp"])
        exact = None
        if steps <= args.standard_max:
            clear_cache()
            row("standard", steps, lambda: exact_standard(run),
                lambda: ref_pld(h), limits["standard"])
            exact = exact_standard(run)  # kept: no cost
        else:
            print(f"{'standard':<17} {steps:>7} skipped (--standard-max {args.standard_max})")
        clear_cache()
        default = StandardComposition(run)
        t_d, v_d = timed(lambda: default.epsilon(DELTA))
        interval, grouping, groups = default.settings
        excess = "" if exact is None else f", {v_d / exact - 1:+.2e} above exact"
        print(f"{'standard default':<17} {steps:>7} {v_d:>10.5f} {t_d:>10.3f} {groups:>8} groups "
              f"(max_groups {default.max_groups}: interval {interval:.2g}, grouping {grouping:.2g})"
              f"{excess}", flush=True)
        for g in args.noise_grouping:
            clear_cache()
            t_g, v_g = timed(lambda g=g: StandardComposition(
                run, noise_grouping=g, max_groups=None).epsilon(DELTA))
            excess = "" if exact is None else f", {v_g / exact - 1:+.2e} above exact"
            print(f"{f'standard g={g:g}':<17} {steps:>7} {v_g:>10.5f} {t_g:>10.3f} "
                  f"{len(group_noise(h, g)):>8} groups{excess}")
        if args.incremental:
            for g in args.incremental_grouping:
                incremental(h, args.incremental, g)
    for steps in args.robust_sizes:
        h = history(steps, rate_growth=args.rate_growth)
        run = DPSGDRun.from_history(h)
        row("heuristic", steps, lambda: LastIterateHeuristic(run).epsilon(DELTA), None, 0)
        row("robust_heuristic", steps, lambda: RobustLastIterateHeuristic(run).epsilon(DELTA),
            lambda: ref_robust(h), limits["robust_heuristic"])


if __name__ == "__main__":
    main()
