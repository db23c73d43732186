"""Backbone invariants: scan == unrolled, remat changes nothing, gate and permutation hooks."""

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import base
from depthbench_jax.model import transformer as tr
from depthbench_jax.model.config import model_config_from


def model_cfg(**model_overrides):
  c = base.get_config()
  c.model.update(dict(vocab_size=61, d_model=32, n_layers=3, n_heads=4, ffn_dim=48))
  c.model.update(model_overrides)
  return model_config_from(c.model)


TOKENS = jax.random.randint(jax.random.PRNGKey(1), (2, 10), 0, 61)


def apply(cfg, params, tokens=TOKENS, **kw):
  return jax.jit(lambda p, t: tr.Transformer(cfg).apply({"params": p}, t, **kw))(params, tokens)


def loss_fn(cfg, params, tokens=TOKENS):
  logits = tr.Transformer(cfg).apply({"params": params}, tokens)
  return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(
      logits, tokens[..., None], -1)[..., 0])


def test_scan_equals_unrolled_forward_and_grads():
  scanned = model_cfg(scan_layers=True, remat_policy="none")
  unrolled = model_cfg(scan_layers=False, remat_policy="none")
  params = jax.tree.map(jnp.asarray, tr.init_params(scanned, jax.random.PRNGKey(0)))
  params = jax.tree.map(lambda x: x, __import__("flax").linen.unbox(params))
  flat = tr.unstack_layers(params, scanned.n_layers)
  np.testing.assert_allclose(apply(scanned, params), apply(unrolled, flat), rtol=1e-5, atol=1e-5)
  g_scan = jax.jit(jax.grad(lambda p: loss_fn(scanned, p)))(params)
  g_flat = tr.stack_layers(jax.jit(jax.grad(lambda p: loss_fn(unrolled, p)))(flat),
                           scanned.n_layers)
  for a, b in zip(jax.tree.leaves(g_scan), jax.tree.leaves(g_flat)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("policy", ["nothing_saveable", "dots_saveable"])
def test_remat_does_not_change_gradients(policy):
  plain, remat = model_cfg(remat_policy="none"), model_cfg(remat_policy=policy)
  params = __import__("flax").linen.unbox(tr.init_params(plain, jax.random.PRNGKey(0)))
  g0 = jax.jit(jax.grad(lambda p: loss_fn(plain, p)))(params)
  g1 = jax.jit(jax.grad(lambda p: loss_fn(remat, p)))(params)
  for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(g1))


def test_gate_zero_removes_a_layer_and_return_layers_shapes():
  cfg = model_cfg()
  params = __import__("flax").linen.unbox(tr.init_params(cfg, jax.random.PRNGKey(0)))
  model = tr.Transformer(cfg)
  logits, layers = model.apply({"params": params}, TOKENS, return_layers=True)
  assert layers["hidden"].shape == (3, 2, 10, 32) and layers["update"].shape == (3, 2, 10, 32)
  # Skipping the middle layer: its hidden state equals the previous one.
  _, skipped = model.apply({"params": params}, TOKENS, gate=jnp.array([1.0, 0.0, 1.0]),
                           return_layers=True)
  np.testing.assert_allclose(skipped["hidden"][1], skipped["hidden"][0], atol=1e-6)
  np.testing.assert_allclose(skipped["hidden"][0], layers["hidden"][0], atol=1e-6)
  assert not np.allclose(skipped["hidden"][2], layers["hidden"][2], atol=1e-4)


@pytest.mark.parametrize("design", ["preln", "lns", "sandwich"])
def test_update_is_the_state_change_where_the_state_is_one_additive_stream(design):
  """The causal score's update is Csordas's ``h_(l+1) - h_l`` in these designs, so
  ``hidden_l = x0 + sum of updates up to l`` (Sandwich-LN: its post-normed sublayer outputs)."""
  cfg = model_cfg(residual=ml_collections.ConfigDict({"name": design}))
  params = flax.linen.unbox(tr.init_params(cfg, jax.random.PRNGKey(0)))
  _, layers = apply(cfg, params, return_layers=True)
  x0 = params["embed"]["embedding"][TOKENS]
  np.testing.assert_allclose(layers["hidden"], x0 + jnp.cumsum(layers["update"], 0), atol=1e-5)


