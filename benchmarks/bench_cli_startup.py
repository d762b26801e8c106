"""Start-up and wall time of the command line, as a ratio to a bare numpy + scipy import.

First the ratio the README quotes: ``opacus-lastiterate epsilon --steps 1000 --sample-rate
0.01 --noise-multiplier 1 --delta 1e-5`` against ``python -c "import numpy, scipy.special"``,
each run ``--repeats`` times in a fresh interpreter, interleaved round by round so that a
change of load hits all three alike (medians):

* cold: the on-disk answer cache off (``OPACUS_LASTITERATE_CACHE_DIR=off``): imports the
  analysis and dp_accounting (with ``scipy.signal`` and ``scipy.stats``) and composes the PLD;
* warm: the same configuration asked again (``opacus_lastiterate/cli/_cache.py``): the answer
  is read back without importing the analysis or dp_accounting.

Then the median wall time of other command lines beside ``python -c pass`` (the interpreter
alone) and the import of click and of typer (the two CLI libraries considered).
The command exits with status 1 when the warm ratio exceeds ``--max-ratio`` (default 3).

    python benchmarks/bench_cli_startup.py [--repeats 7] [--max-ratio 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EPSILON = ["epsilon", "--steps", "1000", "--sample-rate", "0.01", "--noise-multiplier", "1",
           "--delta", "1e-5"]
LINES = {
    "python -c pass": ["-c", "pass"],
    "import click": ["-c", "import click"],
    "import typer": ["-c", "import typer"],
    "import opacus_lastiterate (root)": ["-c", "import opacus_lastiterate"],
    "import opacus_lastiterate.cli": ["-c", "import opacus_lastiterate.cli"],
    "opacus-lastiterate --help": ["-m", "opacus_lastiterate", "--help"],
    "opacus-lastiterate --version": ["-m", "opacus_lastiterate", "--version"],
    "opacus-lastiterate epsilon (T = 1000, no cache)": ["-m", "opacus_lastiterate", *EPSILON],
    "opacus-lastiterate epsilon --json (no cache)": ["-m", "opacus_lastiterate", *EPSILON,
                                                     "--json"],
}


def wall(args: list[str], repeats: int, **env_extra: str) -> float | None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                                     os.environ.get("PYTHONPATH")])),
               **env_extra)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, *args], env=env, capture_output=True)
        times.append(time.perf_counter() - t0)
        if done.returncode != 0:
            return None
    return statistics.median(times)


def epsilon_ratios(repeats: int) -> dict[str, float]:
    """Median wall times of the bare import and of the cold and warm ``epsilon``,
    interleaved."""
    lines = {"bare": (["-c", "import numpy, scipy.special"], {}),
             "cold": (["-m", "opacus_lastiterate", *EPSILON],
                      {"OPACUS_LASTITERATE_CACHE_DIR": "off"})}
    with tempfile.TemporaryDirectory() as cache:
        lines["warm"] = (["-m", "opacus_lastiterate", *EPSILON],
                         {"OPACUS_LASTITERATE_CACHE_DIR": cache})
        assert wall(lines["warm"][0], 1, **lines["warm"][1]) is not None  # fills the cache
        times: dict[str, list[float]] = {name: [] for name in lines}
        for _ in range(repeats):
            for name, (args, env) in lines.items():
                t = wall(args, 1, **env)
                assert t is not None, f"{name} failed"
                times[name].append(t)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--max-ratio", type=float, default=3.0)
    args = parser.parse_args()
    print(f"median of {args.repeats} runs, os.cpu_count() = {os.cpu_count()}")
    med = epsilon_ratios(args.repeats)
    print(f"{'command':<58} {'wall (s)':>9} {'ratio':>7}")
    bare = 'python -c "import numpy, scipy.special"'
    print(f"{bare:<58} {med['bare']:>9.3f} {1:>7.2f}")
    for name in ("cold", "warm"):
        what = f"opacus-lastiterate epsilon (T = 1000), {name} cache"
        print(f"{what:<58} {med[name]:>9.3f} {med[name] / med['bare']:>7.2f}")
    warm_ratio = med["warm"] / med["bare"]
    print(f"ratio epsilon/bare: cold {med['cold'] / med['bare']:.2f}, warm {warm_ratio:.2f} "
          f"(limit {args.max_ratio:g} for the warm call)\n")

    base = wall(LINES["python -c pass"], args.repeats)
    assert base is not None
    print(f"{'command':<40} {'wall (s)':>9} {'minus python (ms)':>18}")
    for name, line in LINES.items():
        t = base if name == "python -c pass" else wall(line, args.repeats,
                                                         OPACUS_LASTITERATE_CACHE_DIR="off")
        if t is None:
            print(f"{name:<40} {'not installed / failed':>28}")
            continue
        print(f"{name:<40} {t:>9.3f} {1000 * (t - base):>18.0f}")
    return 0 if warm_ratio <= args.max_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
