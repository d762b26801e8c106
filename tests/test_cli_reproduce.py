"""``opacus-lastiterate reproduce``: the printed and JSON numbers are the analysis functions'
numbers, and the picture is written where --plot (or the default) says."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opacus_lastiterate.analysis import full_batch_epsilon, standard_epsilon
from opacus_lastiterate.analysis.privacy_models import privacy_model
from opacus_lastiterate.analysis.run import DPSGDRun
from opacus_lastiterate.cli import main
from opacus_lastiterate.figures import FIGURES
from tests.analysis._reference import ClosedFormMixture, gaussian_mechanism_epsilon

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 10_000


# Opacus's PRV accountant brackets the tight standard epsilon: with eps_error e and
# delta_error = delta / 1000 it returns eps_upper = eps(delta - delta_error) + e >= the true
# epsilon >= eps(delta + delta_error) - e (Gopi, Lee, Wutschitz 2021, as implemented in
# opacus.accountants.analysis.prv); the two eps(.) differ by far less than 1e-3 here.
PRV_ERROR = 0.01


def _prv_upper(steps: int, sample_rate: float, noise_multiplier: float, delta: float) -> float:
    from opacus.accountants import PRVAccountant

    prv = PRVAccountant()
    prv.history = [(noise_multiplier, sample_rate, steps)]
    return prv.get_epsilon(delta, eps_error=PRV_ERROR)


def _check_fig1_row(row: dict, delta: float, *, robust_up_to: int, prv: bool) -> None:
    """One row of Figure 1 against computations independent of the package: the heuristic
    by the closed-form hockey-stick of Binomial(T, q) + N(0, sigma^2 T) vs N(0, sigma^2 T)
    (tests/analysis/_reference.py), the robust value as the max of those over t <= T (when
    T <= ``robust_up_to``; a lower bound from t in {1, 3, 10, ...} otherwise), full batch by
    the Gaussian mechanism's closed form at mu = q sqrt(T) / sigma, and (``prv``) the
    standard epsilon inside Opacus's PRV bracket."""
    t_max, q, sigma = row["steps"], row["sample_rate"], row["noise_multiplier"]

    def eps_t(t: int) -> float:
        return ClosedFormMixture.binomial(t, q, sigma).epsilon(delta)

    assert row["heuristic"] == pytest.approx(eps_t(t_max), rel=1e-9)
    if t_max <= robust_up_to:
        robust = max(eps_t(t) for t in range(1, t_max + 1))
        assert robust * (1 - 1e-9) <= row["robust_heuristic"] <= robust * (1 + 1e-6)
    else:
        some = max(eps_t(t) for t in (1, 3, 10, 30, 100, 300, t_max) if t <= t_max)
        assert row["robust_heuristic"] >= some * (1 - 1e-9)
    mu = q * math.sqrt(t_max) / sigma
    assert row["full_batch"] == pytest.approx(gaussian_mechanism_epsilon(mu, delta), rel=1e-9)
    if prv:
        upper = _prv_upper(t_max, q, sigma, delta)
        assert upper - 2 * PRV_ERROR - 1e-3 <= row["standard"] <= upper


