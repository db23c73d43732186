"""1.6B suite: three shapes in the Qwen3-1.7B GQA layout, LR 5e-4 for every design (paper).

    launch/run_sweep.sh configs/suite_1p6b.py [--dry_run]

Layout: 16 query / 8 KV heads, head_dim = d / 16 (128 at d = 2048), SwiGLU FFN = 3 d rounded up
to a multiple of 128 (6144 at 2048 as Qwen3-1.7B; 5248 and 4480 at 1728 and 1472), QK-norm,
RoPE theta 1e6, RMSNorm eps 1e-6 (Qwen3-1.7B's config.json). 28x2048 is Qwen3-1.7B's own
backbone (1409.4M non-embedding).
[I] head_dim: Qwen3 keeps 128 at every size (Qwen3-0.6B: d 1024, 16 x 128); the spec asks only
for "16 query heads, 8 KV heads" (residuals-detail.md section 2), so the deeper shapes keep 16
heads of d / 16 (108, 92), as the sub-1B suites do; cuDNN pads them to multiples of 8
(``model.layers.cudnn_head_dim``).
[I] Vocabulary: with this project's GPT-2 tokenizer (50257, untied, as the sub-1B suites) the
28x2048 model has 1615.3M parameters, which is the paper's "1.6B" and its 32B tokens (20 per
parameter); Qwen3's own 151936-row tied table would make it 1.72B. The two deeper shapes
(40x1728, 56x1472) are [I]: ``shapes.iso_param_width`` at the 28x2048 total, within 0.4%.
Recipe as ``suite_400m`` (seq 2048, ~1M tokens per step), FSDP over all devices.
"""

import ml_collections

from configs import suite_400m
from depthbench_jax import sweep as sweep_lib
from depthbench_jax.shapes import FFNRule, ShapeSet

NAME = "suite_1p6b"
SHAPE_SETS = {
    "1p6b": ShapeSet(target=1615.3e6, count="total", shapes=("28x2048", "40x1728", "56x1472")),
}
LR = 5e-4
DEFAULTS = dict(suite_400m.DEFAULTS, shape="28x2048", lr=LR)


def ffn_rule(key: str = "1p6b") -> FFNRule:
  del key
  return FFNRule(ratio=3.0, multiple_of=128)  # Qwen3-1.7B: 6144 = 3 x 2048.


def solver_model(key: str = "1p6b") -> ml_collections.ConfigDict:
  del key
  m = suite_400m.solver_model()
  m.n_heads = 16
  m.n_kv_heads = 8
  m.qk_norm = True
  m.rope_theta = 1e6                           # Qwen3.
  return m


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  run = sweep_lib.parse_run_arg(arg, DEFAULTS)
  c = suite_400m.paper_config(solver_model(), run["data"])
  c.mesh = ml_collections.ConfigDict({"data": 1, "fsdp": -1, "tensor": 1})
  return sweep_lib.apply_run(c, run, ffn_rule())


def sweep() -> list[dict]:
  """Every registered design x every shape of ``SHAPE_SETS`` (whatever its keys: a copy that
  renames "1p6b" sweeps its own set) at ``LR``."""
  from depthbench_jax.residual import registry
  return [{"arch": arch, "shape": shape, "lr": LR}
          for arch in registry.names() for shape_set in SHAPE_SETS.values()
          for shape in shape_set.shapes]
