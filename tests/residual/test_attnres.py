"""Full and Block AttnRes: update equations by hand, init invariants, gate, schedule, training."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import residual_testkit as kit
from depthbench_jax.errors import ConfigError
from depthbench_jax.model.transformer import Transformer, permute_layers, unstack_layers
from depthbench_jax.residual import attnres
from depthbench_jax.residual.base import depth_softmax, inverse_rms

def test_depth_softmax_hand_computed():
  # v0 = (1, -1) and v1 = (3, 3): N0 gives (1, -1) and (1, 1). w = (0, c), c = ln(2)/2:
  # logits (-c, c), weights (1/3, 2/3), h = (1/3)(1, -1) + (2/3)(3, 3) = (7/3, 5/3).
  sources = jnp.array([[1.0, -1.0], [3.0, 3.0]]).reshape(2, 1, 1, 2)
  w = jnp.array([0.0, np.log(2.0) / 2])
  h, weights = depth_softmax(w, sources)
  np.testing.assert_allclose(weights[:, 0, 0], [1 / 3, 2 / 3], atol=1e-5)
  np.testing.assert_allclose(h[0, 0], [7 / 3, 5 / 3], atol=1e-5)
  # Bool mask: v1 absent. Float presence 1/2 on v1: weights (1/sqrt2, sqrt2/2) -> (1/2, 1/2).
  h, weights = depth_softmax(w, sources, jnp.array([True, False]))
  np.testing.assert_allclose(weights[:, 0, 0], [1, 0], atol=1e-6)
  np.testing.assert_allclose(h[0, 0], [1, -1], atol=1e-5)
  _, weights = depth_softmax(w, sources, jnp.array([1.0, 0.5]))
  np.testing.assert_allclose(weights[:, 0, 0], [0.5, 0.5], atol=1e-5)


def naive_depth_softmax(query, sources, presence):
  """The paper's formula with autodiff: normalised keys materialised, presence as a log bias."""
  keys = sources / jnp.sqrt(jnp.mean(sources ** 2, -1, keepdims=True) + 1e-6)
  logits = jnp.einsum("d,sbtd->sbt", query, keys) + jnp.log(presence)[:, None, None]
  weights = jax.nn.softmax(logits, axis=0)
  return jnp.einsum("sbt,sbtd->btd", weights, sources), weights


