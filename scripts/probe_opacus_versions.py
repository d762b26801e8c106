"""Probe the real code of every Opacus release, one isolated environment per release.

    python scripts/probe_opacus_versions.py [--versions 0.9.0..1.6.0] [--envs DIR]
        [--native] [--no-audit] [--out docs/results]

(``make probe-versions`` runs it with the defaults.) For each release it

1. creates a shared base environment (Python 3.11, ``$TORCH_SPEC`` = torch==2.13.0, numpy,
   scipy, opt_einsum; ``$TORCH_INDEX_URL`` as in ``scripts/bootstrap.sh``) and installs the
   release alone into its own folder (``pip install --no-deps --target``), put on
   ``PYTHONPATH`` when it runs: every release sees the same torch and nothing else of the
   others;
2. runs ``opacus_lastiterate/auditing/opacus_releases/probe.py probe`` in it (the file imports only
   torch, numpy and opacus; it applies a compatibility shim only after the matching import
   error and records it) and checks the record against the version model
   (:mod:`opacus_lastiterate.auditing.opacus_releases.agreement`);
3. with ``--native``, also probes 0.9.0-0.15.0 on the torch of their time (Python 3.8,
   torch==1.7.1 with torchcsprng==0.1.4, no shim needed), a check that the shims change
   nothing that is measured;
4. unless ``--no-audit``, runs the empirical audit of real code
   (:mod:`opacus_lastiterate.auditing.opacus_releases.real_code_audit`) on 1.0.0 and 1.6.0 (FEASGM, a divisor
   that changes between neighbours) and 0.15.0 (ASGM) in their environments.

Writes ``opacus_probes.json`` (every record, the environment and the command) and
``opacus_audits.json`` to ``--out`` and prints the agreement and the audit table. A release
that cannot be made to run is recorded with the reason. Exit status 1 if a probe disagrees
with the model or an audit is not between the reported epsilon and the bound.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from portable_paths import portable_command, portable_text  # noqa: E402  (this folder)

from opacus_lastiterate.analysis.opacus_versions import releases_between  # noqa: E402
from opacus_lastiterate.auditing.opacus_releases.agreement import check_probe  # noqa: E402
from opacus_lastiterate.auditing.opacus_releases.real_code_audit import summarise_audit  # noqa: E402

PROBE = ROOT / "opacus_lastiterate" / "auditing" / "opacus_releases" / "probe.py"
MODES = ROOT / "opacus_lastiterate" / "auditing" / "opacus_releases" / "modes.py"
DEFAULT_ENVS = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "opacus-lastiterate" / "opacus-versions"
NATIVE_TORCH = ["torch==1.7.1", "torchcsprng==0.1.4", "numpy<1.25", "scipy<1.11"]
# The audits (docs/opacus_versions.md, "Empirical audit of real Opacus code").
FEASGM_AUDIT = {"others": 99, "batch_size": 10, "noise_multiplier": 2.0, "steps": 10, "dimension": 100}
ASGM_AUDIT = {"others": 9, "sample_rate": 0.1, "noise_multiplier": 6.0, "steps": 20, "dimension": 100}


def log(msg: str) -> None:
    print(msg, flush=True)


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def tail(text: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])


def base_env(envs: Path, python: str, packages: list[str], name: str) -> Path:
    """A virtual environment with ``packages`` (created once, reused)."""
    env = envs / name
    py = env / "bin" / "python"
    if py.exists() and (env / ".complete").exists():
        return py
    shutil.rmtree(env, ignore_errors=True)
    log(f"creating {env} ({python}; {' '.join(packages)})")
    subprocess.run([python, "-m", "venv", str(env)], check=True)
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    torch = [p for p in packages if p.startswith("torch==")]
    index = os.environ.get("TORCH_INDEX_URL")
    if torch and index:
        subprocess.run(pip + torch + ["--index-url", index], check=True)
    subprocess.run(pip + packages, check=True)
    (env / ".complete").write_text(" ".join(packages))
    return py


def release_dir(envs: Path, py: Path, version: str, tag: str) -> tuple[Path | None, str]:
    """The release installed alone (``--no-deps --target``); (None, reason) on failure."""
    target = envs / f"opacus-{version}-{tag}"
    if (target / ".complete").exists():
        return target, ""
    shutil.rmtree(target, ignore_errors=True)
    res = run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
               "--no-deps", "--target", str(target), f"opacus=={version}"])
    if res.returncode:
        return None, f"pip install failed: {tail(res.stderr)}"
    (target / ".complete").write_text(version)
    return target, ""


def in_release(
    py: Path, target: Path, args: list[str], timeout: float, script: Path = PROBE
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(target), PYTHONNOUSERSITE="1")
    with tempfile.TemporaryDirectory() as cwd:  # nothing from the repository on sys.path
        return run([str(py), str(script), *args], env=env, cwd=cwd, timeout=timeout)


def probe_modes(py: Path, target: Path) -> tuple[dict[str, Any] | None, str]:
    """The training modes (ghost clipping, virtual steps, accumulation, adaptive clipping)
    of a 1.x release: modes.py run by path (docs/opacus_versions.md, Training modes)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "modes.json"
        try:
            res = in_release(py, target, ["--out", str(out)], timeout=900, script=MODES)
        except subprocess.TimeoutExpired:
            return None, "mode probe timed out after 900 s"
        if res.returncode or not out.exists():
            return None, f"mode probe failed: {tail(res.stderr)}"
        return json.loads(out.read_text()), ""


