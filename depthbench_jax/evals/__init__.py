"""Domain evaluation: teacher-forced NLL on coding/STEM/math sets plus task scores.

``datasets`` (local published files), ``scoring`` (model log-probs, greedy completions),
``tasks`` (per-set metrics), ``sandbox`` (running generated code), ``report_section``
(``evals_table``, the report's section). CLI: ``python -m depthbench_jax.evaluate``.
"""

from depthbench_jax.evals.report_section import evals_table

__all__ = ["evals_table"]
