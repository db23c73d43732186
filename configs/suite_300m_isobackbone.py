"""Control: iso-backbone sweep (~300M class). The non-embedding count is fixed, not the total.

    launch/run_sweep.sh configs/suite_300m_isobackbone.py [--dry_run]

The paper's control holds the backbone fixed, so the embedding is not what the depth-width
trade moves; deep-narrow shapes then have a smaller total count (a thinner embedding table)
and any loss gain comes from the split, not from a bigger backbone. [I] The backbone target,
282M non-embedding, sits next to the backbone of the main suite's widest shape (16x1216:
285.2M, 407M total) and is the value near it that puts all seven depths, 16 to 70, within 2%
on the same d = 32 k grid; the widths are ``shapes.iso_param_width(..., count='non_embedding')``
picks. Totals fall from 407M (16 layers) to 337M (70 layers).
Same backbone, recipe and LR grids as ``suite_400m``.
"""

import ml_collections

from configs import suite_400m
from depthbench_jax.shapes import ShapeSet

NAME = "suite_300m_isobackbone"
SHAPE_SETS = {
    "300m_isobackbone": ShapeSet(target=282e6, count="non_embedding",
                                 shapes=("16x1216", "20x1088", "24x992", "32x864", "40x768",
                                         "56x640", "70x576")),
}
DEFAULTS = dict(suite_400m.DEFAULTS, shape="32x864")
ffn_rule = suite_400m.ffn_rule
solver_model = suite_400m.solver_model
lrs_for = suite_400m.lrs_for


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  return suite_400m.get_config(arg, DEFAULTS)


def sweep() -> list[dict]:
  return suite_400m.sweep(SHAPE_SETS, lrs_for)
