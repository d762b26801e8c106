"""Start-up and wall time of the command line, and what its CLI library costs.

Runs each command line ``--repeats`` times in a fresh interpreter (this checkout first on
the path) and prints the median wall time, beside ``python -c pass`` (the interpreter alone)
and the import of click and of typer (with the rich it can pull in), the two CLI libraries
considered. The pure-math ``epsilon`` should stay under about a second; most of it is the
import of dp_accounting and one PLD composition, not the CLI.

    python benchmarks/bench_cli_startup.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
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
    "opacus-lastiterate epsilon (T = 1000)": ["-m", "opacus_lastiterate", *EPSILON],
    "opacus-lastiterate epsilon --json": ["-m", "opacus_lastiterate", *EPSILON, "--json"],
}


def wall(args: list[str], repeats: int) -> float | None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                                     os.environ.get("PYTHONPATH")])))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, *args], env=env, capture_output=True)
        times.append(time.perf_counter() - t0)
        if done.returncode != 0:
            return None
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    base = wall(LINES["python -c pass"], args.repeats)
    assert base is not None
    print(f"median of {args.repeats} runs, os.cpu_count() = {os.cpu_count()}")
    print(f"{'command':<40} {'wall (s)':>9} {'minus python (ms)':>18}")
    for name, line in LINES.items():
        t = base if name == "python -c pass" else wall(line, args.repeats)
        if t is None:
            print(f"{name:<40} {'not installed / failed':>28}")
            continue
        print(f"{name:<40} {t:>9.3f} {1000 * (t - base):>18.0f}")


if __name__ == "__main__":
    main()
