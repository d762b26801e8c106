"""Run one figure of ``opacus-lastiterate reproduce`` as a script of this folder.

The figures live in :mod:`opacus_lastiterate.figures`; each script here is a thin wrapper:

    python reproductions/SCRIPT.py [--quick | --full] [--out DIR] [--no-plot] [--json] [...]

``--out DIR`` is a folder: the picture is saved as ``DIR/SCRIPT.png`` (default
``reproductions/output/``); DIR is created if its parent exists. Every other option (``--trials``, ``--seed``, ...) is passed on to
``opacus-lastiterate reproduce FIGURE``; ``--help`` lists them.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from opacus_lastiterate.cli import main

DEFAULT_OUT = Path(__file__).resolve().parent / "output"


def run_figure(figure: str, script: str) -> None:
    """Parse this script's options and exit with ``opacus-lastiterate reproduce figure``."""
    stem = Path(script).stem
    parser = argparse.ArgumentParser(
        add_help=False,
        description=f"Thin wrapper of `opacus-lastiterate reproduce {figure}`; other options "
        "are passed on to it (see `opacus-lastiterate reproduce "
        f"{figure} --help`).",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, metavar="DIR",
                        help=f"folder of the picture, saved as DIR/{stem}.png")
    parser.add_argument("--no-plot", action="store_true", help="print the numbers only")
    args, rest = parser.parse_known_args()
    if "-h" in rest or "--help" in rest:
        parser.print_help()
        print(f"\nOptions of `opacus-lastiterate reproduce {figure}`:\n", flush=True)
    if not args.no_plot and importlib.util.find_spec("matplotlib") is None:
        print("note: matplotlib is not installed; numbers printed, plot skipped "
              "(pip install matplotlib, or pass --no-plot).")
        args.no_plot = True
    if not args.no_plot and not args.out.exists() and args.out.parent.is_dir():
        args.out.mkdir()  # the folder named by --out, not the folders above it
    plot = ["--no-plot"] if args.no_plot else ["--plot", str(args.out / f"{stem}.png")]
    sys.exit(main(["reproduce", figure, *plot, *rest]))