def test_the_embedding_gradient_sums_in_fp32_under_bf16_compute():
  """The lookup's gradient adds every occurrence of a token into its row; in bf16 (a lookup
  in nn.Embed's compute dtype) a frequent token's row stagnated."""
  cfg = model_cfg(dtype="bfloat16")
  params = flax.linen.unbox(tr.init_params(cfg, jax.random.PRNGKey(0)))
  jaxpr = jax.make_jaxpr(jax.grad(lambda p: loss_fn(cfg, p)))(params)

  def scatters(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "scatter-add":
        yield eqn.outvars[0].aval
      for sub in jax.core.jaxprs_in_params(eqn.params):
        yield from scatters(sub)
  tables = [(a.shape, str(a.dtype)) for a in scatters(jaxpr.jaxpr) if a.shape == (61, 32)]
  assert tables == [((61, 32), "float32")], tables


def test_the_gate_blend_is_compiled_only_with_a_gate():
  """Without a gate the layer skips the blend ``g new + (1 - g) old`` (a pass over the state
  per layer that XLA:GPU did not fuse away: 6.3 ms of HC's 185 ms H200 step)."""
  cfg = model_cfg()
  params = __import__("flax").linen.unbox(tr.init_params(cfg, jax.random.PRNGKey(0)))

  def hlo(**kw):
    f = jax.jit(lambda p, t: tr.Transformer(cfg).apply({"params": p}, t, **kw))
    return f.lower(params, TOKENS).compile().as_text()
  assert "residual.skip" not in hlo()
  assert "residual.skip" in hlo(gate=jnp.ones((3,)))


def test_permute_layers_identity_and_swap():
  cfg = model_cfg()
  params = __import__("flax").linen.unbox(tr.init_params(cfg, jax.random.PRNGKey(0)))
  model = tr.Transformer(cfg)
  ref = model.apply({"params": params}, TOKENS)
  same = model.apply({"params": tr.permute_layers(params, jnp.arange(3))}, TOKENS)
  np.testing.assert_array_equal(ref, same)
  swapped = tr.permute_layers(params, jnp.array([1, 0, 2]))
  np.testing.assert_array_equal(swapped["layers"]["mlp"]["up_proj"]["kernel"][0],
                                params["layers"]["mlp"]["up_proj"]["kernel"][1])
  assert not np.allclose(model.apply({"params": swapped}, TOKENS), ref, atol=1e-5)
  # Position p holds original layer order[p]: a rotation (its own inverse no longer) tells a
  # gather from a scatter, which every swap tested here and in the diagnostics left apart.
  rotated = tr.permute_layers(params, jnp.array([1, 2, 0]))["layers"]["mlp"]["up_proj"]["kernel"]
  kernel = params["layers"]["mlp"]["up_proj"]["kernel"]
  for position, original in enumerate((1, 2, 0)):
    np.testing.assert_array_equal(rotated[position], kernel[original])
  # vmap over orders: the diagnostics batch permutations this way.
  orders = jnp.array([[0, 1, 2], [1, 0, 2]])
  batched = jax.vmap(lambda o: model.apply({"params": tr.permute_layers(params, o)}, TOKENS))(
      orders)
  np.testing.assert_allclose(batched[0], ref, atol=1e-5)
  np.testing.assert_allclose(batched[1], model.apply({"params": swapped}, TOKENS), atol=1e-5)


def test_count_params_matches_initialised_tree():
  cfg = model_cfg()
  counts = tr.count_params(cfg)
  params = __import__("flax").linen.unbox(tr.init_params(cfg, jax.random.PRNGKey(0)))
  assert counts["total"] == sum(x.size for x in jax.tree.leaves(params))
  # Hand count: embed + head 2*61*32; per layer 4*32*32 attention + 3*32*48 MLP + 2*32 norms.
  assert counts["total"] == 2 * 61 * 32 + 3 * (4 * 32 * 32 + 3 * 32 * 48 + 2 * 32) + 32
  assert counts["embedding"] == 2 * 61 * 32


def test_gqa_and_qk_norm_shapes():
  cfg = model_cfg(n_kv_heads=2, qk_norm=True, head_dim=16, tie_embeddings=True)
  params = __import__("flax").linen.unbox(tr.init_params(cfg, jax.random.PRNGKey(0)))
  assert params["layers"]["self_attn"]["k_proj"]["kernel"].shape == (3, 32, 2, 16)
  assert "lm_head" not in params
  assert tr.Transformer(cfg).apply({"params": params}, TOKENS).shape == (2, 10, 61)


def test_tied_embeddings_read_the_logits_off_the_input_table():
  """tie_embeddings=True: logits = N_final(x_L) @ E^T with E the embedding table (no lm_head)."""
  cfg = model_cfg(tie_embeddings=True, n_layers=1, remat_policy="none")
  rng = np.random.RandomState(0)                   # random leaves: no init to compile
  params = jax.tree.map(lambda a: rng.normal(0.0, 0.5, a.shape).astype(a.dtype),
                        __import__("flax").linen.unbox(tr.abstract_params(cfg)))
  assert "lm_head" not in params
  logits, layers = apply(cfg, params, return_layers=True)
  x = layers["hidden"][-1]
  h = x / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True) + cfg.norm_eps)
  h = h * params["residual_io"]["final_norm"]["scale"]
  np.testing.assert_allclose(logits, h @ params["embed"]["embedding"].T, rtol=1e-4, atol=1e-5)


