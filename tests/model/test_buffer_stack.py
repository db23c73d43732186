"""Full AttnRes through model/buffer_stack.py equals the plain scan, with O(L d) memory."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from depthbench_jax.model import buffer_stack, replay
from depthbench_jax.model.config import model_config_from
from depthbench_jax.model.transformer import Transformer
from depthbench_jax.residual.base import depth_softmax, inverse_rms, write_slot
from tests.helpers import (assert_training_path_equals_plain_scan, gradient_temp_bytes,
                           model_loss, tiny_config)


def _cfg(n_layers, d_model=32, policy="nothing_saveable"):
  c = tiny_config(**{"model.n_layers": n_layers, "model.d_model": d_model, "model.n_heads": 4,
                     "model.ffn_dim": None})
  c.model.residual = {"name": "attnres_full"}
  c.model.remat_policy = policy  # what of each branch the buffer stack saves for its backward
  return model_config_from(c.model)


def _random_params(cfg, seed=0):
  """Init params, then the zero-init depth queries and unit gains moved off init so every
  softmax over sources is non-uniform (the gradient test then means something)."""
  params = nn.unbox(Transformer(cfg).init(jax.random.PRNGKey(seed),
                                          jnp.zeros((1, 8), jnp.int32))["params"])
  leaves, tree = jax.tree_util.tree_flatten_with_path(params)
  keys = jax.random.split(jax.random.PRNGKey(seed + 1), len(leaves))
  out = []
  for (path, leaf), key in zip(leaves, keys):
    name = jax.tree_util.keystr(path)
    if "attn_res" in name or "readout" in name:
      leaf = leaf + 0.5 * jax.random.normal(key, leaf.shape)
    out.append(leaf)
  return jax.tree_util.tree_unflatten(tree, out)


@pytest.mark.parametrize("policy", ["nothing_saveable", "dots_saveable"])
def test_a_toy_stack_equals_the_plain_loop_with_every_gradient(policy):
  """The stack alone against a plain Python loop of depth_softmax reads and write_slot writes
  (3 layers, S = 7): the final buffer, and the gradients of the params and of the input buffer
  (values and 1/RMS, random in every slot). Slots 1..6 are overwritten, so their input gets no
  gradient: the model tests compared only parameter gradients (the input buffer is a constant
  there), so a backward that left each written slot's cotangent in place passed them."""
  n_layers, slots, d, eps = 3, 7, 4, 1e-6
  k = jax.random.split(jax.random.PRNGKey(0), 6)
  params = {"w": jax.random.normal(k[0], (n_layers, 2, d, d)) / 2,
            "q": jax.random.normal(k[1], (n_layers, 2, d))}
  values = jax.random.normal(k[2], (slots, 2, 3, d))
  inv = jax.random.uniform(k[3], (slots, 2, 3), minval=0.5, maxval=1.5)
  cv, ci = jax.random.normal(k[4], values.shape), jax.random.normal(k[5], inv.shape)
  branch = lambda p, h, sub: jnp.tanh(h @ p["w"][sub])
  query = lambda p, sub: p["q"][sub]

  def plain(params, values, inv):
    for l in range(n_layers):
      p = jax.tree.map(lambda a: a[l], params)
      for sub in (0, 1):
        h = depth_softmax(query(p, sub), values, jnp.arange(slots) <= 2 * l + sub, eps,
                          inv_rms=inv)[0]
        values, inv = write_slot(values, inv, 2 * l + sub + 1, branch(p, h, sub), eps)
    return values, inv

  stack = lambda params, values, inv: buffer_stack.source_buffer_stack(
      branch, query, eps, params, values, inv, policy=getattr(jax.checkpoint_policies, policy))

  def loss(run):
    def f(params, values, inv):
      out_v, out_i = run(params, values, inv)
      return jnp.sum(out_v * cv) + jnp.sum(out_i * ci)
    return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))(params, values, inv)

  (got, got_g), (want, want_g) = loss(stack), loss(plain)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got_g), jax.tree.leaves(want_g)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=jax.tree_util.keystr(path))
  assert not np.any(got_g[1][1:]) and not np.any(got_g[2][1:]) and np.any(got_g[1][0])


@pytest.mark.parametrize("policy", ["nothing_saveable", "dots_saveable"])
def test_loss_and_gradients_equal_the_plain_scan(policy, monkeypatch):
  cfg = _cfg(3, policy=policy)
  assert_training_path_equals_plain_scan(
      cfg, _random_params(cfg), rtol=2e-4, atol=2e-6,
      through=(monkeypatch, buffer_stack, "source_buffer_stack"))


def test_training_memory_grows_linearly_not_quadratically_with_depth():
  """Temp memory of the gradient at 8 and 24 layers, same remat policy: the plain scan saves
  every layer's copy of the (2L+1)-slot buffer, O(L^2); the buffer stack saves the final buffer
  and one input per sublayer, O(L). (Measured: 2.8x vs 5.3x growth; 4.6x less at 24 layers.)"""
  mem = {(n, plain): gradient_temp_bytes(_cfg(n, d_model=64), plain, seq=64)
         for n in (8, 24) for plain in (False, True)}
  stack_growth = mem[24, False] / mem[8, False]
  plain_growth = mem[24, True] / mem[8, True]
  assert stack_growth < 3.3, mem      # 3x the layers: ~3x the memory
  assert plain_growth > 4.5, mem      # the quadratic term shows
  assert mem[24, True] > 3 * mem[24, False], mem