def _fig1_json(capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    assert main(["reproduce", "last-iterate-fig1", "--quick", "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_fig1_json_values_are_the_epsilons_and_the_png_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "fig1.png"
    out = _fig1_json(capsys, "--plot", str(png))
    assert out["figure"] == "last-iterate-fig1" and out["plot"] == str(png) and _is_png(png)
    delta, interval = out["settings"]["delta"], out["settings"]["value_discretization_interval"]
    assert delta == 1e-6
    regimes = {(r["sample_rate"], r["noise_multiplier"]) for r in out["rows"]}
    assert len(regimes) == 3 and len(out["rows"]) == 3 * len(out["settings"]["steps"])
    for row in out["rows"]:
        # independent values (PRV, seconds each, at one T per regime here; all rows: slow)
        _check_fig1_row(row, delta, robust_up_to=10, prv=row["steps"] == 100)
        # the CLI prints the analysis functions' numbers
        kw = {"steps": row["steps"], "sample_rate": row["sample_rate"],
              "noise_multiplier": row["noise_multiplier"]}
        assert row["heuristic"] == privacy_model("heuristic", DPSGDRun.constant(**kw)).epsilon(delta)
        assert row["robust_heuristic"] == privacy_model("robust_heuristic", DPSGDRun.constant(**kw)).epsilon(delta)
        assert row["standard"] == standard_epsilon(
            delta, value_discretization_interval=interval, **kw
        )
        assert row["full_batch"] == full_batch_epsilon(delta, **kw)
        # the ordering the paper describes: standard (all iterates) >= heuristic
        assert row["standard"] >= row["heuristic"] * (1 - 1e-9)
    # the paper's worked example, q = 0.1, sigma = 1, delta = 1e-6: T = 1 -> 2.182, T = 3 -> 2.222
    example = {r["steps"]: r["heuristic"] for r in out["rows"]
               if (r["sample_rate"], r["noise_multiplier"]) == (0.1, 1.0)}
    assert round(example[1], 3) == 2.182 and round(example[3], 3) == 2.222
    # panel (c) is the non-monotone regime: eps_T falls below eps_1, the robust value does not
    c_rows = [r for r in out["rows"] if (r["sample_rate"], r["noise_multiplier"]) == (0.01, 0.5)]
    assert min(r["heuristic"] for r in c_rows) < c_rows[0]["heuristic"]
    assert all(r["robust_heuristic"] >= c_rows[0]["heuristic"] for r in c_rows)


@pytest.mark.slow
def test_fig1_every_row_against_independent_computations(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = _fig1_json(capsys, "--no-plot")
    for row in out["rows"]:
        _check_fig1_row(row, out["settings"]["delta"], robust_up_to=1000, prv=True)


def test_fig1_table_prints_the_same_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reproduce", "last-iterate-fig1", "--quick", "--no-plot"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    for q, sigma in ((0.01, 1.0), (0.1, 1.0), (0.01, 0.5)):
        assert f"q = {q:g}, sigma = {sigma:g}" in text
        for t in (1, 1000):
            kw = {"steps": t, "sample_rate": q, "noise_multiplier": sigma}
            values = [
                f"{privacy_model('heuristic', DPSGDRun.constant(**kw)).epsilon(1e-6):.4f}",
                f"{standard_epsilon(1e-6, value_discretization_interval=1e-3, **kw):.4f}",
                f"{full_batch_epsilon(1e-6, **kw):.4f}",
            ]
            assert any(line.split()[:1] == [str(t)] and all(v in line.split() for v in values)
                       for line in lines), (q, sigma, t)
    assert "not a proven bound for deep networks" in text and "saved plot" not in text


def test_default_plot_goes_to_the_current_folder(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                                     os.environ.get("PYTHONPATH")])))
    result = subprocess.run(
        [sys.executable, "-m", "opacus_lastiterate", "reproduce", "last-iterate-fig5", "--quick"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert _is_png(tmp_path / "last-iterate-fig5.png")
    assert "saved plot: last-iterate-fig5.png" in result.stdout


def test_plot_to_a_folder_and_bad_plot_names(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("matplotlib")
    assert main(["reproduce", "last-iterate-fig5", "--quick", "--plot", f"{tmp_path}/"]) == 0
    assert _is_png(tmp_path / "last-iterate-fig5.png")
    capsys.readouterr()
    for bad in (str(tmp_path / "no-suffix"), str(tmp_path / "picture.txt")):
        with pytest.raises(SystemExit) as stop:
            main(["reproduce", "last-iterate-fig5", "--quick", "--plot", bad])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert "Invalid value for '--plot'" in err and ".png" in err
    with pytest.raises(SystemExit):
        main(["reproduce", "last-iterate-fig5", "--quick", "--full"])
    assert "at most one of --quick and --full" in capsys.readouterr().err


def test_wrapper_script_out_is_a_folder(tmp_path: Path) -> None:
    """reproductions/*.py --out DIR saves DIR/<script>.png (it used to take DIR as a file)."""
    pytest.importorskip("matplotlib")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                                     os.environ.get("PYTHONPATH")])))
    script = REPO / "reproductions" / "last_iterate_figure5.py"
    result = subprocess.run(
        [sys.executable, str(script), "--quick", "--out", str(tmp_path / "figs")],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert _is_png(tmp_path / "figs" / "last_iterate_figure5.png")


def test_every_figure_has_a_command_and_a_wrapper_script(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["reproduce", "--help"]) == 0
    text = capsys.readouterr().out
    for name in FIGURES:
        assert name in text
    wrappers = {p.read_text() for p in (REPO / "reproductions").glob("*.py")}
    for name in FIGURES:
        assert any(f'run_figure("{name}"' in w for w in wrappers), name
