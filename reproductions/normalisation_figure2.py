"""Normalisation paper (arXiv 2605.15648), Figure 2: audited delta(0) against N, d = 100.

Thin wrapper of ``opacus-lastiterate reproduce normalisation-fig2``; the computation and its settings
are in ``opacus_lastiterate.figures`` (module docstring of the figure).

    python reproductions/normalisation_figure2.py [--quick | --full] [--out DIR] [--no-plot] [--json]
"""

from _cli import run_figure

if __name__ == "__main__":
    run_figure("normalisation-fig2", __file__)
