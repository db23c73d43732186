"""Block AttnRes through model/running_stack.py equals the plain nn.scan, loss and every
gradient, and saves per layer what Pre-LN saves where the plain scan saves the whole buffer."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from depthbench_jax.model import replay, running_stack
from depthbench_jax.model.config import model_config_from
from depthbench_jax.model.transformer import Transformer
from depthbench_jax.residual import attnres
from tests.helpers import (assert_training_path_equals_plain_scan, gradient_temp_bytes,
                           tiny_config)


def _cfg(n_layers=5, policy="nothing_saveable", design="attnres_block", d_model=32, **residual):
  c = tiny_config(**{"model.n_layers": n_layers, "model.d_model": d_model, "model.n_heads": 4,
                     "model.ffn_dim": None})
  c.model.residual = {"name": design, **residual}
  c.model.remat_policy = policy
  return model_config_from(c.model)


def test_loss_and_gradients_equal_the_plain_scan(monkeypatch):
  """5 layers in 3-sublayer blocks: boundaries fall inside layers 1 and 4 (the MLP opens the
  next slot) and before layer 3 (its attention starts a slot from zero). Under dots_saveable,
  so the kept matmul outputs are replayed against the rebuilt buffer; nothing_saveable differs
  only in what is kept (the saved-residuals test below)."""
  cfg = _cfg(5, "dots_saveable", n_blocks=4)
  params = nn.unbox(Transformer(cfg).init(jax.random.PRNGKey(0),
                                          jnp.zeros((1, 8), jnp.int32))["params"])
  # Away from init (zero queries: uniform depth weights), so the depth softmax's gradient counts.
  keys = iter(jax.random.split(jax.random.PRNGKey(5), len(jax.tree.leaves(params))))
  params = jax.tree.map(lambda a: a + 0.1 * jax.random.normal(next(keys), a.shape), params)
  assert_training_path_equals_plain_scan(
      cfg, params, rtol=1e-5, atol=1e-7,
      through=(monkeypatch, running_stack, "running_buffer_stack"))


def test_block_first_slot_and_presence_follow_the_schedule():
  """5 layers in 4 blocks of 3 sublayers: block n >= 1 starts at sublayer 3 (n - 1). Layer 2
  (sublayers 4, 5) adds into block 2 and sees blocks 1 and 2 opened (sublayers 0 and 3)."""
  cfg = _cfg(n_blocks=4)
  assert attnres.block_schedule_of(cfg) == (3, 4)
  assert [int(attnres.block_first_slot(cfg, jnp.asarray(l))) for l in range(5)] == [1, 1, 2, 3, 3]
  np.testing.assert_array_equal(attnres.block_presence_before(cfg, jnp.asarray(0)), [1, 0, 0, 0, 0])
  np.testing.assert_array_equal(attnres.block_presence_before(cfg, jnp.asarray(2)), [1, 1, 1, 0, 0])
  np.testing.assert_array_equal(attnres.block_presence_before(cfg, jnp.asarray(4)), [1, 1, 1, 1, 0])


def test_entry_buffer_takes_finished_running_and_unwritten_slots_from_their_sources():
  final, initial = jnp.arange(4.0)[:, None] + 10, jnp.zeros((4, 1))
  got = running_stack.entry_buffer(final, initial, jnp.asarray([7.0]), jnp.asarray(1))
  np.testing.assert_array_equal(got[:, 0], [10, 7, 0, 0])


def test_the_forward_saves_one_slot_per_layer_and_never_the_buffer_params_or_shared():
  """A toy layer adding ``tanh(read @ w) * scale`` into slot ``l // 2 + 1``: per layer the
  forward saves the running slot (values [B,d], inv_rms [B]) and the index; dots_saveable adds
  the matmul output [B,d]. Never the buffer [S,B,d] or the params (L copies of either), nor the
  ``shared`` array ``scale`` [B,d] the layer closes over (saved per layer when unshared)."""
  d, n_slots = 3, 4
  params = {"w": jnp.ones((5, d, d))}
  values, inv_rms, scale = jnp.ones((n_slots, 2, d)), jnp.ones((n_slots, 2)), jnp.ones((2, d))

  def saved(policy, share=True):
    def run(p, v, r, scale):
      def layer(p, values, inv_rms, l):
        slot = l // 2 + 1
        y = jnp.tanh(jnp.sum(values, axis=0) @ p["w"]) * inv_rms[0][:, None] * scale
        return (values.at[slot].add(y), inv_rms.at[slot].set(1.0 / (1.0 + jnp.sum(y * y, -1))))
      shared = replay.Shared(scale if share else ())
      return running_stack._forward(layer, lambda l: l // 2 + 1, policy, lambda t: t, shared, p,
                                    v, r, True)[1]
    return sorted(a.shape[1:] for a in jax.tree.leaves(jax.eval_shape(run, params, values,
                                                                      inv_rms, scale)))

  assert saved(jax.checkpoint_policies.nothing_saveable) == [(), (2,), (2, d)]
  assert saved(jax.checkpoint_policies.dots_saveable) == [(), (2,), (2, d), (2, d)]
  assert saved(jax.checkpoint_policies.nothing_saveable, share=False) == [(), (2,), (2, d),
                                                                          (2, d)]


def test_training_memory_per_layer_is_pre_ln_s_not_the_whole_buffer():
  """Growth of the gradient's temporaries from 4 to 8 layers (8 blocks, 9 slots, at both
  depths): the running stack's matches Pre-LN's (one [B,T,d] slot a layer; measured 1.03x);
  the plain scan's, the 9-slot buffer a layer, measured 9.1x. At the 1.6B suite's 56x1472 on
  16 devices: 278 -> 67 GiB per device, benchmarks/README.md."""
  temp = lambda design, n_layers: gradient_temp_bytes(_cfg(n_layers, design=design, d_model=64),
                                                      plain=False)
  growth = {design: temp(design, 8) - temp(design, 4) for design in ("preln", "attnres_block")}
  assert growth["attnres_block"] < 1.3 * growth["preln"], growth
