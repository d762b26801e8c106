"""Last-iterate paper, Figure 5: quadratic-regulariser counterexample against the robust heuristic.

Thin wrapper of ``opacus-lastiterate reproduce last-iterate-fig5``; the computation and its settings
are in ``opacus_lastiterate.figures`` (module docstring of the figure).

    python reproductions/last_iterate_figure5.py [--quick | --full] [--out DIR] [--no-plot] [--json]
"""

from _cli import run_figure

if __name__ == "__main__":
    run_figure("last-iterate-fig5", __file__)
