"""Parity with the PyPI reference ``moda-attention==0.1.0`` (torch) with shared weights.

Test requirement: ``pip install --no-deps moda-attention==0.1.0`` (and torch). Documented
differences (depthbench_jax/residual/moda.py), checked here as relations:
* The reference kernel ``moda_attention_naive`` on fully written depth KV equals ours.
* The reference model reads its whole zero-initialised cache, so unwritten slots join the softmax
  as key 0 / value 0; the paper attends to preceding layers only, which is ours (presence mask).
  Relation: reference(cache with zero slots) == ours(all slots present), and ours(written slots
  only) == reference(cache truncated to the written slots).
* The reference attention writes separate ``k_depth_proj``/``v_depth_proj`` projections; ours (the
  paper's default, the authors' LM code) writes the layer's own ``k_proj``/``v_proj``: with the
  reference's depth projections set to its k/v projections the written depth KV agree.
* No RoPE in the reference: our positions are set to 0 (RoPE = identity).
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import pytest

from tests import helpers

import residual_testkit as kit
from depthbench_jax.model.layers import Attention, rope_table
from depthbench_jax.residual.moda import MoDA, moda_attention

torch = helpers.required("torch")
moda_ref = helpers.required("moda")

B, T, H, KVH, HD = 2, 6, 4, 2, 8


def to_ref_depth(depth):
  """ours [B,T,K,S,hd] -> reference [B,K,T*S,hd] (token t's slots at t*S .. t*S+S-1)."""
  s = depth.shape[3]
  return torch.from_numpy(np.ascontiguousarray(
      np.transpose(depth, (0, 2, 1, 3, 4)).reshape(B, KVH, T * s, HD)))


def heads_first(x):  # [B,T,n,hd] -> torch [B,n,T,hd]
  return torch.from_numpy(np.ascontiguousarray(np.transpose(x, (0, 2, 1, 3))))


def random_qkv(seed, s):
  rng = np.random.RandomState(seed)
  f = lambda *shape: rng.randn(*shape).astype(np.float32)
  return f(B, T, H, HD), f(B, T, KVH, HD), f(B, T, KVH, HD), f(B, T, KVH, s, HD), f(
      B, T, KVH, s, HD)


def reference_kernel(q, k, v, dk, dv, chunk_size=None):
  out = moda_ref.moda_attention_naive(heads_first(q), heads_first(k), heads_first(v),
                                      to_ref_depth(dk), to_ref_depth(dv), num_layers=dk.shape[3],
                                      chunk_size=chunk_size)
  return np.transpose(out.numpy(), (0, 2, 1, 3))


@pytest.mark.parametrize("chunk_size", [None, 4])
def test_kernel_matches_reference_on_written_depth(chunk_size):
  q, k, v, dk, dv = random_qkv(0, 3)
  got = moda_attention(*map(jnp.asarray, (q, k, v, dk, dv)), jnp.ones(3))
  np.testing.assert_allclose(got, reference_kernel(q, k, v, dk, dv, chunk_size), atol=1e-5)


def test_reference_reads_unwritten_slots_as_zero_keys():
  q, k, v, dk, dv = random_qkv(1, 4)
  dk[..., 2:, :], dv[..., 2:, :] = 0, 0  # slots 2, 3 unwritten (layer 1 of a 2-layer model)
  ref = reference_kernel(q, k, v, dk, dv)
  ours_paper = moda_attention(*map(jnp.asarray, (q, k, v, dk, dv)), jnp.array([1.0, 1, 0, 0]))
  ours_all = moda_attention(*map(jnp.asarray, (q, k, v, dk, dv)), jnp.ones(4))
  np.testing.assert_allclose(ours_all, ref, atol=1e-5)
  np.testing.assert_allclose(ours_paper, reference_kernel(q, k, v, dk[..., :2, :], dv[..., :2, :]),
                             atol=1e-5)
  assert not np.allclose(ours_paper, ref, atol=1e-3)


class AttendOnly(nn.Module):
  """The MoDA attention sublayer alone: ``wiring.attend(attn, u, rope, state, layer)`` with every
  position 0."""
  cfg: object

  @nn.compact
  def __call__(self, u, state, layer):
    cfg = self.cfg
    attn = Attention(cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, name="self_attn")
    # RoPE at position 0 is the identity.
    rope = rope_table(jnp.zeros(u.shape[:2], jnp.int32), cfg.head_dim, cfg.rope_theta)
    return MoDA(cfg, name="residual").attend(attn, u, rope, state, layer)


def test_attention_module_matches_reference():
  torch.manual_seed(0)
  rcfg = moda_ref.MoDAConfig(d_model=32, num_heads=H, num_kv_heads=KVH, num_layers=4,
                             chunk_size=None)
  ref = moda_ref.MoDAAttention(rcfg).eval()
  with torch.no_grad():  # documented relation: the reference's depth write = its k/v proj
    ref.k_depth_proj.weight.copy_(ref.k_proj.weight)
    ref.v_depth_proj.weight.copy_(ref.v_proj.weight)
  cfg = kit.tiny_cfg("moda", n_layers=2, n_kv_heads=KVH)
  t = lambda w: w.detach().numpy().T
  attn_params = {
      "q_proj": {"kernel": t(ref.q_proj.weight).reshape(32, H, HD)},
      "k_proj": {"kernel": t(ref.k_proj.weight).reshape(32, KVH, HD)},
      "v_proj": {"kernel": t(ref.v_proj.weight).reshape(32, KVH, HD)},
      "o_proj": {"kernel": t(ref.o_proj.weight).reshape(H, HD, 32)}}
  rng = np.random.RandomState(2)
  u = rng.randn(B, T, 32).astype(np.float32)
  _, _, _, dk, dv = random_qkv(3, 4)
  dk[..., 2:, :], dv[..., 2:, :] = 0, 0
  state = {"x": jnp.zeros((B, T, 32)), "k": jnp.asarray(dk), "v": jnp.asarray(dv),
           "presence": jnp.ones(4)}  # all present: the reference's semantics (see above)
  # The layer index as an array, as nn.scan passes it: a Python int would make MoDA read only
  # slots 0..1 (those of layers < 1), and the reference reads all four.
  (y, new), _ = AttendOnly(cfg).apply({"params": {"self_attn": attn_params}}, jnp.asarray(u),
                                      state, jnp.asarray(1), mutable=["intermediates"])
  with torch.no_grad():
    want, k_write, v_write = ref(torch.from_numpy(u), to_ref_depth(dk), to_ref_depth(dv))
  np.testing.assert_allclose(y, want.numpy(), atol=1e-5)
  np.testing.assert_allclose(new["k"][:, :, :, 2], np.transpose(k_write.numpy(), (0, 2, 1, 3)),
                             atol=1e-5)
  np.testing.assert_allclose(new["v"][:, :, :, 2], np.transpose(v_write.numpy(), (0, 2, 1, 3)),
                             atol=1e-5)
  np.testing.assert_array_equal(new["presence"], 1)
