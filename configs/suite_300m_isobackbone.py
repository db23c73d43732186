"""Control: iso-backbone sweep (~300M class). The non-embedding count is fixed, not the total.

    launch/run_sweep.sh configs/suite_300m_isobackbone.py [--dry_run]

The paper's control holds the backbone fixed, so deep-narrow shapes have a smaller total count
(a thinner embedding table) and any loss gain comes from the width-depth split, not from a
bigger backbone. [I] The backbone target, 282M non-embedding, sits next to the backbone of the
main suite's widest shape (16x1216: 285.2M, 407M total) and is the value near it that puts all
seven depths, 16 to 70, within 2% on the same d = 32 k grid; the widths are
``shapes.iso_param_width(..., count='non_embedding')`` picks. Totals fall from 407M (16 layers)
to 337M (70 layers). The depths are the main suite's but 40 for its 42: at 42 layers no
width is within 2% of 282M (736: -2.46%, 768: +5.44%).

Embedding share. The paper summary says this sweep "holds embedding share constant"; with a
fixed vocabulary that cannot hold beside a fixed backbone (share = 2 V d / (2 V d + backbone)
moves with d alone), and the summary's own gloss ("with backbone size held fixed, deep-narrow
models can have a smaller total parameter count") is what this suite follows. The embedding
share (input table + untied head over total) therefore falls with depth, from 30.0% at 16x1216
to 17.2% at 70x576 (the main suite: 30.0% to 15.6%).

Tokens [I]: 20 per parameter of the shape's Pre-LN total, as in every suite, so deep-narrow
shapes also train on fewer tokens: 8.15B at 16x1216 down to 6.73B at 70x576. The 16x1216 runs
are the main suite's own (same config, same run names): copy them from results/suite_400m/
rather than training them twice (40 runs, ~540 of the plan's device-hours).
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
