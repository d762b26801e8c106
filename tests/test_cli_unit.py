"""``opacus-lastiterate epsilon --records-per-user K`` / ``--group-size K``: the numbers of the
unit, labelled, against the independent references of tests/analysis/test_user_level.py
(enumeration of every sampling outcome, dp_accounting's mixture-of-Gaussians accountant)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation
from scipy import stats

from opacus_lastiterate.cli import main
from tests.analysis._reference import ClosedFormMixture
from tests.analysis.test_user_level import (
    DELTA,
    _epochs,
    _exact_epsilon,
    _poisson_law,
    _product,
    _shuffled_epoch_law,
)

STEPS, Q, SIGMA, K, INTERVAL = 4, 0.3, 0.7, 2, 1e-2
BASE = [
    "epsilon", "--steps", str(STEPS), "--sample-rate", str(Q), "--noise-multiplier", str(SIGMA),
    "--value-discretization-interval", str(INTERVAL),
]


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _mixture_accountant() -> pld_privacy_accountant.PLDAccountant:
    accountant = pld_privacy_accountant.PLDAccountant(
        NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=INTERVAL
    )
    counts = np.arange(K + 1)
    event = dp_event.MixtureOfGaussiansDpEvent(
        SIGMA, counts.astype(float).tolist(), stats.binom.pmf(counts, K, Q).tolist()
    )
    accountant.compose(dp_event.SelfComposedDpEvent(event, STEPS))
    return accountant


@pytest.mark.parametrize(("flag", "kind"), [("--records-per-user", "user"), ("--group-size", "group")])
def test_epsilon_of_a_unit_matches_the_references(flag: str, kind: str, capsys) -> None:  # type: ignore[no-untyped-def]
    out = _json(capsys, *BASE, "--delta", str(DELTA), flag, str(K))
    assert out["privacy_unit"] == {"kind": kind, "max_records": K}
    assert set(out) >= {"heuristic", "standard"} and "robust_heuristic" not in out
    exact = _exact_epsilon(_poisson_law(np.ones(STEPS), Q, K), SIGMA * math.sqrt(STEPS))
    assert out["heuristic"] == pytest.approx(exact, rel=1e-8)
    assert out["standard"] == pytest.approx(_mixture_accountant().get_epsilon(DELTA), rel=1e-6)
    words = "user-level, 2 records" if kind == "user" else "group of 2 records"
    assert all(words in label for label in out["labels"].values())
    record = _json(capsys, *BASE, "--delta", str(DELTA))
    assert out["heuristic"] > 1.5 * record["heuristic"]


def test_delta_of_a_user_matches_the_references(capsys) -> None:  # type: ignore[no-untyped-def]
    out = _json(capsys, *BASE, "--epsilon", "3", "--records-per-user", str(K))
    law = _poisson_law(np.ones(STEPS), Q, K)
    shifts = np.array(list(law))
    exact = ClosedFormMixture(shifts, np.array([law[x] for x in shifts]), SIGMA * math.sqrt(STEPS))
    assert out["quantity"] == "delta" and out["heuristic"] == pytest.approx(exact.delta(3.0), rel=1e-6)
    assert out["standard"] == pytest.approx(_mixture_accountant().get_delta(3.0), rel=1e-6)


def test_shuffled_user_matches_every_permutation(capsys) -> None:  # type: ignore[no-untyped-def]
    n, b, steps, sigma = 6, 2, 6, 0.6
    out = _json(capsys, "epsilon", "--steps", str(steps), "--sample-rate", str(b / n),
                "--noise-multiplier", str(sigma), "--delta", str(DELTA), "--sampling",
                "shuffled", "--dataset-size", str(n), "--records-per-user", str(K))
    laws = [_shuffled_epoch_law(n, b, False, K, e) for e in _epochs(np.ones(steps), n // b)]
    exact = _exact_epsilon(_product(laws), sigma * math.sqrt(steps))
    assert out["heuristic"] == pytest.approx(exact, rel=1e-8)
    assert out["sampling"]["name"] == "shuffled" and "shuffled" in out["labels"]["heuristic"]


def test_text_output_names_the_unit(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main([*BASE, "--delta", str(DELTA), "--records-per-user", str(K)]) == 0
    text = capsys.readouterr().out
    assert "privacy unit: one user with at most 2 records" in text
    assert text.count("user-level, 2 records") == 2


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--delta", "1e-5", "--records-per-user", "2", "--group-size", "2"], "at most one"),
        (["--delta", "1e-5", "--records-per-user", "0"], "--records-per-user"),
        (["--delta", "1e-5", "--records-per-user", "2", "--target-epsilon", "2"],
         "--target-epsilon"),
        (["--records-per-user", "2"], "exactly one of"),
    ],
)
def test_unit_usage_errors(extra, message, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as stop:
        main([*BASE, *extra])
    assert stop.value.code == 2
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""
