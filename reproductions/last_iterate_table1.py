"""Last-iterate paper, Table 1: batch sizes with about equal heuristic epsilon.

Thin wrapper of ``opacus-lastiterate reproduce last-iterate-table1``; the computation and its settings
are in ``opacus_lastiterate.figures`` (module docstring of the figure).

    python reproductions/last_iterate_table1.py [--quick | --full] [--out DIR] [--no-plot] [--json]
"""

from _cli import run_figure

if __name__ == "__main__":
    run_figure("last-iterate-table1", __file__)
