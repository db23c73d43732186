"""Training memory against depth: a design whose train step's temporaries grow faster than
linearly in L cannot be trained at the suites' deep shapes.

Measured from the compiled train step's ``memory_analysis()`` (abstract, nothing allocated),
remat ``nothing_saveable`` as the suites train: temporaries at 16 layers over 8 layers, about 2
for activations that are O(L d) per token, about 4 for O(L^2 d). Reverse-mode through the layer
scan saves each iteration's carry, so a design carrying a buffer that grows with L is O(L^2)
unless it trains through ``model/buffer_stack.py`` (Full AttnRes) or ``model/append_stack.py``
(MoDA: through ``nn.scan`` x3.4 from 8 to 16 layers here, a 92 GiB step at the 400M bench shape).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import pytest

from depthbench_jax import bench
from depthbench_jax.model.config import model_config_from
from depthbench_jax.model.transformer import Transformer
from depthbench_jax.train.optimizer import lr_schedule, make_optimizer
from depthbench_jax.train.step import init_state, train_step

PRESET = dataclasses.replace(bench.PRESETS["quick"], d_model=64, n_heads=4, seq_len=128, batch=2,
                             vocab_size=256, remat="nothing_saveable")


def train_temp_bytes(design: str, n_layers: int) -> int:
  c = bench.bench_config(PRESET, design, n_layers, PRESET.d_model)
  model, optimizer = Transformer(model_config_from(c.model)), make_optimizer(c, c.steps)
  t = PRESET.seq_len
  state = jax.eval_shape(functools.partial(init_state, model, optimizer, seq_len=t),
                         jax.random.PRNGKey(0))
  step = jax.jit(functools.partial(train_step, model=model, optimizer=optimizer,
                                   schedule=lr_schedule(c, c.steps)))
  batch = {"tokens": jax.ShapeDtypeStruct((PRESET.batch, t + 1), jnp.int32)}
  return step.lower(state, batch).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("design", ["attnres_full", "moda"])  # the two designs with a buffer
def test_training_temporaries_grow_at_most_linearly_with_depth(design):
  growth = train_temp_bytes(design, 16) / train_temp_bytes(design, 8)
  assert growth < 2.5, f"{design}: temporaries x{growth:.2f} from 8 to 16 layers"
