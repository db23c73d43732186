"""MoDA: the joint sequence+depth softmax by hand, GQA, depth-KV writes, gate, training."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import residual_testkit as kit
from depthbench_jax.errors import ConfigError
from depthbench_jax.model.layers import causal_attention, causal_query_blocks, rope_table
from depthbench_jax.model.transformer import Transformer, permute_layers, unstack_layers
from depthbench_jax.residual.moda import moda_attention

TOKENS = jnp.asarray(kit.text_batch(2, 12))
MODA3 = kit.tiny_cfg("moda", n_layers=3, n_kv_heads=2, qk_norm=True)


def test_moda_attention_hand_computed():
  # T=2, one head, hd=1 (scale 1). q = 1; k = (0, ln2), v = (1, 3); depth slot: k = (ln3, 0),
  # v = (5, 7). t=0: logits [0 | ln3] -> (1/4, 3/4) -> 1/4 + 15/4 = 4.
  # t=1: logits [0, ln2 | 0] -> (1, 2, 1)/4 -> (1 + 6 + 7)/4 = 3.5. Depth absent: 1 and 7/3.
  q = jnp.ones((1, 2, 1, 1))
  k = jnp.array([0.0, np.log(2)]).reshape(1, 2, 1, 1)
  v = jnp.array([1.0, 3.0]).reshape(1, 2, 1, 1)
  dk = jnp.array([np.log(3), 0.0]).reshape(1, 2, 1, 1, 1)   # [B,T,K,S,hd]
  dv = jnp.array([5.0, 7.0]).reshape(1, 2, 1, 1, 1)
  np.testing.assert_allclose(moda_attention(q, k, v, dk, dv, jnp.ones(1)).ravel(), [4, 3.5],
                             atol=1e-5)
  np.testing.assert_allclose(moda_attention(q, k, v, dk, dv, jnp.zeros(1)).ravel(), [1, 7 / 3],
                             atol=1e-5)
  # A soft presence p weighs the slot by p e^z: t=0 (1, 1.5)/2.5 -> (1 + 7.5)/2.5 = 3.4;
  # t=1 (1, 2, 0.5)/3.5 -> (1 + 6 + 3.5)/3.5 = 3.
  np.testing.assert_allclose(moda_attention(q, k, v, dk, dv, jnp.full(1, 0.5)).ravel(), [3.4, 3],
                             atol=1e-5)


@pytest.mark.parametrize("t", [5, 64])  # 64 tokens run as two causal query blocks
def test_moda_attention_gqa_against_loops(t):
  assert causal_query_blocks(t) == (1 if t == 5 else 2)
  rng = np.random.RandomState(0)
  b, h, kvh, hd, s = 2, 4, 2, 8, 3
  q, k, v = rng.randn(b, t, h, hd), rng.randn(b, t, kvh, hd), rng.randn(b, t, kvh, hd)
  dk, dv = rng.randn(b, t, kvh, s, hd), rng.randn(b, t, kvh, s, hd)
  presence = np.array([1.0, 0.0, 1.0])
  got = moda_attention(*map(jnp.asarray, (q, k, v, dk, dv, presence)))
  want = np.zeros((b, t, h, hd))
  for bi in range(b):
    for ti in range(t):
      for hi in range(h):
        g = hi // (h // kvh)  # query head hi reads KV head hi // G
        keys = [k[bi, j, g] for j in range(ti + 1)] + [dk[bi, ti, g, i] for i in (0, 2)]
        vals = [v[bi, j, g] for j in range(ti + 1)] + [dv[bi, ti, g, i] for i in (0, 2)]
        z = np.array([q[bi, ti, hi] @ key for key in keys]) / np.sqrt(hd)
        a = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        want[bi, ti, hi] = a @ np.array(vals)
  np.testing.assert_allclose(got, want, atol=1e-5)
  # No depth present: plain causal attention.
  np.testing.assert_allclose(moda_attention(*map(jnp.asarray, (q, k, v, dk, dv)), jnp.zeros(3)),
                             causal_attention(*map(jnp.asarray, (q, k, v))), atol=1e-5)


@functools.cache
def forward(cfg):
  def run(params, gate):
    return Transformer(cfg).apply({"params": params}, TOKENS, gate=gate, return_layers=True)
  return jax.jit(run)


@functools.cache
def params_for(cfg, scale: float = 0.1):
  params = jax.jit(lambda: kit.nn.unbox(Transformer(cfg).init(
      jax.random.PRNGKey(0), TOKENS)["params"]))()
  return kit.perturb(params, scale)


def run(cfg, params, gate=None):
  return forward(cfg)(params, jnp.ones((cfg.n_layers,)) if gate is None else gate)


def test_qk_norm_normalises_the_depth_keys_too():
  """With qk_norm (the 1.6B Qwen3 layout) every key is RMS-normalised, the depth keys of the
  attention and FFN slots included: scaling all key projections by 10 leaves the model's output
  as it was (RMSNorm is scale-invariant), while without the norm it moves."""
  params = params_for(MODA3)
  scaled = jax.tree.map(lambda a: a, params)
  scaled["layers"]["self_attn"]["k_proj"]["kernel"] = 10 * params["layers"]["self_attn"][
      "k_proj"]["kernel"]
  scaled["layers"]["residual"]["ffn_depth_k_proj"]["kernel"] = 10 * params["layers"][
      "residual"]["ffn_depth_k_proj"]["kernel"]
  np.testing.assert_allclose(run(MODA3, scaled)[0], run(MODA3, params)[0], atol=2e-4, rtol=1e-4)
  plain = kit.tiny_cfg("moda", n_layers=3, n_kv_heads=2)
  plain_params = params_for(plain)
  plain_scaled = jax.tree.map(lambda a: a, plain_params)
  plain_scaled["layers"]["residual"]["ffn_depth_k_proj"]["kernel"] = 10 * plain_params[
      "layers"]["residual"]["ffn_depth_k_proj"]["kernel"]
  assert not np.allclose(run(plain, plain_scaled)[0], run(plain, plain_params)[0], atol=1e-3)


def test_depth_kv_written_by_attention_and_ffn():
  """Slot 2l = layer l's own k_proj(u), v_proj(u) (pre QK-norm/RoPE); 2l+1 = FFN KV of N(x)."""
  cfg = kit.tiny_cfg("moda", n_layers=2, n_kv_heads=2, qk_norm=True)
  params = params_for(cfg)
  embed = params["embed"]["embedding"][TOKENS]
  p0 = jax.tree.map(lambda a: a[0], params["layers"])
  x0 = embed
  state = {"x": x0, "k": jnp.zeros((2, 12, 2, 4, 8)), "v": jnp.zeros((2, 12, 2, 4, 8)),
           "presence": jnp.zeros(4)}
  u = x0 / kit.rms(x0) * p0["residual"]["input_layernorm"]["scale"]
  k_want = np.einsum("btd,dkh->btkh", u, p0["self_attn"]["k_proj"]["kernel"])
  v_want = np.einsum("btd,dkh->btkh", u, p0["self_attn"]["v_proj"]["kernel"])

  class OneLayer(kit.nn.Module):
    cfg: object

    @kit.nn.compact
    def __call__(self, state):
      from depthbench_jax.model.transformer import Block  # pylint: disable=g-import-not-at-top
      xs = {"layer": jnp.array(0), "gate": jnp.array(1.0)}
      rope = rope_table(jnp.broadcast_to(jnp.arange(12), (2, 12)), self.cfg.head_dim,
                        self.cfg.rope_theta)
      return Block(self.cfg, name="layer")(state, xs, rope)[0]

  new = OneLayer(cfg).apply({"params": {"layer": p0}}, state)
  np.testing.assert_allclose(new["k"][:, :, :, 0], k_want, atol=1e-5)
  np.testing.assert_allclose(new["v"][:, :, :, 0], v_want, atol=1e-5)
  # Slot 1 = the FFN's depth K/V of N(x after attention). With the MLP's output projection
  # zeroed the layer's output is that x (the slot does not depend on it: same K/V).
  p_mid = jax.tree.map(lambda a: a, p0)
  p_mid["mlp"]["down_proj"]["kernel"] = jnp.zeros_like(p0["mlp"]["down_proj"]["kernel"])
  mid = OneLayer(cfg).apply({"params": {"layer": p_mid}}, state)
  np.testing.assert_allclose(mid["k"], new["k"], atol=1e-6)
  x_mid = np.asarray(mid["x"])
  assert np.abs(x_mid - x0).max() > 0 and np.abs(np.asarray(new["x"]) - x_mid).max() > 0
  u1 = x_mid / kit.rms(x_mid) * p0["residual"]["post_attention_layernorm"]["scale"]
  for name, slot in (("ffn_depth_k_proj", new["k"]), ("ffn_depth_v_proj", new["v"])):
    want = np.einsum("btd,dkh->btkh", u1, p0["residual"][name]["kernel"])
    np.testing.assert_allclose(slot[:, :, :, 1], want, atol=1e-5)
  np.testing.assert_array_equal(new["presence"], [1, 1, 0, 0])
  np.testing.assert_array_equal(new["k"][:, :, :, 2:], 0)


