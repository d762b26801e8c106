"""Gradient-space attacks on DP-SGD's final model, simulated in numpy (few coordinates).

- :mod:`.canaries`: gradient canaries (Dirac A_GC-R, simulated coordinate A_GC-S, random
  direction) with craft / insert / score, for numpy arrays and torch tensors;
- :mod:`.insertion`: Poisson-sampled or every-k-steps canary insertion;
- :mod:`.adversaries`: adversarial data set (other gradients zero), A_S^{h*} (worst-case
  landscape after one insertion, Cebere et al.), malicious data set (last-iterate paper,
  Appendix C);
- :mod:`.arithmetic`: one DP-SGD step as configured (SGM / EASGM / ASGM);
- :mod:`.simulator`: vectorised, seeded simulation of the attacks, plus :func:`audit_scores`;
- :mod:`.exact`: the exact epsilons of those attacks' test statistics
  (``docs/audit_reproductions.md``).

numpy and scipy only; names resolve lazily on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opacus_lastiterate._lazy import lazy_attributes

if TYPE_CHECKING:
    from opacus_lastiterate.auditing.gradient_space.adversaries import (
        AdversarialDataset,
        MaliciousDataset,
    )
    from opacus_lastiterate.auditing.gradient_space.arithmetic import (
        DPSGDArithmetic,
    )
    from opacus_lastiterate.auditing.gradient_space.canaries import (
        DiracCanary,
        DiracCanaryAdversary,
        SimulatedCoordinateAdversary,
    )
    from opacus_lastiterate.auditing.gradient_space.exact import (
        ExactEpsilon,
        malicious_dataset_epsilon,
        malicious_dataset_test_rates,  # the names resolved lazily by __getattr__, for type checkers and IDEs
    )
    from opacus_lastiterate.auditing.gradient_space.insertion import (
        Insertion,
        PoissonInsertion,
    )
    from opacus_lastiterate.auditing.gradient_space.simulator import (
        SimulatedAudit,
        audit_scores,
        simulate_adversarial_dataset,
        simulate_malicious_dataset,
    )

_LAZY: dict[str, str] = {
    "malicious_dataset_test_rates": "exact",
    "AdversarialDataset": "adversaries",
    "DPSGDArithmetic": "arithmetic",
    "DiracCanary": "canaries",
    "DiracCanaryAdversary": "canaries",
    "ExactEpsilon": "exact",
    "Insertion": "insertion",
    "MaliciousDataset": "adversaries",
    "PoissonInsertion": "insertion",
    "SimulatedAudit": "simulator",
    "SimulatedCoordinateAdversary": "canaries",
    "audit_scores": "simulator",
    "malicious_dataset_epsilon": "exact",
    "simulate_adversarial_dataset": "simulator",
    "simulate_malicious_dataset": "simulator",
}
"""Public name -> defining submodule; resolved on first access."""

__all__ = [
    "AdversarialDataset",
    "DPSGDArithmetic",
    "DiracCanary",
    "DiracCanaryAdversary",
    "ExactEpsilon",
    "Insertion",
    "MaliciousDataset",
    "PoissonInsertion",
    "SimulatedAudit",
    "SimulatedCoordinateAdversary",
    "audit_scores",
    "malicious_dataset_epsilon",
    "malicious_dataset_test_rates",
    "simulate_adversarial_dataset",
    "simulate_malicious_dataset",
]

__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, globals())