def test_saved_residuals_skip_the_recompute():
  """Under dots_saveable the backward replays each branch's VJP from its saved residuals
  instead of recomputing the branch (nothing_saveable): fewer FLOPs."""
  def flops(policy):
    cfg = _cfg(2, policy=policy)
    params = jax.eval_shape(lambda: _random_params(cfg))
    tokens = jax.ShapeDtypeStruct((2, 17), jnp.int32)
    compiled = jax.jit(jax.grad(lambda p, t: model_loss(cfg, p, t))).lower(params, tokens).compile()
    return compiled.cost_analysis()["flops"]
  assert flops("dots_saveable") < 0.92 * flops("nothing_saveable")


def test_the_forward_saves_each_branch_input_never_the_params_or_shared():
  """Per sublayer the forward saves the branch's input ``h`` [B,T,d]; dots_saveable adds the
  matmul output ``h @ w``. Never the layer's params (L copies), nor the ``shared`` array
  ``scale`` the branch closes over (the RoPE table's role), which unshared is saved per
  sublayer."""
  n_layers, d = 2, 3
  params = {"w": jnp.ones((n_layers, d, d)), "q": jnp.ones((n_layers, d))}
  values = jnp.ones((2 * n_layers + 1, 2, 1, d))
  inv_rms, scale = jnp.ones(values.shape[:-1]), jnp.ones((2, 1, d))

  def saved(policy, share=True):
    def run(p, v, r, scale):
      branch = lambda p, h, sub: jnp.tanh(h @ p["w"]) * scale
      queries = jnp.concatenate([p["q"], p["q"]])
      shared = replay.Shared(scale if share else ())
      return buffer_stack._forward(branch, 1e-6, policy, lambda t: t, shared, queries, p, v, r,
                                   True)[1]
    return sorted(a.shape[1:] for a in jax.tree.leaves(jax.eval_shape(run, params, values,
                                                                      inv_rms, scale)))

  h = (2, 1, d)
  assert saved(jax.checkpoint_policies.nothing_saveable) == [h, h]
  assert saved(jax.checkpoint_policies.dots_saveable) == [h, h, h, h]
  assert saved(jax.checkpoint_policies.nothing_saveable, share=False) == [h, h, h, h]


@pytest.mark.parametrize("k,chunk", [(3, 8), (3, 1), (5, 4), (4, 4), (2, 2)])
def test_read_over_written_slots_equals_the_masked_depth_softmax(k, chunk):
  """read_slots / read_slots_vjp (slots 0..k only, logits stored per slot) against
  base.depth_softmax with slots > k masked, and its autodiff, on random values with nonzero
  values in the unwritten slots. The VJP's ``dz`` routed as the stack routes it (through the
  stored logits to ``v`` and ``q``, and to ``inv_rms``) gives autodiff's gradients. Over 6
  slots in chunks: one chunk wider than the buffer (8), one slot per chunk (1), a last chunk
  clamped back over visited slots (k=5, 4: slots 2..5, of which 4 and 5 live), a chunk cut
  by k (4, 4) and a k+1 that the chunk divides (2, 2)."""
  s, d = 6, 8
  keys = jax.random.split(jax.random.PRNGKey(0), 5)
  q = jax.random.normal(keys[0], (d,))
  values = jax.random.normal(keys[1], (s, 2, 3, d))
  inv = inverse_rms(values)
  g_h = jax.random.normal(keys[2], (2, 3, d))
  g_values0 = jax.random.normal(keys[3], values.shape)
  mask = jnp.arange(s) <= k
  reference = lambda q, v, i: depth_softmax(q, v, mask, inv_rms=i)[0]
  want, vjp = jax.vjp(reference, q, values, inv)
  want_q, want_v, want_i = vjp(g_h)
  logits = buffer_stack.slot_logits(values, q[None])[..., 0]                  # [S,B,T]
  np.testing.assert_allclose(logits, jnp.einsum("sbtd,d->sbt", values, q), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(buffer_stack.read_slots(logits, values, inv, jnp.asarray(k), chunk),
                             want, rtol=1e-5, atol=1e-6)
  got_v, dz = buffer_stack.read_slots_vjp(logits, values, inv, jnp.asarray(k), g_h, g_values0,
                                          chunk)
  g_logits = dz * inv
  got_v = got_v + g_logits[..., None] * q                                      # via the logits
  np.testing.assert_allclose(got_v, g_values0 + want_v, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(jnp.einsum("sbt,sbtd->d", g_logits, values), want_q, rtol=1e-4,
                             atol=1e-5)
  np.testing.assert_allclose(dz * logits, want_i, rtol=1e-4, atol=1e-5)
  if k + 1 < s:  # unwritten slots get no gradient
    assert float(jnp.max(jnp.abs(want_v[k + 1:]))) == 0
    assert float(jnp.max(jnp.abs(dz[k + 1:]))) == 0
    np.testing.assert_array_equal(got_v[k + 1:], g_values0[k + 1:])
