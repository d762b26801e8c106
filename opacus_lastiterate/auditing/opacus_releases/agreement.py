"""Does a real-code probe of an Opacus release agree with the package's version model?

A probe record (:func:`opacus_lastiterate.auditing.opacus_releases.probe.run_probe`) holds, per case,
what the release's real optimizer did at every step. :func:`check_probe` compares each case
with :mod:`opacus_lastiterate.analysis.opacus_versions` (``docs/opacus_versions.md``,
"Real-code probes"). Every per-example gradient is e_0 (norm 1), so a step releases

    g = (b w min(1, a C) e_0 + Z) / d,     Z ~ N(0, sigma^2 C^2 I_k)

with b the realised batch size, (a, w) of
:func:`~opacus_lastiterate.analysis.opacus_versions.example_weighting` and d of
:func:`~opacus_lastiterate.analysis.opacus_versions.divisor`:

* noise off (C = 1e6): ``g[0] = b w / d`` to float32 precision (relative 1e-5), ``g[1:] = 0``;
* noise on: ``sum over steps of (g[0] d - b w min(1, a C))^2 + ||g[1:]||^2 d^2`` divided by
  sigma^2 C^2 is chi-square with (number of coordinates) degrees of freedom; the check fails
  when either tail probability is below 1e-6;
* the epsilon the release printed equals the model's
  :func:`~opacus_lastiterate.analysis.opacus_versions.reported_epsilon` (RDP: relative 1e-5;
  PRV: absolute 1e-6, the release's own PRV arithmetic re-run by
  :mod:`~opacus_lastiterate.analysis.opacus_prv`), and
  the sample rate its accountant recorded equals the model's, exactly;
* empty batches: a crash where the model says the release crashes (every such step an
  exception, nothing else raising), draws dropped by the 0.14/0.15 sampler, noise-only steps
  divided by the model's divisor from 1.3.0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ProbeReport",
    "check_probe",
]

_REL_DIVISOR = 1e-5
_CHI2_LEVEL = 1e-6
_RDP_REL = 1e-5
_PRV_ABS = 1e-6


@dataclass(frozen=True)
class ProbeCheck:
    """One comparison: ``case`` (probe case), ``what`` was compared, ``ok``, ``detail``."""

    case: str
    what: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class ProbeReport:
    """Every check of one release's probe record."""

    version: str
    checks: tuple[ProbeCheck, ...]

    @property
    def agrees(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def failures(self) -> tuple[ProbeCheck, ...]:
        return tuple(c for c in self.checks if not c.ok)

    def summary(self) -> str:
        bad = self.failures
        head = f"{self.version}: {len(self.checks) - len(bad)}/{len(self.checks)} checks agree"
        return head + "".join(f"\n  DISAGREES {c.case}/{c.what}: {c.detail}" for c in bad)


def _float(x: object) -> float:
    return float(x)  # type: ignore[arg-type]  # "inf"/"nan" strings parse too


def _steps(case: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [s for s in case.get("steps", ()) if "b" in s]


class _Checker:
    def __init__(self, record: Mapping[str, Any]) -> None:
        from opacus_lastiterate.analysis.opacus_versions import release

        self.rel = release(str(record["opacus"]))
        self.out: list[ProbeCheck] = []

    def add(self, case: str, what: str, ok: bool, detail: str) -> None:
        self.out.append(ProbeCheck(case, what, bool(ok), detail))

    # -- the model's numbers ---------------------------------------------------------------

    def divisor(self, cfg: Mapping[str, Any], b: int) -> float:
        from opacus_lastiterate.analysis.opacus_versions import divisor

        if cfg.get("poisson_engine"):  # 0.14/0.15 PrivacyEngine(poisson=True): q * sample_size
            return float(cfg["batch_size"] / cfg["dataset_size"] * cfg["dataset_size"])
        return divisor(
            self.rel, int(cfg["dataset_size"]), int(cfg["batch_size"]), b,
            poisson=bool(cfg.get("poisson", True)),
            loss_reduction=str(cfg.get("loss_reduction", "mean")),
        )

    def signal(self, cfg: Mapping[str, Any], b: int) -> float:
        """b w min(1, a C): what b unit per-example gradients add to g[0] before division."""
        from opacus_lastiterate.analysis.opacus_versions import example_weighting

        ew = example_weighting(self.rel, b, loss_reduction=str(cfg.get("loss_reduction", "mean")))
        return b * ew.weight * min(1.0, ew.clip_scale * float(cfg["max_grad_norm"]))

    def crashes_on_empty(self) -> bool:
        return bool(self.rel.crashes_on_empty)

    # -- checks ---------------------------------------------------------------------------

    def errors(self, name: str, steps: list[Mapping[str, Any]]) -> None:
        """Only empty batches may raise, and only in releases that crash on them; where the
        model says they crash, every empty batch raised."""
        bad = [s for s in steps if "error" in s and (s["b"] != 0 or not self.crashes_on_empty())]
        silent = [s for s in steps if "error" not in s and s["b"] == 0 and self.crashes_on_empty()]
        if bad or silent:
            self.add(name, "exceptions", False,
                     f"unexpected: {[s.get('error') for s in bad]}; empty steps that did not "
                     f"raise: {len(silent)}")
        elif any("error" in s for s in steps):
            n = sum("error" in s for s in steps)
            self.add(name, "exceptions", True, f"{n} empty batch(es) raised, as modelled")

    def noiseless(self, name: str, case: Mapping[str, Any]) -> None:
        cfg = case["config"]
        steps = [s for s in _steps(case) if "error" not in s]
        worst, shown = 0.0, []
        for s in steps:
            b = int(s["b"])
            g0 = _float(s["g0"])
            if b == 0:
                ok = g0 == 0.0 or math.isnan(g0)
                worst = max(worst, 0.0 if ok else math.inf)
                continue
            d = self.divisor(cfg, b)
            expected = self.signal(cfg, b) / d if d else math.inf
            err = 0.0 if expected == g0 else abs(g0 - expected) / abs(expected)
            worst = max(worst, err)
            if _float(s["rest_max"]) != 0.0 and d:
                worst = math.inf
            shown.append(f"{b}/{b / g0:.6g}" if g0 else f"{b}/inf")
        self.add(name, "divisor (noise off)", bool(steps) and worst <= _REL_DIVISOR,
                 f"{cfg_text(cfg)}: b/measured divisor {' '.join(shown)}; model "
                 f"{self._model_text(cfg, steps)}; worst relative error {worst:.2g}")

    def _model_text(self, cfg: Mapping[str, Any], steps: list[Mapping[str, Any]]) -> str:
        ds = sorted({self.divisor(cfg, int(s["b"])) for s in steps if s["b"]})
        ws = sorted({self.signal(cfg, int(s["b"])) / int(s["b"]) for s in steps if s["b"]})
        text = "d = " + ",".join(f"{d:g}" for d in ds[:6]) + ("..." if len(ds) > 6 else "")
        if ws != [1.0]:
            text += ", per-example weight " + ",".join(f"{x:g}" for x in ws[:6])
        return text

    def noisy(self, name: str, case: Mapping[str, Any], only_empty: bool = False) -> None:
        from scipy import stats

        cfg = case["config"]
        sigma, clip = float(cfg["noise_multiplier"]), float(cfg["max_grad_norm"])
        total, dof = 0.0, 0
        for s in _steps(case):
            if "error" in s or (only_empty and s["b"] != 0):
                continue
            b = int(s["b"])
            d = self.divisor(cfg, b)
            signal = self.signal(cfg, b) if b else 0.0
            total += (_float(s["g0"]) * d - signal) ** 2 + _float(s["rest_sq"]) * d * d
            dof += 1 + int(s["k"])
        if dof == 0:
            self.add(name, "noise scale", not only_empty, "no step to measure")
            return
        x = total / (sigma * clip) ** 2
        p_low, p_high = float(stats.chi2.cdf(x, dof)), float(stats.chi2.sf(x, dof))
        ratio = math.sqrt(x / dof)
        self.add(name, "noise scale" + (" (empty batches)" if only_empty else ""),
                 min(p_low, p_high) >= _CHI2_LEVEL,
                 f"{cfg_text(cfg)}: measured std * model divisor / (sigma C) = {ratio:.4f} "
                 f"over {dof} coordinates (chi-square tails {p_low:.2g}, {p_high:.2g})")

    def reported(self, name: str, eps: float, cfg: Mapping[str, Any], steps: int,
                 q: float | None) -> None:
        from opacus_lastiterate.analysis.opacus_versions import (
            VersionConfig,
            compare_versions,
            reported_epsilon,
        )

        vc = VersionConfig(
            int(cfg["dataset_size"]), int(cfg["batch_size"]), float(cfg["noise_multiplier"]),
            1e-5, epochs=None, steps=steps, poisson=bool(cfg.get("poisson", True)),
        )
        row = compare_versions(vc, self.rel.version)[0]
        model = reported_epsilon(self.rel, vc)
        if self.rel.default_accountant == "prv":
            ok, tol = abs(eps - model) <= _PRV_ABS, f"abs {_PRV_ABS}"
        else:
            ok, tol = abs(eps - model) <= _RDP_REL * model, f"rel {_RDP_REL}"
        self.add(name, "reported epsilon", ok,
                 f"release printed {eps:.6f}, model {model:.6f} ({self.rel.default_accountant}, "
                 f"q = {row.sample_rate:.10g}, {steps} steps, tolerance {tol})")
        if q is not None:
            self.add(name, "accountant sample rate", q == row.sample_rate,
                     f"release {q!r}, model {row.sample_rate!r}")

    def empty(self, case: Mapping[str, Any]) -> None:
        steps = _steps(case)
        empties = [s for s in steps if s["b"] == 0]
        epochs = [s for s in case.get("steps", ()) if "epoch_draws" in s]
        family = self.rel.family
        if family == "0.14-0.15":
            dropped = sum(int(e["epoch_draws"]) - int(e["epoch_batches"]) for e in epochs)
            ok = not empties and dropped > 0 and not any("error" in s for s in steps)
            self.add("empty", "sampler drops empty draws", ok,
                     f"{dropped} of {sum(int(e['epoch_draws']) for e in epochs)} draws dropped, "
                     f"{len(empties)} empty batches reached the optimizer")
        else:
            self.add("empty", "empty batches seen", bool(empties), f"{len(empties)} empty batches")
        self.errors("empty", steps)
        if not self.crashes_on_empty() and family == "1.x":
            self.noisy("empty", case, only_empty=True)

    def oversize(self, case: Mapping[str, Any]) -> None:
        steps = _steps(case)
        raised = bool(steps) and "error" in steps[0]
        should = self.rel.family == "0.9-0.11"
        detail = steps[0].get("error", "no exception") if steps else "no step"
        self.add("oversize", "batch above batch_size", raised == should and
                 (raised or _float(steps[0]["g0"]) == 1.0),
                 f"{detail} (model: {'ValueError' if should else 'divided by the realised size'})")


def cfg_text(cfg: Mapping[str, Any]) -> str:
    parts = [f"N={cfg['dataset_size']}", f"L={cfg['batch_size']}"]
    if "poisson" in cfg:
        parts.append("Poisson" if cfg["poisson"] else "shuffled")
    if cfg.get("loss_reduction") == "sum":
        parts.append("sum")
    if cfg.get("poisson_engine"):
        parts.append("PrivacyEngine(poisson=True)")
    return " ".join(parts)


def check_probe(record: Mapping[str, Any]) -> ProbeReport:
    """Compare one release's probe record with the version model."""
    c = _Checker(record)
    for case in record["cases"]:
        name = str(case["case"])
        if "error" in case:
            c.add(name, "case ran", False, str(case["error"]))
            continue
        cfg = case["config"]
        steps = _steps(case)
        if name in ("divisor", "sum", "poisson_engine", "noise"):
            c.errors(name, steps)
            if float(cfg["noise_multiplier"]) == 0.0:
                c.noiseless(name, case)
            else:
                c.noisy(name, case)
        if name == "noise":
            tail = next(s for s in case["steps"] if "reported_epsilon" in s)
            history = tail["accountant_history"]
            c.reported("noise", _float(tail["reported_epsilon"]), cfg,
                       sum(int(h[2]) for h in history), float(history[-1][1]))
        elif name == "accountant":
            tail = case["steps"][0]
            c.reported("accountant", _float(tail["reported_epsilon"]), cfg, int(cfg["steps"]), None)
        elif name == "empty":
            c.empty(case)
        elif name == "oversize":
            c.oversize(case)
    return ProbeReport(str(record["opacus"]), tuple(c.out))