def test_bf16_compute_returns_fp32_logits():
  """dtype='bfloat16': the logits leave the model in fp32 (the loss's logsumexp runs in fp32)."""
  cfg = model_cfg(dtype="bfloat16", n_layers=1)
  params = __import__("flax").linen.unbox(tr.abstract_params(cfg))     # shapes only: no compute
  logits = jax.eval_shape(lambda p: tr.Transformer(cfg).apply({"params": p}, TOKENS), params)
  assert logits.dtype == jnp.float32 and logits.shape == (2, 10, 61)


def test_model_config_refuses_a_zero_context():
  """max_seq_len must be positive: model_config_from names the field (the train-config check
  would only report data.seq_len exceeding it, and diagnostics/evals skip that check)."""
  from depthbench_jax.errors import ConfigError
  with pytest.raises(ConfigError,
                     match=r"^config\.model\.max_seq_len=0; allowed: a positive integer$"):
    model_cfg(max_seq_len=0)
  assert model_cfg(max_seq_len=1).max_seq_len == 1

@pytest.mark.parametrize("field, value, allowed", [
    ("head_dim", 0, "a positive even integer"), ("head_dim", -2, "a positive even integer"),
    ("n_kv_heads", 0, "a positive integer dividing n_heads=4"),
    ("ffn_dim", 0, "a positive integer, or None"), ("ffn_dim", -64, "a positive integer"),
    ("ffn_multiple_of", 0, "a positive integer"), ("norm_eps", -1.0, "a number > 0"),
    ("rope_theta", 0.0, "a number > 0"), ("init_std", float("nan"), "a number > 0")])
def test_model_config_refuses_sizes_and_constants_that_cannot_train(field, value, allowed):
  """Each once passed: head_dim 0 or -2 and ffn_dim -64 crashed later with a traceback (RoPE's
  division, a reshape, an MLIR error), ffn_multiple_of 0 with ZeroDivisionError, n_kv_heads 0
  and ffn_dim 0 silently meant their defaults, and norm_eps -1 or rope_theta 0 gave NaN logits
  that the run reported as a divergence."""
  from depthbench_jax.errors import ConfigError
  with pytest.raises(ConfigError, match=rf"^config\.model\.{field}={value!r}; allowed: {allowed}"):
    model_cfg(**{field: value})


@pytest.mark.parametrize("layout", [dict(), dict(n_kv_heads=2, qk_norm=True)])  # MHA, Qwen3 GQA
def test_padded_dot_product_attention_in_the_model_equals_the_blocked_attention(layout,
                                                                               monkeypatch):
  # The paper suites train with attention_kernel='fused': on a GPU in bf16 that is cuDNN
  # through padded_dot_product_attention. Off-GPU it is the blocked attention, so here the
  # selection is forced and cuDNN swapped for jax.nn.dot_product_attention's XLA form, which
  # runs the same padding and scale inside the model; it must equal the blocked attention.
  from depthbench_jax.model import layers
  monkeypatch.setattr(layers, "uses_cudnn_attention", lambda dtype, head_dim: True)
  real = layers.padded_dot_product_attention
  calls = []
  monkeypatch.setattr(layers, "padded_dot_product_attention",
                      lambda q, k, v, impl: calls.append(impl) or real(q, k, v, "xla"))
  xla_cfg = model_cfg(attention_kernel="xla", head_dim=12, **layout)   # padded to 16
  fused_cfg = model_cfg(attention_kernel="fused", head_dim=12, **layout)
  tokens = jax.random.randint(jax.random.PRNGKey(2), (2, 64), 0, 61)  # 64 = 2 query blocks
  params = __import__("flax").linen.unbox(tr.init_params(xla_cfg, jax.random.PRNGKey(0)))
  np.testing.assert_allclose(apply(fused_cfg, params, tokens), apply(xla_cfg, params, tokens),
                             rtol=1e-5, atol=1e-5)
  assert calls and set(calls) == {"cudnn"}
  g_fused = jax.jit(jax.grad(lambda p: loss_fn(fused_cfg, p, tokens)))(params)
  g_xla = jax.jit(jax.grad(lambda p: loss_fn(xla_cfg, p, tokens)))(params)
  for a, b in zip(jax.tree.leaves(g_fused), jax.tree.leaves(g_xla)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
