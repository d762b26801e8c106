"""Command-line interface: ``opacus-lastiterate`` (or ``python -m opacus_lastiterate``),
built on click (``docs/cli.md``). Its Python face is :func:`main` (what the console script
runs); one private module per command.

Commands::

    epsilon           heuristic, robust, standard and full-batch epsilon of one configuration;
                      delta at an epsilon; the noise multiplier for a target epsilon
    plan              batch sizes with equal heuristic epsilon (the last-iterate paper's Table 1)
    normalisation     Opacus 1.x divisor verdict: SGM, FEASGM (corrected, curve) and ASGM
    compare-versions  one row per Opacus release 0.9.0-1.6.0: reported vs corrected epsilon
    counterexample    the quadratic-regulariser counterexample beside the heuristic
    audit             re-audit a run-records file, or run the digits audit
    reproduce         the papers' figures and tables (numbers and a PNG)

The pure-math commands (epsilon, plan, normalisation, compare-versions, counterexample)
import neither torch nor opacus; every module here imports only click at start-up.
"""

from opacus_lastiterate.cli._app import main

__all__ = ["main"]
