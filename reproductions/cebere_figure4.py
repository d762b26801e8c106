"""Cebere et al., Figure 4: canary at step 1 only, eps_25 / eps_1 against the batch size.

Thin wrapper of ``opacus-lastiterate reproduce cebere-fig4``; the computation and its settings
are in ``opacus_lastiterate.figures`` (module docstring of the figure).

    python reproductions/cebere_figure4.py [--quick | --full] [--out DIR] [--no-plot] [--json]
"""

from _cli import run_figure

if __name__ == "__main__":
    run_figure("cebere-fig4", __file__)
