"""The JSONL log of a default PrivacyMonitor over 300 steps of SGD momentum 0.9 with a
cosine schedule, each step padded to 20 ms with a busy-wait (standing in for GPU work):
``docs/results/every_step_heuristic.jsonl``. It shows one row per step (the final record
replaces step 300's row) and which steps carry ``heuristic_epsilon``: the default monitor
solves the weighted heuristic of each flushed batch together, on the training thread, and
every row has one when a batch fits in its overhead budget (1% of the training time).

    python benchmarks/every_step_log.py [--out PATH] [--steps 300] [--step-ms 20]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_every_step_heuristic import _train

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results" / "every_step_heuristic.jsonl")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--step-ms", type=float, default=20.0)
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.out.exists():
        args.out.unlink()
    _train(args.steps, args.step_ms / 1e3, True, True, args.out)
    rows = [json.loads(line) for line in args.out.read_text().splitlines()]
    steps = [r["step"] for r in rows]
    with_heuristic = [r["step"] for r in rows if r["heuristic_epsilon"] is not None]
    print(f"{len(rows)} rows, steps {steps[0]}..{steps[-1]}, distinct: {len(set(steps)) == len(steps)}; "
          f"heuristic on {len(with_heuristic)} rows; final row: step {rows[-1]['step']}, "
          f"final={rows[-1]['final']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
