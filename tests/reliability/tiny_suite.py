"""A two-run sweep of tiny models for the sweep fault test (tests/reliability).

The first run's LR (1e4) blows the model up within a few steps, so the sweep must record it as
diverged and go on to the second.
"""

import ml_collections

from configs import base
from depthbench_jax import sweep as sweep_lib
from depthbench_jax.shapes import FFNRule

NAME = "reliability_tiny"
DEFAULTS = {"arch": "preln", "shape": "2x32", "lr": 3e-3}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  run = sweep_lib.parse_run_arg(arg, DEFAULTS)
  c = base.get_config()
  c.model.vocab_size = 257
  c.model.n_heads = 2
  c.data.tokenizer = "byte"
  c.data.seq_len = 32
  c.data.global_batch_size = 8
  c.data.val_batches = 1
  c.steps = 20
  c.warmup_steps = 2
  c.log_every = 5
  c.eval_every = 0
  c.checkpoint_every = 10
  c.divergence.min_steps = 2
  return sweep_lib.apply_run(c, run, FFNRule(multiple_of=32))


def sweep() -> list[dict]:
  return [{"arch": "preln", "shape": "2x32", "lr": lr} for lr in (1e4, 3e-3)]
