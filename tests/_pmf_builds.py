"""Count the one-step PLD builds of ``pld_composition`` (the work a composition does)."""

from __future__ import annotations

from typing import Any

from opacus_lastiterate.analysis.baselines import pld_composition


def record_pmf_builds(monkeypatch: Any) -> list[tuple[tuple[Any, ...], Any]]:
    """Patch ``pld_composition.subsampled_gaussian_pmfs`` to append ``(args, (remove, add))``
    of each build to the returned list, which grows as compositions run."""
    builds: list[tuple[tuple[Any, ...], Any]] = []
    real = pld_composition.subsampled_gaussian_pmfs

    def counted(*args: Any) -> Any:
        builds.append((args, real(*args)))
        return builds[-1][1]

    monkeypatch.setattr(pld_composition, "subsampled_gaussian_pmfs", counted)
    return builds
