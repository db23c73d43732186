"""Layer diagnostics (DepthBench): angular distance, causal and permutation scores, the shares of
late pairs above thresholds, HC/mHC mixing effective rank, Block AttnRes dead prefix.

``metrics``   pure functions on arrays, with the definitions and choices in its docstring
``probes``    the model passes (one clean pass; vmapped gate and swap batches), ``Probes.run``
``periodic``  ``DiagnosticsHook`` for the training loop; ``plots`` heatmaps; ``report_section``

Post hoc: ``python -m depthbench_jax.diagnose --workdir=RUN_DIR``.
"""


def diagnostics_table(runs, relative_to=None):
  """The scorecard's hook (``report/scorecard.py``): run records (dicts with ``workdir``) ->
  the table of every run, the share-by-depth pivots and each design's deepest-run heatmaps of
  the best-LR runs only (``sweep.best_lr_runs``; paths relative to ``relative_to``, the
  report's folder, else absolute); None if none has a ``diagnostics.json``."""
  from depthbench_jax import sweep
  from depthbench_jax.diagnostics import report_section
  pairs = report_section.as_runs(runs)  # reads each run's diagnostics.json, once
  if not pairs:
    return None
  best = sweep.best_lr_runs(list(runs))
  return report_section.section(pairs, relative_to, heading=False, heatmap_runs="deepest",
                                which=("causal", "permutation"),
                                best=[p for p in pairs if any(p[0] is b for b in best)],
                                records=list(runs))
