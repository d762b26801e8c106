"""Empirical audit of real Opacus code in the worst case: leakage beyond the reported epsilon.

``docs/opacus_versions.md``, "Empirical audit of real Opacus code". The mechanism side is
:func:`opacus_lastiterate.auditing.opacus_releases.probe.audit_observations` (the release's real
optimizer, others' gradients zero, one canary e_0 in R^d, C = 1; it runs in any environment
holding one Opacus release). This module is the adversary and the statistics:

* the score of a run is the exact log-likelihood ratio of everything the adversary saw, a sum
  over steps: FEASGM (1.x) :func:`~opacus_lastiterate.analysis.normalisation.divisor_leak_loss`
  of (u, v) = (<g, e_0>, ||g - u e_0||^2) with the divisors of N - 1 and N records; ASGM (0.x)
  the likelihood ratio of the d-dimensional update of ``(sum + Z) / |B|`` over the unobserved
  batch size (the one :func:`~opacus_lastiterate.analysis.normalisation.simulate_asgm`
  computes); a step that crashed or was dropped on an empty batch scores log(1 - q);
* ``eps_audit`` is the Clopper-Pearson lower bound of
  :meth:`~opacus_lastiterate.analysis.audit.ScoreAudit.clopper_pearson` on those scores
  (thresholds chosen validly, confidence 0.95);
* ``eps_reported`` is what the release's own default accountant prints for one run;
* ``eps_corrected`` is the package's corrected accountant: the FEASGM verdict (inf when the
  divisor changes between neighbours) or the ASGM model; ``eps_config`` is the exact epsilon of
  the audited configuration (FEASGM zero-other-gradients curve at d; ASGM "batch size
  revealed", an upper bound for every d), which no valid audit of it can exceed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from opacus_lastiterate.analysis._validation import (
    check_delta,
    check_int,
    check_noise_multiplier,
    check_sample_rate,
)
from opacus_lastiterate.analysis.audit import AuditResult, ScoreAudit

__all__ = [
    "RealOpacusAudit",
    "audit_installed_opacus",
]

Mechanism = Literal["FEASGM", "ASGM"]
_STEP = 0  # opacus_probe.STATUS_STEP (that module is kept importable without this package)


def _arrays(obs: Mapping[str, Any], world: str) -> tuple[NDArray, NDArray, NDArray]:
    u = np.asarray(obs[f"{world}_u"], dtype=np.float64)
    v = np.asarray(obs[f"{world}_v"], dtype=np.float64)
    status = np.asarray(obs[f"{world}_status"], dtype=np.int64)
    if u.ndim != 2 or u.shape != v.shape or u.shape != status.shape:
        raise ValueError(f"observations of {world!r} must be 2-D arrays of one shape.")
    if np.isnan(u[status == _STEP]).any():
        raise ValueError(f"observations of {world!r} hold NaN at a released step.")
    return u, v, status


def _score(u: NDArray, v: NDArray, status: NDArray, q: float, step_loss: Any) -> NDArray:
    """Sum over steps: ``step_loss`` at released steps, log(1 - q) at empty ones."""
    out = np.full(u.shape, math.log1p(-q) if q < 1 else -math.inf)
    released = status == _STEP
    out[released] = step_loss(u[released], v[released])
    return out.sum(axis=1)


def feasgm_scores(
    obs: Mapping[str, Any], *, divisor_without: float, divisor_with: float, sample_rate: float,
    noise_multiplier: float, dimension: int,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(scores with the canary, scores without): total divisor-leak log-likelihood ratio."""
    from opacus_lastiterate.analysis.normalisation.divisor_leak import divisor_leak_loss

    q = check_sample_rate(sample_rate)

    def loss(u: NDArray, v: NDArray) -> NDArray:
        return divisor_leak_loss(
            u, v, divisor_without=divisor_without, divisor_with=divisor_with, sample_rate=q,
            noise_multiplier=noise_multiplier, dimension=dimension,
        )

    return tuple(_score(*_arrays(obs, w), q, loss) for w in ("with", "without"))  # type: ignore[return-value]