def test_first_layer_is_plain_preln_attention():
  """Layer 0 has no depth keys: MoDA's first layer output equals Pre-LN's with shared weights."""
  pre = kit.tiny_cfg("preln", n_layers=1, n_kv_heads=2, qk_norm=True)
  moda = kit.tiny_cfg("moda", n_layers=1, n_kv_heads=2, qk_norm=True)
  params = params_for(moda)
  got = run(moda, params)[0]
  want = Transformer(pre).apply({"params": kit.transplant(params, kit.init(pre))}, TOKENS)
  np.testing.assert_allclose(got, want, atol=1e-5)


def test_gate_zero_is_the_layer_removed():
  cfg2 = kit.tiny_cfg("moda", n_layers=2, n_kv_heads=2, qk_norm=True)
  params = params_for(MODA3)
  params2 = dict(params, layers=jax.tree.map(lambda a: a[jnp.array([0, 2])], params["layers"]))
  gated, layers = run(MODA3, params, jnp.array([1.0, 0.0, 1.0]))
  np.testing.assert_allclose(gated, run(cfg2, params2)[0], atol=1e-5)
  np.testing.assert_allclose(layers["hidden"][1], layers["hidden"][0], atol=1e-6)
  assert not np.allclose(gated, run(MODA3, params)[0], atol=1e-4)


