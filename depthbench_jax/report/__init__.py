"""The scorecard report: ``python -m depthbench_jax.report RESULTS_DIR``.

Reads every ``RUN/summary.json`` under RESULTS_DIR (recursively), picks the best LR per
(design, shape) from the final val loss (diverged runs are marked and excluded), and writes

    RESULTS_DIR/report.md                      the paper's table + per-shape LR table
    RESULTS_DIR/runs.csv                       every run, one row each
    RESULTS_DIR/plots/loss_vs_aspect_<design>.png, plots/loss_vs_aspect_all.png

With ``--config=SUITE.py`` it also reads the sweep's plan (``report/plan.py``): progress, the
planned runs not started yet, and run folders the suite does not list.

Optional sections come from the post-hoc modules when they exist and some run carries their file
(looked up in ``depthbench_jax.<pkg>``, then ``.report``, then ``.report_section``):
``depthbench_jax.diagnostics.diagnostics_table(runs)`` (``diagnostics.json``),
``depthbench_jax.evals.evals_table(runs)`` (``evals.json``) and
``depthbench_jax.systems.systems_table(runs)``; each takes every run record (dicts: the summary
plus ``workdir``; it skips those without its file, and its best-LR runs are the scorecard's) and
``relative_to`` (the report's folder, for links to the runs' files) and returns markdown, or
None to skip.
"""

from depthbench_jax.report.scorecard import (build_report, collect_runs, depth_trend,
                                             scorecard_rows, write_report)

__all__ = ["build_report", "collect_runs", "depth_trend", "scorecard_rows", "write_report"]
