"""Mutation testing of the heuristic, sampling-heuristic and audit-statistics modules.

    python scripts/mutation.py [TARGET ...] [--max-children 1] [--fresh | --survivors-only]

For each named target the script copies the package, the tests and ``pyproject.toml`` into
``build/mutation/<target>/``, adds a ``[tool.mutmut]`` section there (the modules to mutate
and the test files that cover them), runs ``mutmut run`` in that copy and prints
the counts per status and every mutant not killed ("survived" or "no tests"; the survival
rate counts both). The repository's own ``pyproject.toml`` carries no mutmut configuration,
so the per-target test selection stays here. mutmut keeps its verdicts in
``build/mutation/<target>/mutants/`` and re-tests a mutant when its function changed;
``--survivors-only`` re-tests the mutants not killed last time (``results.json``) after
tests were added, ``--fresh`` starts over.

Needs ``mutmut`` (3.8.1) importable by the Python that runs this script (``make mutation``
installs it into the development environment). A developer's check, not part of ``make test``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "opacus_lastiterate"
LI = f"{PACKAGE}/analysis/last_iterate"
AUDIT = f"{PACKAGE}/analysis/audit"

# target: (modules to mutate, test files that cover them)
TARGETS: dict[str, tuple[list[str], list[str]]] = {
    "heuristic": (
        [f"{LI}/heuristic.py", f"{LI}/heuristic_pair.py"],
        [
            "tests/analysis/last_iterate/test_heuristic.py",
            "tests/analysis/last_iterate/test_heuristic_mutants.py",
            "tests/analysis/last_iterate/test_suffix_maximum.py",
            "tests/analysis/last_iterate/test_counterexamples.py",
            "tests/analysis/last_iterate/test_weighted_heuristic.py",
            "tests/analysis/last_iterate/test_optimizer_weights.py",
            "tests/analysis/test_poisson_models.py",
            "tests/analysis/test_privacy_models.py",
        ],
    ),
    "sampling_heuristic": (
        [f"{PACKAGE}/analysis/sampling_heuristic.py"],
        [
            "tests/analysis/test_sampling_heuristic.py",
            "tests/analysis/test_sampling_heuristic_mutants.py",
        ],
    ),
    "clopper_pearson": (
        [f"{AUDIT}/clopper_pearson.py"],
        [
            "tests/analysis/audit/test_audit_clopper_pearson.py",
            "tests/analysis/audit/test_audit_statistics_mutants.py",
        ],
    ),
    "one_run": (
        [f"{AUDIT}/one_run.py"],
        [
            "tests/analysis/audit/test_audit_one_run.py",
            "tests/analysis/audit/test_audit_statistics_mutants.py",
            "tests/analysis/audit/test_audit_one_run_gdp_mutants.py",
        ],
    ),
    "one_run_fdp": (
        [f"{AUDIT}/one_run_fdp.py"],
        [
            "tests/analysis/audit/test_audit_one_run_fdp.py",
            "tests/analysis/audit/test_audit_statistics_mutants.py",
            "tests/analysis/audit/test_audit_one_run_gdp_mutants.py",
        ],
    ),
    "gaussian_dp": (
        [f"{AUDIT}/gaussian_dp.py"],
        [
            "tests/analysis/audit/test_audit_conversions.py",
            "tests/analysis/audit/test_audit_statistics_mutants.py",
            "tests/analysis/audit/test_audit_one_run_gdp_mutants.py",
        ],
    ),
}


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def prepare(target: str, workdir: Path, fresh: bool) -> None:
    modules, tests = TARGETS[target]
    tests = [t for t in tests if (ROOT / t).exists()]
    if fresh and workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in (PACKAGE, "tests"):
        if (workdir / folder).exists():
            shutil.rmtree(workdir / folder)
        shutil.copytree(ROOT / folder, workdir / folder, ignore=ignore)
    config = "\n".join(
        [
            "",
            "[tool.mutmut]",
            f'source_paths = ["{PACKAGE}"]',
            f"only_mutate = {_toml_list(modules)}",
            f"pytest_add_cli_args_test_selection = {_toml_list(tests)}",
            'pytest_add_cli_args = ["-p", "no:cacheprovider", "-p", "no:xdist"]',
            # a mutant gets (duration of its tests + 2 s) * 5 * 2 of CPU time
            "timeout_multiplier = 5.0",
            "timeout_constant = 2.0",
            "use_git_change_detection = false",
            # workers fork from a process that has run no test: no cache (segments_pair's
            # lru_cache) filled by the unmutated code reaches a mutant
            'process_isolation = "forkserver"',
            "",
        ]
    )
    text = (ROOT / "pyproject.toml").read_text()
    (workdir / "pyproject.toml").write_text(text + config)


def results(workdir: Path, python: str) -> dict[str, str]:
    """Every mutant's status (killed, survived, timeout, no tests, ...) from ``mutmut results``."""
    out = subprocess.run(
        [python, "-m", "mutmut", "results", "--all", "true"],
        cwd=workdir,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    status = {}
    for line in out.splitlines():
        if line.startswith("    ") and ": " in line:
            name, verdict = line.strip().rsplit(": ", 1)
            status[name] = verdict
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", help=f"any of {', '.join(TARGETS)} (default: all)")
    parser.add_argument("--max-children", type=int, default=1)
    parser.add_argument("--fresh", action="store_true", help="discard cached results")
    parser.add_argument(
        "--survivors-only",
        action="store_true",
        help="re-test only the mutants that were not killed in the previous run of the target "
        "(results.json); a killed mutant stays killed when tests are only added",
    )
    parser.add_argument("--workdir", type=Path, default=ROOT / "build" / "mutation")
    args = parser.parse_args()
    unknown = [t for t in args.targets if t not in TARGETS]
    if unknown:
        parser.error(f"unknown targets {unknown}; choose from {', '.join(TARGETS)}")
    python = sys.executable
    summary = {}
    for target in args.targets or list(TARGETS):
        workdir = args.workdir / target
        record = workdir / "results.json"
        previous = json.loads(record.read_text()) if record.exists() else {}
        names: list[str] = []
        if args.survivors_only:
            names = sorted(n for n, v in previous.items() if v != "killed")
        prepare(target, workdir, args.fresh)
        print(f"== {target}: mutmut run in {workdir} ({len(names) or 'all'} mutants)", flush=True)
        subprocess.run(
            [python, "-m", "mutmut", "run", "--max-children", str(args.max_children), *names],
            cwd=workdir,
            check=False,
        )
        status = results(workdir, python)
        if names:
            status = previous | {n: status[n] for n in names if n in status}
        record.write_text(json.dumps(status, indent=1, sort_keys=True))
        summary[target] = status
    for target, status in summary.items():
        tally = Counter(status.values())
        total = sum(tally.values())
        alive = tally.get("survived", 0) + tally.get("no tests", 0)
        rate = alive / total if total else float("nan")
        print(f"{target}: {total} mutants, {dict(sorted(tally.items()))}, not killed {rate:.1%}")
        for name, verdict in sorted(status.items()):
            if verdict != "killed":
                print(f"    {name}: {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
