"""Control: multi-scale check, 200M / 300M / 500M total, three depths each (16, 32, 48 layers).

    launch/run_sweep.sh configs/suite_multiscale.py [--dry_run]

The 400M point is the main suite. [I] Depths and targets are not in the paper summary: three
depths per scale span shallow-wide to deep-narrow, and each scale's target is nudged off the
round number (204M, 304M, 490M) so that all three widths on the d = 32 k grid land within 2%.
Same backbone, recipe and LR grids as ``suite_400m``.
"""

import ml_collections

from configs import base
from configs import suite_400m
from depthbench_jax import sweep as sweep_lib
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
  run = sweep_lib.parse_run_arg(arg, DEFAULTS)
  c = suite_400m.paper_recipe(base.get_config(), run["data"])
  c.model = solver_model()
  return sweep_lib.apply_run(c, run, ffn_rule())


def sweep() -> list[dict]:
  from depthbench_jax.residual import registry
  return [{"arch": arch, "shape": shape, "lr": lr}
          for arch in registry.names()
          for shape_set in SHAPE_SETS.values()
          for shape in shape_set.shapes
          for lr in lrs_for(arch)]
