"""What each Opacus release (0.9.0 to 1.6.0) would report for one training configuration.

For the digits training of ``train_digits.py`` (N = 1437 training records, batch size 64,
sigma = 1, 5 epochs) the table gives, per release: the mechanism its optimiser really runs
(SGM, or a normalised EASGM / FEASGM / ASGM), the epsilon the release itself prints, the
corrected epsilon (``docs/opacus_versions.md``), the last-iterate heuristic, and warnings.
Change the configuration with the options; ``opacus-lastiterate compare-versions`` is the
same on the command line.

    python examples/compare_opacus_versions.py
    python examples/compare_opacus_versions.py --dataset-size 9300 --batch-size 100 --dimension 1000
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from opacus_lastiterate.analysis import VersionConfig, compare_versions


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--dataset-size", type=int, default=1437, help="N = len(dataset)")
    parser.add_argument("--batch-size", type=int, default=64, help="DataLoader batch size")
    parser.add_argument("--noise-multiplier", type=float, default=1.0, help="sigma")
    parser.add_argument("--epochs", type=int, default=5, help="epochs")
    parser.add_argument("--delta", type=float, default=1e-5, help="delta")
    parser.add_argument("--dimension", type=int, default=None, help="trainable parameters d")
    parser.add_argument("--versions", default=None, help="A..B, A,B or one version (default all)")
    parser.add_argument("--out", type=Path, default=None, help="folder for versions.json")
    parser.add_argument("--quick", action="store_true", help="three releases only (CI)")
    args = parser.parse_args()
    config = VersionConfig(
        dataset_size=args.dataset_size, batch_size=args.batch_size,
        noise_multiplier=args.noise_multiplier, delta=args.delta, epochs=args.epochs,
        dimension=args.dimension,
    )
    versions = "0.14.0,1.0.0,1.6.0" if args.quick else args.versions
    rows = compare_versions(config, versions)
    print(f"N = {args.dataset_size}, batch size {args.batch_size}, sigma = "
          f"{args.noise_multiplier:g}, {args.epochs} epochs, delta = {args.delta:g}")
    print(f"{'release':>8} {'mechanism':>10} {'reported':>9} {'corrected':>10} {'heuristic':>10}"
          "  warnings")
    for row in rows:
        d = row.as_dict()
        print(f"{d['version']:>8} {d['mechanism']:>10} {d['reported']:>9.3f} "
              f"{d['corrected']:>10.3f} {d['heuristic']:>10.3f}  {'; '.join(d['warnings'])}")
    print("reported: the release's own accountant; corrected: this package's accountant for the "
          "mechanism the release runs (inf: no guarantee; docs/opacus_versions.md says what each "
          "model covers); heuristic: final model only, not a proven bound")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "versions.json").write_text(
            json.dumps([r.as_dict() for r in rows], indent=1, default=str)
        )


if __name__ == "__main__":
    main()
