"""Run every example and reproduction script in its quick mode (what CI does).

    python scripts/run_examples.py --quick [--only NAME]

Each script is run as ``python SCRIPT --quick`` in a fresh process from the repository root;
where a script takes ``--out``, its outputs (tables, plots) go to ``OUT_DIR/SCRIPT_NAME``
(default ``examples/output``, ignored by git), where they stay for you to look at.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("examples", "reproductions")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="pass --quick to every script")
    parser.add_argument("--only", default=None, help="run only scripts whose name contains this")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per script")
    parser.add_argument(
        "--out-dir", type=Path, default=ROOT / "examples" / "output",
        help="folder for the scripts' outputs (one subfolder per script)",
    )
    args = parser.parse_args()
    scripts = sorted(
        p for folder in FOLDERS for p in (ROOT / folder).glob("*.py") if not p.name.startswith("_")
    )
    if args.only:
        scripts = [p for p in scripts if args.only in p.name]
    failures = []
    for script in scripts:
        cmd = [sys.executable, str(script)] + (["--quick"] if args.quick else [])
        help_text = subprocess.run(
            [sys.executable, str(script), "--help"], capture_output=True, text=True, cwd=ROOT
        ).stdout
        if "--out" in help_text:
            cmd += ["--out", str(args.out_dir / script.stem)]
        t0 = time.perf_counter()
        print(f"== {' '.join(cmd[1:])}", flush=True)
        result = subprocess.run(cmd, cwd=ROOT, timeout=args.timeout)
        status = "ok" if result.returncode == 0 else f"FAILED (exit {result.returncode})"
        print(f"== {script.relative_to(ROOT)}: {status} in {time.perf_counter() - t0:.1f} s", flush=True)
        if result.returncode != 0:
            failures.append(script.name)
    print(f"{len(scripts) - len(failures)} passed, {len(failures)} failed; outputs in {args.out_dir}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
