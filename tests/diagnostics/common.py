"""Shared bits of the diagnostics tests."""

import flax.linen as nn
import jax
import jax.numpy as jnp

from depthbench_jax.model import transformer as tr


def init_params(cfg, seed: int = 0):
  """Unboxed params from a jitted init (an eager init of the scanned model costs seconds)."""
  init = lambda rng: nn.unbox(tr.Transformer(cfg).init(rng, jnp.zeros((1, 8), jnp.int32))["params"])
  return jax.jit(init)(jax.random.PRNGKey(seed))
