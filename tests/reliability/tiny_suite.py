"""A two-run sweep of tiny models for the sweep fault test (tests/reliability).

The first run's LR (1e4) blows the model up within a few steps, so the sweep must record it as
diverged and go on to the second.
"""

import ml_collections

from depthbench_jax import sweep as sweep_lib
from depthbench_jax.shapes import FFNRule
from tests import helpers

NAME = "reliability_tiny"
DEFAULTS = {"arch": "preln", "shape": "2x32", "lr": 3e-3}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  run = sweep_lib.parse_run_arg(arg, DEFAULTS)
  # The tests' tiny model; apply_run sets its shape, FFN (multiple of 32) and name from `run`
  # (so the tiny model's own ffn_dim is left unset here: apply_run refuses to overwrite it).
  c = helpers.tiny_config(**{"data.val_batches": 1, "log_every": 5, "eval_every": 0,
                             "divergence.min_steps": 2, "model.ffn_dim": None})
  return sweep_lib.apply_run(c, run, FFNRule(multiple_of=32))


def sweep() -> list[dict]:
  return [{"arch": "preln", "shape": "2x32", "lr": lr} for lr in (1e4, 3e-3)]
