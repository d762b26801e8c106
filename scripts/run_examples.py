"""Run every example and reproduction script in its quick mode (what CI does).

    python scripts/run_examples.py --quick [--only NAME]

Each script is run as ``python SCRIPT --quick`` in a fresh process from the repository root;
where a script takes ``--out``, its outputs (tables, plots) go to ``OUT_DIR/SCRIPT_NAME``
(default ``examples/output``, ignored by git), where they stay for you to look at.
A script with a line ``# example-requires: a, b`` is skipped, and says so, where one of those
modules is not installed (``examples/jax_privacy_dpsgd.py`` needs the extra ``jax``; the
light CI job, ``make test-light``, runs it).
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("examples", "reproductions")


def missing_requirements(script: Path) -> list[str]:
    """The modules of the script's ``# example-requires:`` line that are not installed."""
    found = re.search(r"^# example-requires: (.+)$", script.read_text(), re.MULTILINE)
    names = [n.strip() for n in found.group(1).split(",")] if found else []
    return [n for n in names if importlib.util.find_spec(n) is None]


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
    skipped = []
    for script in scripts:
        if missing := missing_requirements(script):
            print(f"== {script.relative_to(ROOT)}: skipped ({', '.join(missing)} not installed)")
            skipped.append(script.name)
            continue
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
    passed = len(scripts) - len(failures) - len(skipped)
    print(f"{passed} passed, {len(failures)} failed, {len(skipped)} skipped; "
          f"outputs in {args.out_dir}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
