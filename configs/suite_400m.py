"""DepthBench main suite: ~400M parameters, seven shapes from 16x1216 (AR 76.0) to 70x640 (9.1).

    python -m depthbench_jax.main --config=configs/suite_400m.py:arch=hc,shape=16x1216,lr=1e-3 \
        --workdir=results/suite_400m/hc_16x1216_lr1e-3
    launch/run_sweep.sh configs/suite_400m.py [--dry_run]

Backbone: LLaMA-like, 16-head MHA, RoPE, RMSNorm, SwiGLU (FFN: the smallest multiple of 64 at or
above 8/3 d), GPT-2 vocabulary (50257) with untied embeddings. Recipe (paper): FineWeb-Edu,
sequence 2048, 512 x 2048 = 1,048,576 tokens per step, 20 tokens per parameter (total count),
every design with its own LR grid, best LR reported per shape.

Shapes: the paper gives the endpoints 16x1216 and 70x640 and the AR-42.7 optimum edge (24x1024,
[I]); 20 and 32 layers appear in its results. The other depths (42, 56) are [I], chosen to
space depth evenly in log between 16 and 70. The widths are what ``shapes.iso_param_width``
picks for the Pre-LN backbone at the target total (``SHAPE_SETS["400m"].target``) on the grid
d = 32 k (16 equal, even-sized heads); a target of 408M puts every shape, including all three
paper shapes, within 2% (``python -m depthbench_jax.shapes configs/suite_400m.py`` prints the
table). With FFN multiple 64 the endpoints count 407.4M and 411.4M; multiple 128 would put
70x640 at 420M.

Designs at a shape share the Pre-LN shape (the paper: parameter count "roughly fixed"); their own
parameters are not re-solved [I]. Over the seven shapes HC, AttnRes and the norm variants add
under 0.2%, mHC's phi +0.92% (16x1216) to +2.09% (70x640), which is +2.93% off the 408M target
there, and MoDA's FFN depth-K/V projections (2 d^2 per layer) +11.61% to +13.94%. Every design
at a shape trains on Pre-LN's token budget (``budget_design``), so MoDA (and, by 1-2%, mHC) is
bigger, not longer-trained.

[I] (the paper does not give them): optimizer details and the LR grid. AdamW (0.9, 0.95),
weight decay 0.1, clip 1.0, 2% warmup, cosine to 10%; LR grid 5e-4..4e-3 (factor 2).
"""

import os

import ml_collections

from configs import base
from depthbench_jax import sweep as sweep_lib
from depthbench_jax.shapes import FFNRule, ShapeSet

NAME = "suite_400m"
SHAPE_SETS = {
    "400m": ShapeSet(target=408e6, count="total",
                     shapes=("16x1216", "20x1120", "24x1024", "32x896", "42x800", "56x704",
                             "70x640")),
}
DEFAULT_LRS = (5e-4, 1e-3, 2e-3, 4e-3)
LR_GRID: dict[str, tuple[float, ...]] = {}  # design -> its own grid (default: DEFAULT_LRS)
DEFAULTS = {"arch": "preln", "shape": "24x1024", "lr": 1e-3, "data": ""}


def ffn_rule(key: str = "400m") -> FFNRule:
  del key
  return FFNRule(ratio=None, multiple_of=64)


def paper_config(model: ml_collections.ConfigDict,
                 data_path: str = "") -> ml_collections.ConfigDict:
  """The base config with ``model`` and the paper recipe on it: FineWeb-Edu, seq 2048, ~1M
  tokens/step, 20 tokens/param, bf16 compute, fused attention (shared by the suites). The
  recipe's model settings are applied to ``model`` here, after it is in place, so a suite
  cannot replace them by setting its model afterwards."""
  c = base.get_config()
  c.model = model
  c.data.source = "parquet"
  # An empty FINEWEB_EDU_PATH reads as unset, as README's ${FINEWEB_EDU_PATH:-...} does.
  c.data.path = data_path or os.environ.get("FINEWEB_EDU_PATH") or "data/fineweb-edu"
  c.data.tokenizer = "gpt2"
  c.data.seq_len = 2048
  c.data.global_batch_size = 512          # 512 x 2048 = 1,048,576 tokens per step.
  c.data.val_batches = 8
  c.data.worker_count = 4
  c.model.max_seq_len = 4096              # >= seq_len; the systems bench prefills 4096.
  c.model.dtype = "bfloat16"
  c.model.param_dtype = "float32"
  c.model.attention_kernel = "fused"
  c.steps = -1                            # tokens_per_param * params_total / tokens per step.
  c.tokens_per_param = 20.0
  c.budget_design = "preln"               # N = Pre-LN's at the shape: same tokens for every design.
  c.warmup_steps = 0.02                   # a fraction of the steps
  c.min_lr_ratio = 0.1
  c.b1, c.b2 = 0.9, 0.95
  c.weight_decay = 0.1
  c.grad_clip = 1.0
  c.eval_every = 500
  c.eval_batches = 8
  c.log_every = 10
  c.checkpoint_every = 500
  c.keep_checkpoints = 2
  c.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1})
  return c


def solver_model(key: str = "400m") -> ml_collections.ConfigDict:
  """``config.model`` the shapes are solved on: the Pre-LN backbone of this suite."""
  del key
  m = base.get_config().model
  m.vocab_size = 50257
  m.n_heads = 16
  m.n_kv_heads = None
  m.tie_embeddings = False
  m.qk_norm = False
  m.ffn_multiple_of = ffn_rule().multiple_of
  return m


def get_config(arg: str | None = None, defaults: dict | None = None) -> ml_collections.ConfigDict:
  """One run of this backbone and recipe; the control suites pass their own ``defaults``."""
  run = sweep_lib.parse_run_arg(arg, DEFAULTS if defaults is None else defaults)
  c = paper_config(solver_model(), run["data"])
  return sweep_lib.apply_run(c, run, ffn_rule())


def lrs_for(design: str) -> tuple[float, ...]:
  return LR_GRID.get(design, DEFAULT_LRS)


def sweep(shape_sets: dict[str, ShapeSet] | None = None, lrs=None) -> list[dict]:
  """Every registered design x every shape of ``shape_sets`` (default: this suite's seven) x
  that design's LR grid ``lrs(design)`` (default: ``lrs_for``); the control suites pass their
  own ``SHAPE_SETS`` and ``lrs_for``, so a copy of one that edits its grid sweeps that grid."""
  from depthbench_jax.residual import registry
  grids = {arch: (lrs or lrs_for)(arch) for arch in registry.names()}
  for arch, grid in grids.items():   # a copy's lrs_for returning '1e-3' swept lr=1.0, then 'e'
    sweep_lib.check_lr_grid(grid, f"lrs_for({arch!r})")
  return [{"arch": arch, "shape": shape, "lr": lr}
          for arch in registry.names()
          for shape_set in (SHAPE_SETS if shape_sets is None else shape_sets).values()
          for shape in shape_set.shapes
          for lr in grids[arch]]
