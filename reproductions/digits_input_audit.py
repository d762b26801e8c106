"""Input-space audit of DP-SGD on digits: the canary's loss against crafted adversarial samples.

For each training variant (full batch, q = 1; minibatch with Poisson sampling) and each
theoretical epsilon (the standard-composition epsilon at delta, sigma calibrated to it),
and each canary type, ``opacus_lastiterate.auditing.run_input_audit`` trains with Opacus
(through ``AuditRunner``):

* crafting runs of the same training (white-box) and surrogate runs of the auditor's own
  training (another subset of digits, another initialisation: black-box), used only to craft
  samples with the uniform and the adaptive expansion objectives;
* evaluation runs (disjoint seeds), scored by the canary's loss and by every crafted
  sample's loss, each audited with the same Clopper-Pearson bound (valid threshold strategy
  RankGridBonferroni), confidence and delta; a Gaussian-DP estimate is printed beside it.

Printed and saved (JSON + plot): per cell, the bounds, the number of runs, the heuristic and
the standard epsilon. The pre-declared comparison is the canary against the adaptive
white-box sample (the paper's main method); the other samples are shown but were not chosen
after the fact. ``docs/input_audits.md`` explains the method and holds the command of the
committed results.

    python reproductions/digits_input_audit.py [--quick] [--out DIR] [--no-plot] ...
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _plotting import plotting_available
from scipy import optimize, stats

from opacus_lastiterate.analysis.audit import plan_multi_run_audit
from opacus_lastiterate.analysis.baselines.composition import standard_epsilon
from opacus_lastiterate.auditing import (
    CRAFTING_OBJECTIVES,
    InputCanary,
    OpacusInputTrainer,
    RunRecords,
    blank_canary,
    clip_backdoor_canary,
    digits_data,
    in_distribution_canary,
    least_likely_label,
    mislabelled_canary,
    run_input_audit,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from portable_paths import portable_command, portable_path

DEFAULT_OUT = Path(__file__).resolve().parent / "output" / "digits_input_audit"
CANARIES = ("in-distribution", "mislabelled", "blank", "clip-backdoor")
VARIANTS = ("full-batch", "minibatch")
PRIMARY = "adaptive (white-box)"  # the pre-declared crafted sample of the comparison


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--quick", action="store_true",
                   help="CI mode: epsilon 10, in-distribution canary, tiny model, few runs")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results folder (JSON, plot)")
    p.add_argument("--work", type=Path, default=None,
                   help="run records and models (default OUT/runs; rerun to resume)")
    p.add_argument("--no-plot", action="store_true", help="print the table only")
    p.add_argument("--replot", action="store_true",
                   help="only redraw OUT/digits_input_audit.png from OUT/digits_input_audit.json")
    p.add_argument("--epsilons", default="1,2,4,10", help="theoretical (standard) epsilons")
    p.add_argument("--variants", default=",".join(VARIANTS), help="full-batch and/or minibatch")
    p.add_argument("--canaries", default="in-distribution",
                   help=f"canary types at every epsilon, from {','.join(CANARIES)}")
    p.add_argument("--extra-canaries", default="mislabelled,blank,clip-backdoor",
                   help="canary types audited at the largest epsilon only ('' for none)")
    p.add_argument("--eval-runs", type=int, default=256, help="evaluation runs per cell")
    p.add_argument("--craft-runs", type=int, default=128, help="white-box crafting runs per cell")
    p.add_argument("--surrogate-runs", type=int, default=128,
                   help="black-box surrogate runs per cell (0: no black-box samples)")
    p.add_argument("--statistic", choices=["loss", "margin"], default="loss")
    p.add_argument("--init", choices=["random", "worst-case"], default="random",
                   help="initialisation (the same in every run)")
    p.add_argument("--architecture", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--hidden", type=int, default=32, help="hidden units / channels")
    p.add_argument("--num-examples", type=int, default=200, help="N, size of D")
    p.add_argument("--full-batch-steps", type=int, default=50)
    p.add_argument("--minibatch-steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=30, help="expected minibatch size")
    p.add_argument("--lr", type=float, default=1.0, help="SGD learning rate")
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="clipping norm C")
    p.add_argument("--craft-steps", type=int, default=100, help="Adam steps of crafting")
    p.add_argument("--craft-lr", type=float, default=0.01, help="Adam step size of crafting")
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=None,
                   help="training processes (default: min(2, CPUs); 0: in this process)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    p.add_argument("--in-sample", action="store_true",
                   help="also craft on the evaluation runs themselves (labelled INVALID: a "
                        "diagnostic of over-fitting, never a bound)")
    args = p.parse_args(argv)
    if args.quick:
        args.epsilons, args.variants, args.canaries, args.extra_canaries = "10", ",".join(
            VARIANTS), "in-distribution", ""
        args.eval_runs, args.craft_runs, args.surrogate_runs = 24, 16, 16
        args.hidden, args.num_examples, args.full_batch_steps, args.minibatch_steps = 8, 100, 10, 20
        args.batch_size, args.craft_steps = 30, 20
        args.workers = 0 if args.workers is None else args.workers
    if args.workers is None:
        args.workers = min(2, os.cpu_count() or 1)
    args.epsilons = [float(e) for e in args.epsilons.split(",") if e]
    args.variants = [v for v in args.variants.split(",") if v]
    args.canaries = [c for c in args.canaries.split(",") if c]
    args.extra_canaries = [c for c in args.extra_canaries.split(",") if c]
    for v in args.variants:
        if v not in VARIANTS:
            p.error(f"--variants: {v!r} is not one of {VARIANTS}")
    for c in args.canaries + args.extra_canaries:
        if c not in CANARIES:
            p.error(f"--canaries: {c!r} is not one of {CANARIES}")
    if not args.epsilons or min(args.epsilons) <= 0:
        p.error("--epsilons must be positive")
    if args.work is None:
        args.work = args.out / "runs"
    return args


def calibrate_sigma(target: float, delta: float, steps: int, q: float) -> float:
    """sigma with standard_epsilon ~ target (searched on a coarse PLD grid, which is
    pessimistic: the fine-grid epsilon at this sigma is slightly below the target)."""

    def gap(log_sigma: float) -> float:
        return standard_epsilon(delta, steps=steps, sample_rate=q,
                                noise_multiplier=math.exp(log_sigma),
                                value_discretization_interval=1e-2) - target

    lo, hi = math.log(0.2), math.log(5.0)
    while gap(lo) < 0:
        lo -= 0.5
    while gap(hi) > 0:
        hi += 0.5
    return math.exp(optimize.brentq(gap, lo, hi, xtol=1e-4))


def make_canary(kind: str, reference: OpacusInputTrainer) -> InputCanary:
    """A canary from digits outside D (and outside the worst-case initialisation's data)."""
    x, y = digits_data()
    held = reference._pool()[reference.num_examples + reference.init_examples:]
    if kind == "in-distribution":
        return in_distribution_canary(x, y, int(held[0]))
    if kind == "mislabelled":
        return mislabelled_canary(x, y, int(held[0]), num_classes=10)
    model = reference.random_initial_model()
    if kind == "blank":
        return blank_canary((64,), least_likely_label(model, torch.zeros(64)))
    bkd = clip_backdoor_canary(x[held[1:]], 0)  # direction from held-out digits only
    return dataclasses.replace(bkd, label=least_likely_label(model, bkd.features))


def run_cell(args: argparse.Namespace, variant: str, target: float, kind: str) -> dict[str, Any]:
    full = variant == "full-batch"
    steps = args.full_batch_steps if full else args.minibatch_steps
    batch = None if full else args.batch_size
    probe = OpacusInputTrainer(
        canary=blank_canary((64,), 0), architecture=args.architecture, hidden=args.hidden,
        steps=steps, batch_size=batch, num_examples=args.num_examples,
        max_grad_norm=args.max_grad_norm, learning_rate=args.lr, initialisation=args.init,
    )
    sigma = calibrate_sigma(target, args.delta, steps, probe.sample_rate)
    canary = make_canary(kind, probe)
    trainer = dataclasses.replace(probe, canary=canary, noise_multiplier=sigma)
    surrogate = dataclasses.replace(trainer, data_seed=args.seed + 1, init_seed=args.seed + 1)
    t0 = time.perf_counter()
    report = run_input_audit(
        trainer, canary,
        directory=args.work / f"{variant}-eps{target:g}-{kind}",
        evaluation_runs=args.eval_runs, crafting_runs=args.craft_runs,
        surrogate_train=surrogate if args.surrogate_runs else None,
        surrogate_runs=args.surrogate_runs, objectives=CRAFTING_OBJECTIVES,
        statistic=args.statistic,
        crafting_options=dict(steps=args.craft_steps, learning_rate=args.craft_lr,
                              bounds=None if kind == "clip-backdoor" else (0.0, 1.0)),
        delta=args.delta, confidence=args.confidence, seed=args.seed, workers=args.workers,
        progress=not args.no_progress, in_sample=args.in_sample,
    )
    paired = {
        a.name: paired_auroc_difference(report.audits[0].records, a.records, seed=args.seed)
        for a in report.audits[1:]
        if a.mode != "in-sample" and a.records is not None
    }
    return {
        "paired_auroc_difference": paired,
        "variant": variant, "target_epsilon": target, "canary": kind,
        "noise_multiplier": sigma, "sample_rate": trainer.sample_rate, "steps": steps,
        "heuristic_epsilon": trainer.heuristic_epsilon(args.delta),
        "standard_epsilon": trainer.standard_epsilon(args.delta),
        "seconds": time.perf_counter() - t0,
        "ceiling": plan_multi_run_audit(args.eval_runs, delta=args.delta,
                                        confidence=args.confidence).epsilon,
        **report.as_dict(),
    }


def paired_auroc_difference(
    canary: RunRecords | None, sample: RunRecords, *, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """AUROC of ``sample`` minus AUROC of the canary on the same evaluation runs: the point
    difference and a 95% percentile interval of a paired bootstrap (runs resampled jointly,
    so the two scores of a run stay together). AUROC = Pr[in-score > out-score] + ties / 2,
    the Mann-Whitney U statistic over n_in n_out."""
    assert canary is not None
    if [r.index for r in canary.records] != [r.index for r in sample.records]:
        raise ValueError("the canary and the sample were not scored on the same runs")
    member = np.array([r.include_canary for r in canary.records])
    scores = np.array([[r.score for r in canary.records], [r.score for r in sample.records]])

    def auroc(s: np.ndarray, m: np.ndarray) -> float:
        if m.all() or not m.any():
            return float("nan")
        return float(stats.mannwhitneyu(s[m], s[~m]).statistic) / (m.sum() * (~m).sum())

    point = auroc(scores[1], member) - auroc(scores[0], member)
    rng = np.random.default_rng(seed)
    diffs = []
    for _ in range(resamples):
        i = rng.integers(0, member.size, member.size)
        diffs.append(auroc(scores[1, i], member[i]) - auroc(scores[0, i], member[i]))
    low, high = np.nanpercentile(diffs, [2.5, 97.5])
    return point, float(low), float(high)


def print_cell(cell: dict[str, Any]) -> None:
    n = cell["evaluation_runs"]
    print(f"\n{cell['variant']}, theoretical eps {cell['target_epsilon']:g} "
          f"(sigma {cell['noise_multiplier']:.3f}, q {cell['sample_rate']:.3g}, "
          f"T {cell['steps']}), {cell['canary']} canary: {n['in']} runs with, {n['out']} "
          f"without; heuristic {cell['heuristic_epsilon']:.3f}, standard "
          f"{cell['standard_epsilon']:.3f}; best bound these runs can give "
          f"{cell['ceiling']:.2f}; {cell['seconds']:.0f} s")
    print(f"  {'sample':<22} {'bound':>7} {'GDP est.':>8} {'AUROC':>6}  crafting")
    for a in cell["audits"]:
        c = a.get("crafting")
        how = "" if c is None else f"step {c['selected_step']}/{c['steps']}"
        if c is not None and c["validation_auroc_start"] is not None:
            how += (f", validation AUROC {c['validation_auroc_start']:.3f} -> "
                    f"{c['validation_auroc_selected']:.3f}")
        mark = "" if a["bound"]["kind"] == "bound" else "  INVALID (crafted on these runs)"
        print(f"  {a['name']:<22} {a['bound']['epsilon']:>7.3f} {a['estimate']['epsilon']:>8.3f} "
              f"{a['auroc']:>6.3f}  {how}{mark}")
    for name, (point, low, high) in cell.get("paired_auroc_difference", {}).items():
        print(f"  AUROC of {name} minus the canary's: {point:+.3f} (paired bootstrap over the "
              f"runs, 95% interval {low:+.3f} to {high:+.3f})")


def comparison(cells: list[dict[str, Any]], confidence: float) -> list[str]:
    lines = []
    for cell in cells:
        audits = {a["name"]: a for a in cell["audits"]}
        if PRIMARY not in audits:
            continue
        n = cell["evaluation_runs"]
        can, craft = audits["canary"]["bound"]["epsilon"], audits[PRIMARY]["bound"]["epsilon"]
        verdict = "higher" if craft > can else ("equal" if craft == can else "lower")
        lines.append(
            f"{cell['variant']:<10} eps {cell['target_epsilon']:>4g} {cell['canary']:<15} "
            f"canary >= {can:.3f}, crafted ({PRIMARY}) >= {craft:.3f}: {verdict} "
            f"[{n['in']} + {n['out']} runs, Clopper-Pearson, {confidence:.0%} each]"
        )
    return lines


def save_plot(cells: list[dict[str, Any]], out: Path, quick: bool = False) -> Path:
    """One panel per variant: the standard and heuristic epsilon and every audit's lower
    bound against the theoretical epsilon; one legend below the panels (it covers no data),
    Okabe-Ito colours with a marker per series, points of a series nudged sideways so that
    bounds at 0 do not hide each other; ``quick`` writes that the runs are too few."""
    from opacus_lastiterate.figures._plotting import (
        MARKERS,
        OKABE_ITO,
        QUICK_NOTE,
        legend_below,
        pyplot,
        save,
    )

    plt = pyplot()
    from matplotlib.ticker import FuncFormatter

    variants = sorted({c["variant"] for c in cells}, key=VARIANTS.index)
    fig, axes = plt.subplots(1, len(variants), figsize=(6 * len(variants), 4.5), squeeze=False,
                             sharey=True)
    all_eps = sorted({c["target_epsilon"] for c in cells})
    for ax, variant in zip(axes[0], variants, strict=True):
        mine = [c for c in cells if c["variant"] == variant]
        main = sorted((c for c in mine if c["canary"] == "in-distribution"),
                      key=lambda c: c["target_epsilon"])
        if main:
            eps = [c["target_epsilon"] for c in main]
            ax.plot(eps, [c["standard_epsilon"] for c in main], "-", color=OKABE_ITO[0],
                    marker="s", label="standard epsilon (upper bound)")
            ax.plot(eps, [c["heuristic_epsilon"] for c in main], "--", color=OKABE_ITO[0],
                    marker="o", mfc="none", label="heuristic epsilon")
            ax.plot(eps, [c["ceiling"] for c in main], ":", color="0.5", marker="_", ms=12,
                    label="largest bound these runs can give")
            names = [a["name"] for a in main[0]["audits"]]
            for i, name in enumerate(names):
                valid = next(a for a in main[0]["audits"] if a["name"] == name)["bound"]["kind"]
                nudge = 1.0 + 0.04 * (i - (len(names) - 1) / 2)  # sideways, on a log axis
                style: dict[str, Any] = (
                    {"color": OKABE_ITO[1 + i % 7], "marker": MARKERS[i % len(MARKERS)],
                     "linestyle": "-"} if valid == "bound" else
                    {"color": "0.55", "marker": "x" if name.startswith("adaptive") else "+",
                     "linestyle": ":"})
                label = (f"in-distribution canary, {name}" if valid == "bound" else
                         f"{name}: NOT a valid bound (diagnostic)")
                ax.plot([e * nudge for e in eps],
                        [next(a for a in c["audits"] if a["name"] == name)["bound"]["epsilon"]
                         for c in main], label=label, ms=6, **style)
        shapes = {"mislabelled": "s", "blank": "^", "clip-backdoor": "D"}
        for c in mine:
            if c["canary"] in shapes:
                audits = {a["name"]: a for a in c["audits"]}
                ax.scatter([c["target_epsilon"] * 0.93], [audits["canary"]["bound"]["epsilon"]],
                           marker=shapes[c["canary"]], facecolors="none",
                           edgecolors=OKABE_ITO[1], s=45, label=f"{c['canary']} canary itself")
                if PRIMARY in audits:
                    ax.scatter([c["target_epsilon"] * 1.07], [audits[PRIMARY]["bound"]["epsilon"]],
                               marker=shapes[c["canary"]], color=OKABE_ITO[3], s=45,
                               label=f"{c['canary']} canary, {PRIMARY} sample")
        ax.set_xscale("log")
        ax.set_xticks(all_eps, [f"{e:g}" for e in all_eps])
        ax.minorticks_off()
        ax.set_xlim(min(all_eps) / 1.4, max(all_eps) * 1.4)
        # symmetric log: bounds near 0 spread out, the standard epsilon still fits
        ax.set_yscale("symlog", linthresh=0.1, linscale=0.6)
        ax.set_yticks([0, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20])
        ax.set_ylim(bottom=-0.01)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("theoretical epsilon (standard composition; log scale)")
        n = mine[0]["evaluation_runs"]
        ax.set_title(f"{variant} training: {n['in'] + n['out']} evaluation runs per point",
                     fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].set_ylabel("epsilon (no unit; symlog scale)\naudits: Clopper-Pearson lower "
                          "bounds, 95%")
    fig.suptitle("Input-space audit of DP-SGD on digits: lower bounds against the theory")
    if quick:
        fig.text(0.5, 1.0, QUICK_NOTE, ha="center", va="bottom", fontsize=12,
                 color=OKABE_ITO[4], fontweight="bold")
    legend_below(fig, list(axes[0]), ncol=2, fontsize=8)
    path = out / "digits_input_audit.png"
    save(fig, path)
    return path


def replot(out: Path) -> Path:
    """Redraw ``OUT/digits_input_audit.png`` from ``OUT/digits_input_audit.json``."""
    data = json.loads((out / "digits_input_audit.json").read_text())
    return save_plot(data["cells"], out, quick=bool(data["config"].get("quick")))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.replot:
        print(f"saved {replot(args.out)}")
        return 0
    if args.workers == 0:
        torch.set_num_threads(1)
    t0 = time.perf_counter()
    plan = [(v, e, k) for v in args.variants for e in args.epsilons for k in args.canaries]
    plan += [(v, max(args.epsilons), k) for v in args.variants for k in args.extra_canaries
             if k not in args.canaries]
    print(f"digits input-space audit: {len(plan)} cells, {args.eval_runs} evaluation + "
          f"{args.craft_runs} crafting + {args.surrogate_runs} surrogate runs each, "
          f"{args.architecture} ({args.hidden}), N = {args.num_examples}, init {args.init}, "
          f"delta {args.delta:g}, confidence {args.confidence:g}")
    cells = []
    for variant, target, kind in plan:
        cell = run_cell(args, variant, target, kind)
        print_cell(cell)
        cells.append(cell)
    lines = comparison(cells, args.confidence)
    print("\ncanary vs crafted sample, same evaluation runs and statistics:")
    print("\n".join(lines))
    elapsed = time.perf_counter() - t0
    print(f"elapsed {elapsed:.0f} s")
    args.out.mkdir(parents=True, exist_ok=True)
    # committed result files name no folder of this machine (scripts/portable_paths.py)
    config = {k: (portable_path(v, k) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    result = {"command": portable_command("reproductions/digits_input_audit.py", sys.argv[1:]),
              "config": config, "primary_crafted_sample": PRIMARY, "elapsed_seconds": elapsed,
              "torch": torch.__version__, "cells": cells, "comparison": lines}
    json_path = args.out / "digits_input_audit.json"
    json_path.write_text(json.dumps(result, indent=1, default=_json_default) + "\n")
    print(f"saved {json_path}")
    if plotting_available(args.no_plot):
        print(f"saved {save_plot(cells, args.out, quick=args.quick)}")
    for cell in cells:  # a lower bound above the proven upper bound means a bug
        if any(a["bound"]["epsilon"] > cell["standard_epsilon"] for a in cell["audits"]):
            print("error: a lower bound exceeds the standard epsilon", file=sys.stderr)
            return 1
    return 0


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


if __name__ == "__main__":
    sys.exit(main())