@pytest.mark.parametrize("n_slots", [4, 21])  # one piece; 8-slot chunks and a remainder of 5
def test_depth_softmax_gradients_match_autodiff_of_the_formula(n_slots):
  """The written-out VJP: d query, d sources (through the keys' RMS too), d presence (soft
  gates), and a cotangent on the weights as well as on h; over the buffer in one piece and in
  chunks (``base.slot_pieces``)."""
  rng = np.random.RandomState(0)
  q, v = jnp.asarray(rng.randn(6)), jnp.asarray(rng.randn(n_slots, 2, 3, 6))
  p = jnp.array([1.0, 0.7, 1.0, 0.2] * (n_slots // 4) + [0.9] * (n_slots % 4))
  g_h, g_w = jnp.asarray(rng.randn(2, 3, 6)), jnp.asarray(rng.randn(n_slots, 2, 3))
  loss = lambda f: lambda q, v, p: (jnp.sum(f(q, v, p)[0] * g_h) + jnp.sum(f(q, v, p)[1] * g_w))
  ours = jax.grad(loss(depth_softmax), argnums=(0, 1, 2))(q, v, p)
  want = jax.grad(loss(naive_depth_softmax), argnums=(0, 1, 2))(q, v, p)
  for got, ref in zip(ours, want):
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
  # An absent slot (presence 0) gets no weight and no gradient, and leaves the rest unchanged.
  p0 = p.at[1].set(0.0)
  kept = jnp.array([s for s in range(n_slots) if s != 1])
  (h0, w0), (h1, _) = depth_softmax(q, v, p0), naive_depth_softmax(q, v[kept], p[kept])
  np.testing.assert_allclose(h0, h1, rtol=1e-5, atol=1e-6)
  assert float(jnp.max(w0[1])) == 0.0
  dv = jax.grad(lambda v: jnp.sum(depth_softmax(q, v, p0)[0] * g_h))(v)
  assert float(jnp.max(jnp.abs(dv[1]))) == 0.0


def test_depth_softmax_presence_gradient_is_finite_at_an_absent_slot():
  """Presence 0 (a gated-out layer's slots) gives a gradient of exactly 0 for that presence,
  not the NaN of ``0 * d log(p)/dp`` at p = 0, and finite gradients for the others."""
  rng = np.random.RandomState(1)
  q, v = jnp.asarray(rng.randn(4)), jnp.asarray(rng.randn(3, 1, 2, 4))
  p = jnp.array([1.0, 0.0, 0.5])
  dp = jax.grad(lambda p: jnp.sum(depth_softmax(q, v, p)[0] ** 2))(p)
  assert bool(jnp.all(jnp.isfinite(dp))) and float(dp[1]) == 0.0 and float(dp[2]) != 0.0

def wiring_params(d):
  """One layer's AttnRes params at init: zero queries, unit gains."""
  ones = lambda: {"scale": np.ones(d, np.float32)}
  return {"attn_res_query_attn": np.zeros(d, np.float32),
          "attn_res_query_mlp": np.zeros(d, np.float32),
          "attn_res_key_norm_attn": np.ones(d, np.float32),
          "attn_res_key_norm_mlp": np.ones(d, np.float32),
          "input_layernorm": ones(), "post_attention_layernorm": ones()}


def test_full_update_equation_hand_computed():
  """read = N(sum_i softmax(w.(g*N0(v_i))) v_i) over written slots; write stores at 2l+sub+1."""
  cfg = kit.tiny_cfg("attnres_full", n_layers=2, d_model=8)
  params = wiring_params(8)  # layer 1's
  rng = np.random.RandomState(0)
  w, g, gain = rng.randn(8), 1 + 0.1 * rng.randn(8), 1 + 0.1 * rng.randn(8)
  params["attn_res_query_attn"], params["attn_res_key_norm_attn"] = w, g
  params["input_layernorm"]["scale"] = gain
  values = np.zeros((5, 1, 2, 8), np.float32)
  values[:3] = rng.randn(3, 1, 2, 8)  # slots 0..2 written (embedding, layer 0's two outputs)
  state = attnres.depth_state(jnp.asarray(values), jnp.array([1.0, 1, 1, 0, 0]), jnp.array(2),
                              cfg.norm_eps)
  u, inter = kit.wiring_call(cfg, params, "read", state, 0, jnp.array(1))
  logits = np.einsum("d,sbtd->sbt", w * g, values[:3] / kit.rms(values[:3]))
  alpha = np.exp(logits) / np.exp(logits).sum(0)
  h = np.einsum("sbt,sbtd->btd", alpha, values[:3])
  np.testing.assert_allclose(u, h / kit.rms(h) * gain, atol=1e-5)
  sown = inter["intermediates"]["depth_weights"][0]
  np.testing.assert_allclose(sown[:3], alpha, atol=1e-6)
  np.testing.assert_array_equal(sown[3:], 0)
  y = jnp.full((1, 2, 8), 7.0)
  new, _ = kit.wiring_call(cfg, params, "write", state, y, 0, jnp.array(1))
  np.testing.assert_array_equal(new["values"][3], y)  # slot 2*1 + 0 + 1
  np.testing.assert_array_equal(new["values"][:3], values[:3])
  np.testing.assert_array_equal(new["presence"], [1, 1, 1, 1, 0])


def test_full_readout_hand_computed():
  """readout = N_final(sum_i softmax_i((w * g) . N0(v_i)) v_i) over the present slots, with the
  readout's own query w, key gain g and the final norm's gain."""
  cfg = kit.tiny_cfg("attnres_full", n_layers=1, d_model=8)   # 3 slots
  rng = np.random.RandomState(2)
  w, g, gain = (rng.randn(8).astype(np.float32), (1 + 0.5 * rng.randn(8)).astype(np.float32),
                (1 + 0.1 * rng.randn(8)).astype(np.float32))
  values = rng.randn(3, 1, 2, 8).astype(np.float32)
  state = attnres.depth_state(jnp.asarray(values), jnp.array([1.0, 1, 0]), jnp.array(1),
                              cfg.norm_eps)                    # slot 2 not written: masked
  params = {"readout_query": w, "readout_key_norm": g, "final_norm": {"scale": gain}}
  out = attnres.FullAttnResIO(cfg).apply({"params": params}, state,
                                         method=attnres.FullAttnResIO.readout)
  logits = np.einsum("d,sbtd->sbt", w * g, values[:2] / kit.rms(values[:2]))
  alpha = np.exp(logits) / np.exp(logits).sum(0)
  h = np.einsum("sbt,sbtd->btd", alpha, values[:2])
  np.testing.assert_allclose(out, h / kit.rms(h) * gain, atol=1e-5)


def test_init_state_holds_the_embedding_and_each_slot_s_inverse_rms():
  """Slot 0 = x0, the rest zeros, presence e_0, slot 0, and ``inv_rms`` by hand: 1/RMS(x0) for
  slot 0, 1/sqrt(eps) for an unwritten (zero) slot."""
  cfg = kit.tiny_cfg("attnres_full", n_layers=2, d_model=8)   # 5 slots
  x0 = np.random.RandomState(3).randn(2, 3, 8).astype(np.float32)
  state, _ = attnres.FullAttnResIO(cfg).init_with_output(
      jax.random.PRNGKey(0), jnp.asarray(x0), method=attnres.FullAttnResIO.init_state)
  assert state["values"].shape == (5, 2, 3, 8)
  np.testing.assert_array_equal(state["values"][0], x0)
  np.testing.assert_array_equal(state["values"][1:], 0)
  np.testing.assert_allclose(state["inv_rms"][0], 1 / kit.rms(x0, cfg.norm_eps)[..., 0],
                             rtol=1e-6)
  np.testing.assert_allclose(state["inv_rms"][1:], np.full((4, 2, 3), cfg.norm_eps ** -0.5),
                             rtol=1e-6)
  np.testing.assert_array_equal(state["presence"], [1, 0, 0, 0, 0])
  assert int(state["slot"]) == 0


def test_block_update_equation_hand_computed():
  """Eq. 6 with 2-sublayer blocks: first sublayer of block 2 sees [b0, b1], then b2 = y."""
  cfg = kit.tiny_cfg("attnres_block", n_layers=2, d_model=8, residual={"n_blocks": 2})
  params = wiring_params(8)
  rng = np.random.RandomState(1)
  values = np.zeros((3, 1, 2, 8), np.float32)
  values[:2] = rng.randn(2, 1, 2, 8)
  state = attnres.depth_state(jnp.asarray(values), jnp.array([1.0, 1, 0]), jnp.array(1),
                              cfg.norm_eps)
  params["attn_res_query_attn"] = w = rng.randn(8)
  _, inter = kit.wiring_call(cfg, params, "read", state, 0, jnp.array(1))
  logits = np.einsum("d,sbtd->sbt", w, values[:2] / kit.rms(values[:2]))
  alpha = np.exp(logits) / np.exp(logits).sum(0)
  np.testing.assert_allclose(inter["intermediates"]["depth_weights"][0][:2], alpha, atol=1e-6)
  np.testing.assert_array_equal(inter["intermediates"]["own_block_weight"][0], 0)
  y1, y2 = jnp.full((1, 2, 8), 2.0), jnp.full((1, 2, 8), 3.0)
  s1, _ = kit.wiring_call(cfg, params, "write", state, y1, 0, jnp.array(1))
  s2, _ = kit.wiring_call(cfg, params, "write", s1, y2, 1, jnp.array(1))
  np.testing.assert_allclose(s1["values"][2], y1)  # b_2^1 = v
  np.testing.assert_allclose(s2["values"][2], y1 + y2)  # b_2^2 = b_2^1 + v
  np.testing.assert_array_equal(s2["values"][:2], values[:2])
  np.testing.assert_array_equal(s2["presence"], [1, 1, 1])


# Compiles are the cost of these tests on CPU: one jitted forward per config, shared by tests.
TOKENS = jnp.asarray(kit.text_batch(2, 12))


@functools.cache
def forward(cfg):
  """jit of ``(params, gate) -> (logits, {'hidden','update'}, intermediates)`` on TOKENS."""
  def run(params, gate):
    (logits, layers), inter = Transformer(cfg).apply(
        {"params": params}, TOKENS, gate=gate, return_layers=True, mutable=["intermediates"])
    return logits, layers, inter["intermediates"]
  return jax.jit(run)


@functools.cache
def params_for(cfg, scale: float = 0.0):
  """Init params (jitted init), plus noise of ``scale`` on every leaf when > 0."""
  params = jax.jit(lambda: kit.nn.unbox(Transformer(cfg).init(
      jax.random.PRNGKey(0), TOKENS)["params"]))()
  return kit.perturb(params, scale) if scale else params


def run(cfg, params, gate=None):
  return forward(cfg)(params, jnp.ones((cfg.n_layers,)) if gate is None else gate)


FULL3 = kit.tiny_cfg("attnres_full", n_layers=3)
BLOCK3 = kit.tiny_cfg("attnres_block", n_layers=3, residual={"n_blocks": 2})
BLOCK3_SUB = kit.tiny_cfg("attnres_block", n_layers=3,
                          residual={"n_blocks": 3, "block_unit": "sublayer"})
CONFIGS = {"full": FULL3, "block": BLOCK3, "block_sublayer": BLOCK3_SUB}


def test_full_at_init_averages_sources_uniformly():
  _, _, sown = run(FULL3, params_for(FULL3))
  weights = sown["layers"]["residual"]["depth_weights"]  # (attn, mlp), each [L, S, B, T]
  for layer in range(3):
    for sub in range(2):
      k = 2 * layer + sub
      want = np.where(np.arange(7) <= k, 1.0 / (k + 1), 0.0)
      np.testing.assert_allclose(weights[sub][layer][..., 0, 0], want, atol=1e-6)
  np.testing.assert_allclose(sown["residual_io"]["readout_depth_weights"][0], 1 / 7, atol=1e-6)


def test_block_sources_follow_eq6_at_init():
  """L=4, 2 blocks of 2 layers: sources [b0], [b0,b1^i], ..., then [b0,b1], [b0,b1,b2^1], ..."""
  cfg = kit.tiny_cfg("attnres_block", n_layers=4, residual={"n_blocks": 2})
  sown = run(cfg, params_for(cfg))[2]["layers"]["residual"]
  n_sources = [1, 2, 2, 2, 2, 3, 3, 3]  # per global sublayer k
  own = [0, 1 / 2, 1 / 2, 1 / 2, 0, 1 / 3, 1 / 3, 1 / 3]
  for k in range(8):
    layer, sub = divmod(k, 2)
    want = np.where(np.arange(3) < n_sources[k], 1.0 / n_sources[k], 0.0)
    np.testing.assert_allclose(sown["depth_weights"][sub][layer][..., 0, 0], want, atol=1e-6)
    np.testing.assert_allclose(sown["own_block_weight"][sub][layer], own[k], atol=1e-6)


def test_block_with_one_sublayer_per_block_equals_full():
  block = kit.tiny_cfg("attnres_block", n_layers=3,
                       residual={"n_blocks": 6, "block_unit": "sublayer"})
  params = params_for(FULL3, 0.3)  # non-zero queries: non-uniform weights
  got, want = run(block, params), run(FULL3, params)
  np.testing.assert_allclose(got[0], want[0], atol=1e-5)
  np.testing.assert_allclose(got[1]["hidden"], want[1]["hidden"], atol=1e-5)
  np.testing.assert_allclose(got[2]["layers"]["residual"]["depth_weights"][0],
                             want[2]["layers"]["residual"]["depth_weights"][0], atol=1e-6)


def test_block_schedule_k3():
  assert attnres.block_schedule(93, 8) == (24, 8)  # K3: 12-layer blocks, last one 9 layers
  assert attnres.block_schedule(16, 8) == (4, 8)
  assert attnres.block_schedule(32, 8) == (8, 8)
  assert attnres.block_schedule(70, 8) == (18, 8)  # 9-layer blocks, last one 7
  assert attnres.block_schedule(4, 8) == (1, 8)  # 8 blocks of one sublayer: Full AttnRes
  assert attnres.block_schedule(4, 8, "layer") == (2, 4)  # one layer each
  # Spec 5.2, 8 blocks at every suite depth; whole-layer blocks give 7 where 8 does not divide L.
  for L, sub in ((20, 5), (28, 7), (42, 11), (24, 6), (56, 14)):
    assert attnres.block_schedule(L, 8) == (sub, 8), L
  assert attnres.block_schedule(20, 8, "layer") == (6, 7)
  assert attnres.block_schedule(42, 8, "layer") == (12, 7)
  assert attnres.block_schedule(3, 6, "sublayer") == (1, 6)


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_hidden_gate_and_permutation(kind):
  """hidden = embedding + present outputs; gate 0 leaves it; identity order = the model."""
  cfg = CONFIGS[kind]
  params = params_for(cfg, 0.1)
  logits, layers, _ = run(cfg, params)
  x0 = params["embed"]["embedding"][TOKENS]
  np.testing.assert_allclose(layers["hidden"], x0 + jnp.cumsum(layers["update"], 0), atol=1e-5)
  gated, gated_layers, sown = run(cfg, params, jnp.array([1.0, 0.0, 1.0]))
  np.testing.assert_allclose(gated_layers["hidden"][1], gated_layers["hidden"][0], atol=1e-6)
  assert not np.allclose(gated, logits, atol=1e-4)
  if kind == "full":  # the gated layer's slots 3, 4 carry zero weight for every later sublayer
    np.testing.assert_array_equal(sown["layers"]["residual"]["depth_weights"][0][2][3:5], 0)
  same = run(cfg, permute_layers(params, jnp.array([0, 1, 2])))[0]
  np.testing.assert_allclose(same, logits, atol=1e-6)
  assert not np.allclose(run(cfg, permute_layers(params, jnp.array([0, 2, 1])))[0], logits,
                         atol=1e-4)


def test_block_gate_zero_restores_both_slots_a_straddling_layer_wrote():
  """Blocks of 3 sublayers (L=4, 3 blocks, 4 slots): layer 1's attention (k=2) ends block 1 and
  its MLP (k=3) opens block 2. Gated out, it must leave both slots as layer 0 left them, the
  window [1, 2] below the last slot (how the suite's L = 20, 28 and 42 place boundaries)."""
  cfg = kit.tiny_cfg("attnres_block", n_layers=4,
                     residual={"n_blocks": 3, "block_unit": "sublayer"})
  assert attnres.block_schedule_of(cfg) == (3, 3)
  params = params_for(cfg, 0.1)
  _, layers, _ = run(cfg, params, jnp.array([1.0, 0.0, 1.0, 1.0]))
  np.testing.assert_allclose(layers["hidden"][1], layers["hidden"][0], atol=1e-6)
  _, ungated, _ = run(cfg, params)
  np.testing.assert_allclose(layers["hidden"][0], ungated["hidden"][0], atol=1e-6)
  # The restored slots' 1/RMS, which later depth logits read: no test read it (every check
  # above goes through hidden = sum p_i v_i), so a skip keeping the new slots' 1/RMS passed.
  rng = np.random.RandomState(0)
  values = lambda: jnp.asarray(rng.standard_normal((4, 1, 2, cfg.d_model)), jnp.float32)
  state = lambda v, slot: {"values": v, "inv_rms": inverse_rms(v, cfg.norm_eps),
                           "presence": jnp.ones(4), "slot": jnp.asarray(slot)}
  old = state(values(), 1)
  new = state(old["values"].at[1:3].set(values()[1:3]), 2)   # the layer wrote slots 1 and 2
  out, _ = kit.wiring_call(cfg, wiring_params(cfg.d_model), "skip", old, new, 0.0)
  np.testing.assert_allclose(out["values"], old["values"], atol=1e-6)
  np.testing.assert_allclose(out["inv_rms"], old["inv_rms"], rtol=1e-6)


@pytest.mark.parametrize("name,residual", [("attnres_full", None),
                                           ("attnres_block", {"n_blocks": 3})])
def test_gate_zero_is_the_layer_removed(name, residual):
  """gate[1] = 0 equals the 2-layer network of layers 0 and 2: its sources are masked out.

  (Block with n_blocks=3: one layer per block at L=3 and at L=2, so both share one layout.)
  """
  cfg3 = kit.tiny_cfg(name, n_layers=3, residual=residual)
  cfg2 = kit.tiny_cfg(name, n_layers=2, residual=residual)
  params = params_for(cfg3, 0.3)
  params2 = dict(params, layers=jax.tree.map(lambda a: a[jnp.array([0, 2])], params["layers"]))
  gated = run(cfg3, params, jnp.array([1.0, 0.0, 1.0]))[0]
  np.testing.assert_allclose(gated, run(cfg2, params2)[0], atol=1e-5)


def test_a_gated_call_does_not_take_the_gateless_buffer_stack():
  """Scan + remat without per-layer outputs trains through model/buffer_stack.py, which has no
  gate; a call with a gate (the diagnostics' loss) must stay on the scan, where gate 0 removes
  the layer, and give the logits of the same gated call that asks for per-layer outputs."""
  cfg = kit.tiny_cfg("attnres_full", n_layers=2, d_model=16)
  assert cfg.scan_layers and cfg.remat_policy != "none"
  params, gate = kit.perturb(kit.init(cfg), 0.3), jnp.array([0.0, 1.0])
  logits = kit.jit(lambda p, g: Transformer(cfg).apply({"params": p}, TOKENS, gate=g))(
      params, gate)
  np.testing.assert_allclose(logits, kit.run(cfg, params, TOKENS, gate)[0], atol=1e-5)
  assert not np.allclose(logits, kit.run(cfg, params, TOKENS)[0], atol=1e-4)


def test_per_layer_outputs_or_sown_weights_keep_full_attnres_on_the_scan():
  """With no gate, a call asking for per-layer outputs, or one collecting ``intermediates``,
  must still take the scan (model/buffer_stack.py returns neither): the outputs equal the
  gate-of-ones run's, and every sublayer's sown depth weights sum to 1 over the slots."""
  cfg = kit.tiny_cfg("attnres_full", n_layers=2, d_model=16)
  params = kit.perturb(kit.init(cfg), 0.3)
  _, layers = kit.jit(lambda p: Transformer(cfg).apply({"params": p}, TOKENS,
                                                       return_layers=True))(params)
  np.testing.assert_allclose(layers["hidden"], kit.run(cfg, params, TOKENS)[1]["hidden"],
                             atol=1e-5)
  _, sown = kit.jit(lambda p: Transformer(cfg).apply({"params": p}, TOKENS,
                                                     mutable=["intermediates"]))(params)
  for weights in sown["intermediates"]["layers"]["residual"]["depth_weights"]:   # attn, mlp
    assert weights.shape == (2, 5, 2, 12)                                        # [L,S,B,T]
    np.testing.assert_allclose(weights.sum(1), 1.0, atol=1e-5)

@pytest.mark.parametrize("n_layers, residual, slots", [
    (6, None, 13),
    # 16 sublayers in 8 blocks of 2: 9 slots, read through 8 (static_prefix) until the last
    # block, whose partial sum is slot 8. One sublayer per block (once this case) is Full
    # AttnRes, whose reads a static_prefix(n) for Block's (n + 1) would pass.
    (8, {"n_blocks": 8, "block_unit": "sublayer"}, 9)])
def test_scan_matches_unrolled(n_layers, residual, slots):
  """The unrolled loop reads only the first ``static_prefix`` slots (a static layer index), the
  scan every slot: the same logits, hidden states and zero-padded depth weights, with a layer
  gated out too. Full AttnRes, and Block with blocks open across layers."""
  design = "attnres_full" if residual is None else "attnres_block"
  cfg = kit.tiny_cfg(design, n_layers=n_layers, residual=residual)
  loop = kit.tiny_cfg(design, n_layers=n_layers, residual=residual, scan_layers=False,
                      remat_policy="none")
  params = params_for(cfg, 0.1)
  for gate in (None, jnp.ones((n_layers,)).at[1].set(0.0)):
    got = run(cfg, params, gate)
    want = run(loop, unstack_layers(params, n_layers), gate)
    np.testing.assert_allclose(got[0], want[0], atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(got[1]["hidden"], want[1]["hidden"], atol=2e-5, rtol=1e-5)
    for sub in (0, 1):
      scanned = got[2]["layers"]["residual"]["depth_weights"][sub]        # [L, S, B, T]
      assert scanned.shape[1] == slots
      for layer in range(n_layers):
        unrolled = want[2][f"layers_{layer}"]["residual"]["depth_weights"][sub]  # [S,B,T]
        np.testing.assert_allclose(unrolled, scanned[layer], atol=1e-6)


def test_finite_gradients_reach_queries():
  params = params_for(FULL3)
  grads = jax.jit(jax.grad(kit.loss_fn, argnums=1), static_argnums=0)(FULL3, params, TOKENS)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
  q = grads["layers"]["residual"]["attn_res_query_mlp"]
  assert float(jnp.abs(q).min(axis=-1).max()) > 0  # zero-init queries still get gradient
  assert float(jnp.abs(grads["residual_io"]["readout_query"]).max()) > 0


@pytest.mark.parametrize("name,residual", [("attnres_full", None),
                                           ("attnres_block", {"n_blocks": 2})])
def test_training_lowers_loss(name, residual):
  kit.check_training_lowers_loss(name, residual)


def test_config_errors_name_the_field():
  with pytest.raises(ConfigError, match=r"config\.model\.residual\.n_blocks=0; allowed"):
    kit.tiny_cfg("attnres_block", residual={"n_blocks": 0})
  with pytest.raises(ConfigError, match=r"config\.model\.residual\.block_unit='block'.*layer"):
    kit.tiny_cfg("attnres_block", residual={"block_unit": "block"})
  with pytest.raises(ConfigError, match=r"config\.model\.residual\.n_blocks"):
    kit.tiny_cfg("attnres_full", residual={"n_blocks": 8})
  assert kit.tiny_cfg("attnres_block").residual.n_blocks == 8  # Design.defaults merged