def asgm_scores(
    obs: Mapping[str, Any], *, others: int, sample_rate: float, noise_multiplier: float,
    dimension: int,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(scores with the canary, scores without): total ASGM log-likelihood ratio of the
    d-dimensional updates (the batch size is not observed)."""
    # the exact d-dimensional likelihood ratio the ASGM simulator uses
    from opacus_lastiterate.analysis.normalisation.simulation import asgm_dimension_llr

    q = check_sample_rate(sample_rate)
    s = check_noise_multiplier(noise_multiplier)

    def loss(u: NDArray, v: NDArray) -> NDArray:
        return asgm_dimension_llr(u, v, others, q, s, dimension)

    return tuple(_score(*_arrays(obs, w), q, loss) for w in ("with", "without"))  # type: ignore[return-value]


@dataclass(frozen=True)
class RealOpacusAudit:
    """The audit of one release: what it reports, what the audit shows, what is correct.

    Attributes:
        version: the Opacus release audited (its real optimizer produced the updates).
        mechanism: ``"FEASGM"`` (1.x) or ``"ASGM"`` (0.12-0.15).
        config: the configuration (data set size with the canary, batch size or sample rate,
            sigma, steps, d, delta, trials per world).
        eps_reported: the release's own default accountant, one run.
        eps_audit: the Clopper-Pearson lower bound (an :class:`AuditResult`).
        eps_corrected: the package's corrected accountant for the run (inf when unsafe).
        corrected_model: what ``eps_corrected`` is.
        eps_config: the exact epsilon of this configuration (the ceiling of any audit of it).
        config_model: what ``eps_config`` is.
        empty_steps: steps that crashed or were dropped on an empty batch, per world.
    """

    version: str
    mechanism: Mechanism
    config: dict[str, Any]
    eps_reported: float
    eps_audit: AuditResult
    eps_corrected: float
    corrected_model: str
    eps_config: float
    config_model: str
    empty_steps: dict[str, int]

    @property
    def exceeds_reported(self) -> bool:
        return self.eps_audit.epsilon > self.eps_reported

    @property
    def within_bound(self) -> bool:
        return self.eps_audit.epsilon <= min(self.eps_corrected, self.eps_config)

    def as_dict(self) -> dict[str, Any]:
        def num(x: float) -> float | str:
            return x if math.isfinite(x) else ("inf" if x > 0 else "nan")

        a = self.eps_audit
        return {
            "opacus": self.version,
            "mechanism": self.mechanism,
            "config": self.config,
            "eps_reported": num(self.eps_reported),
            "eps_audit_lower_bound": num(a.epsilon),
            "audit": {
                "method": a.method, "kind": a.kind, "confidence": a.confidence,
                "delta": a.delta, "counts": str(a.counts), "selection": a.selection,
            },
            "eps_corrected": num(self.eps_corrected),
            "corrected_model": self.corrected_model,
            "eps_config": num(self.eps_config),
            "config_model": self.config_model,
            "empty_steps": self.empty_steps,
            "exceeds_reported": self.exceeds_reported,
            "within_bound": self.within_bound,
        }

    def summary(self) -> str:
        a = self.eps_audit
        return (
            f"Opacus {self.version} ({self.mechanism}): eps_reported = {self.eps_reported:.4f}, "
            f"eps_audit >= {a.epsilon:.4f} ({a.method} {a.kind}, confidence {a.confidence:g}, "
            f"{a.counts}), eps_corrected = {self.eps_corrected:.4f} ({self.corrected_model}); "
            f"this configuration's exact epsilon {self.eps_config:.4f} ({self.config_model})"
        )


def summarise_audit(
    obs: Mapping[str, Any], *, mechanism: Mechanism, others: int, noise_multiplier: float,
    steps: int, dimension: int, delta: float = 1e-5, confidence: float = 0.95,
    batch_size: int | None = None, sample_rate: float | None = None,
) -> RealOpacusAudit:
    """Scores, audit and bounds for the observations of
    :func:`~opacus_lastiterate.auditing.opacus_releases.probe.audit_observations` (``obs`` keys
    ``{world}_{u,v,status,reported_epsilon}`` for world in "with", "without", and "opacus")."""
    n = check_int("others", others, minimum=1)
    sigma = check_noise_multiplier(noise_multiplier)
    t = check_int("steps", steps, minimum=1)
    d = check_int("dimension", dimension, minimum=2)
    delta = check_delta(delta)
    version = str(np.asarray(obs["opacus"]))
    empty = {w: int((np.asarray(obs[f"{w}_status"]) != _STEP).sum()) for w in ("with", "without")}
    config: dict[str, Any] = {
        "dataset_size_with_canary": n + 1, "noise_multiplier": sigma, "steps": t,
        "dimension": d, "delta": delta, "trials_per_world": int(np.asarray(obs["with_u"]).shape[0]),
    }
    if mechanism == "FEASGM":
        from opacus_lastiterate.analysis.normalisation.divisor_leak import (
            FEASGM_MODEL,
            divisor_leak_pld,
        )
        from opacus_lastiterate.analysis.normalisation.divisor_verdict import feasgm_verdict
        from opacus_lastiterate.analysis.normalisation.opacus_arithmetic import (
            opacus1x_batch_arithmetic,
        )

        if batch_size is None:
            raise ValueError("FEASGM: give `batch_size`.")
        without, with_ = opacus1x_batch_arithmetic(n, batch_size), opacus1x_batch_arithmetic(n + 1, batch_size)
        c1, c2, q = float(without.expected_batch_size), float(with_.expected_batch_size), with_.sampler_rate
        config.update(batch_size=batch_size, divisors=[c1, c2], sample_rate=q)
        ins, outs = feasgm_scores(
            obs, divisor_without=c1, divisor_with=c2, sample_rate=q, noise_multiplier=sigma,
            dimension=d,
        )
        from opacus_lastiterate.analysis.baselines.composition import standard_epsilon

        verdict = feasgm_verdict(n + 1, batch_size)
        if verdict.safe:
            corrected = float(standard_epsilon(delta, steps=t, sample_rate=q, noise_multiplier=sigma))
            corrected_model = "FEASGM verdict: safe (SGM, PLD)"
        else:
            corrected, corrected_model = math.inf, "FEASGM verdict: unsafe, no finite guarantee"
        pld = divisor_leak_pld(
            divisor_without=c1, divisor_with=c2, sample_rate=q, noise_multiplier=sigma,
            dimension=d, steps=t,
        )
        eps_config = float(pld.get_epsilon_for_delta(delta))
        config_model = FEASGM_MODEL.format(dimension=d)
    else:
        from opacus_lastiterate.analysis.normalisation import asgm_epsilon
        from opacus_lastiterate.analysis.normalisation.asgm import ASGM_MODEL, asgm_pld

        if sample_rate is None:
            raise ValueError("ASGM: give `sample_rate`.")
        q = check_sample_rate(sample_rate)
        config.update(sample_rate=q)
        ins, outs = asgm_scores(obs, others=n, sample_rate=q, noise_multiplier=sigma, dimension=d)
        corrected = float(asgm_epsilon(
            delta, dataset_size=n + 1, sample_rate=q, noise_multiplier=sigma, steps=t
        ))
        corrected_model = f"{ASGM_MODEL}, worst of both neighbours of N = {n + 1}"
        pld = asgm_pld(other_records=n, sample_rate=q, noise_multiplier=sigma, steps=t)
        eps_config = float(pld.get_epsilon_for_delta(delta))
        config_model = f"{ASGM_MODEL}, this pair ({n} others)"
    audit = ScoreAudit(ins, outs).clopper_pearson(delta=delta, confidence=confidence)
    return RealOpacusAudit(
        version=version, mechanism=mechanism, config=config,
        eps_reported=float(np.asarray(obs["with_reported_epsilon"])), eps_audit=audit,
        eps_corrected=corrected, corrected_model=corrected_model, eps_config=eps_config,
        config_model=config_model, empty_steps=empty,
    )


def audit_installed_opacus(
    *, trials: int, steps: int = 10, dimension: int = 100, others: int = 99, batch_size: int = 10,
    noise_multiplier: float = 2.0, delta: float = 1e-5, seed: int = 0,
) -> RealOpacusAudit:
    """FEASGM audit of the installed Opacus 1.x in the worst case: ``others`` records with
    zero gradient, L = ``batch_size`` (defaults: N = 100 with the canary, L = 10, so the
    divisor is 10 with the canary and 9 without; q = 0.1 in both)."""
    import opacus

    from opacus_lastiterate.auditing.opacus_releases.probe import (
        api_generation,
        audit_observations,
        installed_version,
    )

    if api_generation(installed_version(opacus)) != "make_private":
        raise ValueError("audit_installed_opacus audits Opacus 1.x (make_private).")
    obs: dict[str, Any] = {}
    for world, with_canary in (("with", True), ("without", False)):
        o = audit_observations(
            with_canary=with_canary, trials=trials, steps=steps, dimension=dimension,
            others=others, batch_size=batch_size, noise_multiplier=noise_multiplier,
            seed=seed + (1 if with_canary else 0),
        )
        for key in ("u", "v", "status", "reported_epsilon"):
            obs[f"{world}_{key}"] = o[key]
        obs["opacus"] = o["opacus"]
    return summarise_audit(
        obs, mechanism="FEASGM", others=others, noise_multiplier=noise_multiplier, steps=steps,
        dimension=dimension, delta=delta, batch_size=batch_size,
    )
