"""The mathematics of the last-iterate heuristic (``docs/last_iterate.md``).

* :mod:`.gaussian_mixture`: the exact hockey-stick engine for a mixture of shifted
  Gaussians against one Gaussian; :mod:`.canary_count`: how often the canary is sampled.
* :mod:`.heuristic_pair`: the constant-rate heuristic pair, its epsilon and delta (the
  engine shared by the modules below);
* :mod:`.heuristic`: the heuristic and its robust variant as privacy models;
  :mod:`.weighted_heuristic` and :mod:`.optimizer_weights`: learning-rate schedules and
  momentum; :mod:`.suffix_maximum`: the certified maximum over suffixes.
* :mod:`.incremental`: per-step accounting of a growing run.
* :mod:`.counterexamples`: analysers of the known counterexamples.
"""
