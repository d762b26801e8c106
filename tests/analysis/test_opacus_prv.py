"""The release table's "reported" epsilon for the PRV releases is what Opacus prints.

``analysis.opacus_prv`` re-runs Opacus's ``PRVAccountant`` arithmetic without Opacus; here
it is compared with Opacus's own ``PRVAccountant.get_epsilon`` (the installed release, 1.6.0
in the default environment) at five (q, sigma, T, delta) and a two-segment history, to 1e-6,
and the table's ``reported_epsilon`` of 1.6.0 with the same printout for a training
configuration.
"""

from __future__ import annotations

import pytest

from opacus_lastiterate.analysis.opacus_prv import opacus_prv_epsilon
from opacus_lastiterate.analysis.opacus_releases import installed_release
from opacus_lastiterate.analysis.opacus_versions import (
    VersionConfig,
    prv_variant,
    release,
    reported_epsilon,
)

SETTINGS = [  # (q, sigma, T, delta)
    (0.01, 1.1, 1000, 1e-5),  # the issue's setting: Opacus prints 1.5255
    (0.05, 0.8, 300, 1e-6),
    (0.001, 2.0, 10000, 1e-5),
    (0.1, 1.0, 50, 1e-3),
    (0.02, 1.5, 2000, 1e-7),
]


def _opacus_prv(history, delta: float) -> float:
    accountants = pytest.importorskip("opacus.accountants")
    rel = installed_release()
    if rel is None or rel.default_accountant != "prv":
        pytest.skip("needs an installed Opacus release with PRVAccountant (1.3.0+)")
    acc = accountants.PRVAccountant()
    acc.history = list(history)
    return float(acc.get_epsilon(delta))


def _variant() -> str:
    pytest.importorskip("opacus")  # the installed release (absent from the light install)
    rel = installed_release()
    assert rel is not None
    return prv_variant(rel)


@pytest.mark.parametrize(("q", "sigma", "steps", "delta"), SETTINGS)
def test_reimplementation_matches_opacus_prv_accountant(q, sigma, steps, delta) -> None:
    printed = _opacus_prv([(sigma, q, steps)], delta)
    ours = opacus_prv_epsilon([(sigma, q, steps)], delta, variant=_variant())
    assert ours == pytest.approx(printed, abs=1e-6)


def test_reimplementation_matches_a_heterogeneous_history() -> None:
    history = [(1.1, 0.01, 500), (0.9, 0.02, 300)]
    assert opacus_prv_epsilon(history, 1e-5, variant=_variant()) == pytest.approx(
        _opacus_prv(history, 1e-5), abs=1e-6
    )


def test_reported_column_is_what_opacus_prints() -> None:
    """q = 1/len(DPDataLoader) = 1/10, 30 steps: Opacus 1.6's printout, not the PLD value."""
    config = VersionConfig(1000, 100, 1.1, 1e-5, epochs=None, steps=30)
    printed = _opacus_prv([(1.1, 0.1, 30)], 1e-5)
    assert reported_epsilon("1.6.0", config) == pytest.approx(printed, abs=1e-6)


def test_the_issue_setting_is_no_longer_off_by_eps_error() -> None:
    """q = 0.01, sigma = 1.1, T = 1000, delta = 1e-5: Opacus 1.6 prints 1.5255 (its upper
    end: estimate + eps_error); the exact PLD epsilon is 1.5154."""
    value = opacus_prv_epsilon([(1.1, 0.01, 1000)], 1e-5)
    assert value == pytest.approx(1.5255, abs=5e-5)


def test_variants_and_validation() -> None:
    assert prv_variant(release("1.3.0")) == prv_variant(release("1.4.0")) == "1.3"
    assert prv_variant(release("1.4.1")) == prv_variant(release("1.6.0")) == "1.4.1"
    with pytest.raises(ValueError, match="variant"):
        opacus_prv_epsilon([(1.0, 0.1, 5)], 1e-5, variant="2.0")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="segment"):
        opacus_prv_epsilon([(0.0, 0.1, 5)], 1e-5)
    with pytest.raises(ValueError, match="history"):
        opacus_prv_epsilon([], 1e-5)
    with pytest.raises(ValueError, match="delta"):
        opacus_prv_epsilon([(1.0, 0.1, 5)], 0.0)
