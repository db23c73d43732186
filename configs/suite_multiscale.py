"""Control: multi-scale check, 200M / 300M / 500M total, three depths each (16, 32, 48 layers).

    launch/run_sweep.sh configs/suite_multiscale.py [--dry_run]

[I] Depths and targets are not in the paper summary: three depths per scale span shallow-wide
to deep-narrow, and each scale's target is nudged off the round number (204M, 304M, 490M)
to centre its three widths on the d = 32 k grid: at 200M every width is 2.5-2.8% over and at
500M 48x832 is 3.0% under, while 304M only tightens 300M's 0.8-1.8% to within 0.6%; the
"500M" shapes count 482M to 485M. The 400M point is the main suite, at 16 and 32 layers only: it has no
48-layer shape (48x768, the nearest, is +2.21% off its 408M target), so the 48-layer scale
trend is 200M, 300M, 500M.
Same backbone, recipe and LR grids as ``suite_400m``.
"""

import ml_collections

from configs import suite_400m
from depthbench_jax.shapes import ShapeSet

NAME = "suite_multiscale"
SHAPE_SETS = {
    "200m": ShapeSet(target=204e6, count="total", shapes=("16x800", "32x608", "48x512")),
    "300m": ShapeSet(target=304e6, count="total", shapes=("16x1024", "32x768", "48x640")),
    "500m": ShapeSet(target=490e6, count="total", shapes=("16x1344", "32x992", "48x832")),
}
DEFAULTS = dict(suite_400m.DEFAULTS, shape="32x768")
ffn_rule = suite_400m.ffn_rule
solver_model = suite_400m.solver_model
lrs_for = suite_400m.lrs_for


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  return suite_400m.get_config(arg, DEFAULTS)


def sweep() -> list[dict]:
  return suite_400m.sweep(SHAPE_SETS, lrs_for)
