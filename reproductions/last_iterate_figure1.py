"""Last-iterate paper, Figure 1: heuristic, standard and full-batch epsilon against T.

Thin wrapper of ``opacus-lastiterate reproduce last-iterate-fig1``; the computation and its settings
are in ``opacus_lastiterate.figures`` (module docstring of the figure).

    python reproductions/last_iterate_figure1.py [--quick | --full] [--out DIR] [--no-plot] [--json]
"""

from _cli import run_figure

if __name__ == "__main__":
    run_figure("last-iterate-fig1", __file__)