def test_depth_keys_carry_no_rope_so_a_shifted_sequence_reads_other_depth_logits():
  """Depth keys are stored before RoPE and read without it (the authors' ``origin_k``): the
  query is rotated to its position, the depth key is not, so ``R_t q . k_d`` depends on t. The
  sequence part is relative (``R_t q . R_s k``): Pre-LN's logits are the same at positions
  shifted by 5, MoDA's are not. Depth keys rotated at the read (``R_t q . R_t k_d``, position-
  free) passed every test here: the module parity runs at position 0, where RoPE is identity."""
  shifted = lambda cfg, params, offset: Transformer(cfg).apply(
      {"params": params}, TOKENS,
      positions=jnp.broadcast_to(jnp.arange(TOKENS.shape[1]) + offset, TOKENS.shape))
  for cfg, moves in ((kit.tiny_cfg("preln", n_layers=3, n_kv_heads=2, qk_norm=True), False),
                     (MODA3, True)):
    params = params_for(cfg)
    moved = np.abs(np.asarray(shifted(cfg, params, 0)) - np.asarray(shifted(cfg, params, 5)))
    assert (moved.max() > 1e-3) if moves else (moved.max() < 1e-4), (cfg.design, moved.max())


def test_scan_matches_unrolled_reading_a_prefix():
  """Unrolled, layers 1-4 of 6 read the first 8 of the 12 depth slots, layer 0 none and layer 5
  all 12 (a static layer index, ``base.static_prefix``); the scan reads all 12 masked: the same
  logits, gated too."""
  cfg = kit.tiny_cfg("moda", n_layers=6, n_kv_heads=2, qk_norm=True)
  loop = kit.tiny_cfg("moda", n_layers=6, n_kv_heads=2, qk_norm=True, scan_layers=False,
                      remat_policy="none")
  params = params_for(cfg)
  for gate in (None, jnp.array([1.0, 0.0, 1.0, 1.0, 1.0, 1.0])):
    got = run(cfg, params, gate)
    want = run(loop, unstack_layers(params, 6), gate)
    np.testing.assert_allclose(got[0], want[0], atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(got[1]["hidden"], want[1]["hidden"], atol=2e-5, rtol=1e-5)


def test_scan_matches_unrolled_and_permutation():
  loop = kit.tiny_cfg("moda", n_layers=3, n_kv_heads=2, qk_norm=True, scan_layers=False,
                      remat_policy="none")
  params = params_for(MODA3)
  got = run(MODA3, params)
  want = run(loop, unstack_layers(params, 3))
  np.testing.assert_allclose(got[0], want[0], atol=2e-5, rtol=1e-5)
  np.testing.assert_allclose(got[1]["hidden"], want[1]["hidden"], atol=2e-5, rtol=1e-5)
  np.testing.assert_allclose(run(MODA3, permute_layers(params, jnp.array([0, 1, 2])))[0], got[0],
                             atol=1e-6)
  assert not np.allclose(run(MODA3, permute_layers(params, jnp.array([0, 2, 1])))[0], got[0],
                         atol=1e-4)


def test_training_lowers_loss():
  kit.check_training_lowers_loss("moda")


def test_config_errors_name_the_field():
  with pytest.raises(ConfigError, match=r"config\.model\.residual\.ffn_kv='yes'; allowed"):
    kit.tiny_cfg("moda", residual={"ffn_kv": "yes"})
  cfg = kit.tiny_cfg("moda", residual={"ffn_kv": False})
  assert "ffn_depth_k_proj" not in kit.init(cfg)["layers"]["residual"]
