"""The numbers printed beside the heuristic (``docs/last_iterate.md``, "Baselines"):
standard composition (every iterate released, :mod:`.composition`) and full-batch DP-GD
(closed-form Gaussian differential privacy, :mod:`.gaussian_mechanism`)."""
