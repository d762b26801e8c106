"""Last-iterate paper, Figure 3: Dirac gradient canary with an adversarial data set (simulated audit).

Thin wrapper of ``opacus-lastiterate reproduce last-iterate-fig3``; the computation and its settings
are in ``opacus_lastiterate.figures`` (module docstring of the figure).

    python reproductions/last_iterate_figure3.py [--quick | --full] [--out DIR] [--no-plot] [--json]
"""

from _cli import run_figure

if __name__ == "__main__":
    run_figure("last-iterate-fig3", __file__)