def probe(py: Path, target: Path, version: str) -> tuple[dict[str, Any] | None, str]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "probe.json"
        try:
            res = in_release(py, target, ["probe", "--out", str(out)], timeout=900)
        except subprocess.TimeoutExpired:
            return None, "probe timed out after 900 s"
        if res.returncode or not out.exists():
            return None, f"probe failed: {tail(res.stderr)}"
        record = json.loads(out.read_text())
    if record["opacus"].split("+")[0] not in (version, version + ".0"):
        return None, f"imported opacus {record['opacus']}, not {version}"
    return record, ""


def audit(py: Path, target: Path, mechanism: str, cfg: dict[str, Any], trials: int, delta: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "obs.npz"
        args = ["audit", "--out", str(out), "--trials", str(trials), "--steps", str(cfg["steps"]),
                "--dimension", str(cfg["dimension"]), "--others", str(cfg["others"]),
                "--noise-multiplier", str(cfg["noise_multiplier"])]
        args += (["--batch-size", str(cfg["batch_size"])] if mechanism == "FEASGM"
                 else ["--sample-rate", str(cfg["sample_rate"])])
        start = time.perf_counter()
        res = in_release(py, target, args, timeout=6 * 3600)
        if res.returncode:
            raise RuntimeError(f"audit failed: {tail(res.stderr)}")
        obs = dict(np.load(out))
    result = summarise_audit(obs, mechanism=mechanism, delta=delta, **cfg)  # type: ignore[arg-type]
    out_dict = result.as_dict()
    out_dict["seconds"] = round(time.perf_counter() - start, 1)
    log("  " + result.summary())
    return out_dict


def _num(x: Any) -> float:
    return float(x)


def _divisors(case: dict[str, Any]) -> str:
    """b/d pairs measured with the noise off."""
    pairs = []
    for st in case.get("steps", []):
        if "b" not in st:
            continue
        if "error" in st:
            pairs.append(f"{st['b']}/crash")
        elif st["b"] == 0:
            pairs.append("0/-")
        else:
            g0 = _num(st["g0"])
            pairs.append(f"{st['b']}/{st['b'] / g0:.4g}" if g0 else f"{st['b']}/inf")
    return " ".join(pairs[:5])


def _empty(record: dict[str, Any]) -> str:
    case = next(c for c in record["cases"] if c["case"] == "empty")
    steps = [st for st in case.get("steps", []) if "b" in st]
    crashes = [st for st in steps if "error" in st]
    if crashes:
        return "crash (" + crashes[0]["error"].split(":")[0] + ")"
    epochs = [st for st in case.get("steps", []) if "epoch_draws" in st]
    if epochs:
        dropped = sum(e["epoch_draws"] - e["epoch_batches"] for e in epochs)
        return f"dropped ({dropped}/{sum(e['epoch_draws'] for e in epochs)} draws)"
    return f"noise-only step ({sum(st['b'] == 0 for st in steps)} seen)"


def print_report(out: Path) -> None:
    """Markdown tables of the committed results (for docs/opacus_versions.md)."""
    data = json.loads((out / "opacus_probes.json").read_text())
    print(f"`{data['command']}`\n")
    print("| release | torch | shims | divisor b/d, N=200, L=30 (noise off) | noise std x d / (sigma C) "
          "| epsilon printed (q=0.01, sigma=1.1, 1000 steps) | empty Poisson batch | checks |")
    print("|---|---|---|---|---|---|---|---|")
    for record in data["records"]:
        rep = check_probe(record)
        first = next(c for c in record["cases"] if c["case"] == "divisor")
        noise = next(c for c in rep.checks if c.case == "noise" and c.what == "noise scale")
        ratio = noise.detail.split("= ")[1].split(" ")[0]
        acc = next(c for c in record["cases"] if c["case"] == "accountant")["steps"][0]
        shims = ", ".join(record["shims"]) or "-"
        print(f"| {record['opacus']} | {record['torch']} | {shims} | {_divisors(first)} | {ratio} | "
              f"{_num(acc['reported_epsilon']):.4f} | {_empty(record)} | "
              f"{len(rep.checks) - len(rep.failures)}/{len(rep.checks)} |")
    for failure in data["could_not_run"]:
        print(f"| {failure['opacus']} ({failure['track']}) | could not run: {failure['reason']} |")
    path = out / "opacus_audits.json"
    if path.exists():
        audits = json.loads(path.read_text())
        print(f"\n`{audits['command']}`\n")
        print("| release | mechanism | runs per world | eps_reported | eps_audit (lower bound, 95%) "
              "| eps_corrected | exact epsilon of the configuration |")
        print("|---|---|---|---|---|---|---|")
        for a in audits["audits"]:
            print(f"| {a['opacus']} | {a['mechanism']} | {a['config']['trials_per_world']} | "
                  f"{_num(a['eps_reported']):.4f} | {_num(a['eps_audit_lower_bound']):.4f} "
                  f"({a['audit']['counts']}) | {_num(a['eps_corrected']):.4f} | {_num(a['eps_config']):.4f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--versions", default="0.9.0..1.6.0", help="A..B, A,B,C or one version")
    parser.add_argument("--envs", type=Path, default=DEFAULT_ENVS, help="where environments live")
    parser.add_argument("--python", default=shutil.which("python3.11") or sys.executable,
                        help="interpreter of the base environment (Python 3.11)")
    parser.add_argument("--native", action="store_true", help="also probe 0.x on torch 1.7.1")
    parser.add_argument("--native-python", default=shutil.which("python3.8") or "python3.8",
                        help="interpreter for --native (Python 3.8)")
    parser.add_argument("--no-audit", action="store_true", help="skip the empirical audits")
    parser.add_argument("--feasgm-trials", type=int, default=2000, help="audit runs per world, 1.x")
    parser.add_argument("--asgm-trials", type=int, default=10000, help="audit runs per world, 0.15.0")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    parser.add_argument("--report", action="store_true",
                        help="print Markdown tables of the results in --out and exit")
    args = parser.parse_args()
    if args.report:
        print_report(args.out)
        return 0
    start = time.perf_counter()
    command = portable_command("scripts/probe_opacus_versions.py", sys.argv[1:])
    machine_paths = {args.envs.resolve(): "envs", args.python: "python",
                     args.native_python: "native-python"}

    def portable_json(data: dict[str, Any]) -> str:  # no path of this machine in the file
        return portable_text(json.dumps(data, indent=1, allow_nan=False), machine_paths) + "\n"

    args.envs.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    torch_spec = os.environ.get("TORCH_SPEC", "torch==2.13.0")
    tracks = [("current", args.python, [torch_spec, "numpy", "scipy", "opt_einsum"],
               f"py311-{torch_spec.replace('==', '')}", releases_between(args.versions))]
    if args.native:
        old = [r for r in releases_between(args.versions) if r.key < (1, 0, 0)]
        tracks.append(("native", args.native_python, NATIVE_TORCH, "py38-torch1.7.1", old))
    records: list[dict[str, Any]] = []
    mode_records: list[dict[str, Any]] = []
    failures: list[dict[str, str]] = []
    targets: dict[tuple[str, str], tuple[Path, Path]] = {}
    disagreements = 0
    for track, python, packages, tag, releases in tracks:
        if not releases:
            continue
        try:
            py = base_env(args.envs, python, packages, f"base-{tag}")
        except (subprocess.CalledProcessError, FileNotFoundError) as exc:
            for r in releases:
                failures.append({"opacus": r.version, "track": track, "reason": f"base environment: {exc}"})
            continue
        log(f"== {track}: {run([str(py), '-c', 'import sys, torch; print(sys.version.split()[0], torch.__version__)']).stdout.strip()}")
        for rel in releases:
            target, reason = release_dir(args.envs, py, rel.version, tag)
            record = None
            if target is not None:
                record, reason = probe(py, target, rel.version)
            if record is None:
                failures.append({"opacus": rel.version, "track": track, "reason": reason})
                log(f"  {rel.version}: could not run: {reason}")
                continue
            record["track"] = track
            records.append(record)
            if track == "current" and rel.family == "1.x":
                modes, why = probe_modes(py, target)
                mode_records.append(modes if modes is not None else {"opacus": rel.version, "failed": why})
            targets[(track, rel.version)] = (py, target)  # type: ignore[assignment]
            report = check_probe(record)
            disagreements += not report.agrees
            shims = f" (shims: {', '.join(record['shims'])})" if record["shims"] else ""
            log(f"  {report.summary()}{shims} [{record['seconds']} s]")
    (args.out / "opacus_probes.json").write_text(portable_json({
        "command": command,
        "what": "real-code probes of each Opacus release (docs/opacus_versions.md, Real-code probes)",
        "records": records,
        "could_not_run": failures,
    }))
    log(f"wrote {args.out / 'opacus_probes.json'}: {len(records)} records, {len(failures)} could not run, "
        f"{disagreements} disagree with the model")
    if mode_records:
        (args.out / "opacus_mode_probes.json").write_text(json.dumps({
            "command": command,
            "what": "training modes of each 1.x release (docs/opacus_versions.md, Training modes)",
            "records": mode_records,
        }, indent=1, allow_nan=False) + "\n")
    bad_audits = 0
    if not args.no_audit:
        audits = []
        plan = [("1.0.0", "FEASGM", FEASGM_AUDIT, args.feasgm_trials),
                ("1.6.0", "FEASGM", FEASGM_AUDIT, args.feasgm_trials),
                ("0.15.0", "ASGM", ASGM_AUDIT, args.asgm_trials)]
        for version, mechanism, cfg, trials in plan:
            if ("current", version) not in targets:
                log(f"audit of {version} skipped: not probed in this run")
                continue
            py, target = targets[("current", version)]
            log(f"audit {version} ({mechanism}, {trials} runs per world)")
            result = audit(py, target, mechanism, cfg, trials, 1e-5)
            bad_audits += not (result["exceeds_reported"] and result["within_bound"])
            audits.append(result)
        if audits:
            (args.out / "opacus_audits.json").write_text(
                portable_json({"command": command, "audits": audits}))
            log(f"wrote {args.out / 'opacus_audits.json'}")
    log(f"elapsed {time.perf_counter() - start:.0f} s")
    return 1 if disagreements or bad_audits else 0


if __name__ == "__main__":
    sys.exit(main())
