"""Causal attention in query blocks equals the unblocked softmax attention, values and grads;
the cuDNN path's head-dim padding and its selection rule."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from depthbench_jax.model.layers import (KVCache, causal_attention, causal_blocks,
                                         causal_query_blocks, cudnn_head_dim, grouped_query,
                                         padded_dot_product_attention, uses_cudnn_attention)


def reference_attention(q, k, v):
  """Plain numpy: softmax over keys j <= i of q_i . k_j / sqrt(hd), GQA heads h -> h // (H/K)."""
  b, t, h, hd = q.shape
  group = h // k.shape[2]
  out = np.zeros_like(q)
  for head in range(h):
    kh, vh = k[:, :, head // group], v[:, :, head // group]
    logits = np.einsum("bqd,bkd->bqk", q[:, :, head], kh) / np.sqrt(hd)
    logits = np.where(np.tril(np.ones((t, t), bool)), logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    out[:, :, head] = np.einsum("bqk,bkd->bqd", p / p.sum(-1, keepdims=True), vh)
  return out


def qkv(t, heads=4, kv_heads=2, hd=8, seed=0):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(2, t, heads, hd)).astype(np.float32),
          rng.normal(size=(2, t, kv_heads, hd)).astype(np.float32),
          rng.normal(size=(2, t, kv_heads, hd)).astype(np.float32))


@pytest.mark.parametrize("n_blocks", [1, 2, 4, 8])
def test_blocked_causal_attention_matches_reference(n_blocks):
  q, k, v = qkv(16)
  out = jax.jit(causal_attention, static_argnames="n_blocks")(q, k, v, n_blocks=n_blocks)
  np.testing.assert_allclose(out, reference_attention(q, k, v), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("hd", [44, 76])
def test_bf16_queries_are_scaled_by_the_exact_inverse_sqrt_head_dim(hd):
  """bf16 q: ``q / sqrt(hd)`` is rounded once from fp32. With the scale itself rounded to bf16
  (0.15039 for hd = 44, against 0.15076) 44% of the entries came out one bf16 step off."""
  q = jnp.asarray(np.random.default_rng(0).normal(size=(1, 4, 2, hd)), jnp.bfloat16)
  got = grouped_query(q, 1)
  want = (q.astype(jnp.float32) * (1.0 / np.sqrt(hd))).astype(jnp.bfloat16)
  assert got.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(got, np.float32).reshape(want.shape),
                                np.asarray(want, np.float32))


def test_blocked_gradients_equal_unblocked():
  q, k, v = map(jnp.asarray, qkv(64, seed=1))
  g = jax.random.normal(jax.random.PRNGKey(0), q.shape)
  grads = lambda n: jax.jit(jax.grad(lambda *a: jnp.sum(causal_attention(*a, n_blocks=n) * g),
                                     argnums=(0, 1, 2)))(q, k, v)
  for blocked, plain in zip(grads(causal_query_blocks(64, min_block=16)), grads(1)):
    np.testing.assert_allclose(blocked, plain, atol=2e-5, rtol=2e-5)


def test_query_blocks_divide_t_and_keep_blocks_large():
  assert causal_query_blocks(128) == 4          # blocks of 32 (16 tokens made the dots slower)
  assert causal_query_blocks(4096) == 8         # at most 8 blocks: 9/16 of the T x T logits
  assert causal_query_blocks(96) == 3
  assert causal_query_blocks(100) == 2          # 3 does not divide 100
  assert causal_query_blocks(97) == 1           # prime: one block
  assert causal_query_blocks(10) == 1
  assert causal_query_blocks(64, min_block=16) == 4


def test_causal_attention_rejects_unequal_lengths():
  q, k, v = qkv(8)
  with pytest.raises(ValueError, match="as many keys as queries"):
    causal_attention(jnp.asarray(q), jnp.asarray(k[:, :4]), jnp.asarray(v[:, :4]))


def test_query_blocks_that_do_not_divide_t_are_refused():
  """3 blocks of 10 tokens would cover rows 0..8 only and drop the last query: refused."""
  with pytest.raises(ValueError, match="n_blocks=3 must divide the sequence length 10"):
    causal_blocks(10, 3)
  q, k, v = map(jnp.asarray, qkv(10))
  with pytest.raises(ValueError, match="must divide"):
    causal_attention(q, k, v, n_blocks=4)
  rows = [(r.start, r.stop, keys) for r, keys, _ in causal_blocks(10, 2)]
  assert rows == [(0, 5, 5), (5, 10, 10)]

def test_kv_cache_appends_t_tokens_and_advances_its_index_by_t():
  """Appends of 3 then 2 tokens land in slots 0..2 and 3..4, the index moves 0 -> 3 -> 5, and
  query i of an append at index n sees slots <= n + i (the decode driver only appends one
  token at a time after its prefill, so it cannot tell +T from +1)."""
  k = jnp.arange(2 * 6 * 2, dtype=jnp.float32).reshape(2, 6, 1, 2)        # [B=2, S=6, K=1, hd=2]
  cache = KVCache()
  state = cache.init(jax.random.PRNGKey(0), k, k)["cache"]                  # sized S=6, empty
  seen = []
  for new in (k[:, :3], k[:, 3:5]):
    (k_all, v_all, mask), state = cache.apply({"cache": state}, new, -new, mutable=["cache"])
    state = state["cache"]
    seen.append(mask)
    np.testing.assert_array_equal(v_all, -k_all)
  np.testing.assert_array_equal(state["cache_index"], [5, 5])
  np.testing.assert_array_equal(state["cached_key"][:, :5], k[:, :5])
  np.testing.assert_array_equal(state["cached_key"][:, 5], 0)
  s = np.arange(6)
  np.testing.assert_array_equal(seen[0][0], s[None, :] <= np.arange(3)[:, None])
  np.testing.assert_array_equal(seen[1][1], s[None, :] <= 3 + np.arange(2)[:, None])

def test_head_dim_padding_leaves_attention_unchanged():
  # The cuDNN path pads hd=12 to 16 with zeros and keeps the 1/sqrt(12) scale; run through
  # jax.nn.dot_product_attention's XLA form here, it must equal the unpadded reference.
  q, k, v = qkv(16, hd=12, seed=2)
  out = jax.jit(padded_dot_product_attention, static_argnums=3)(q, k, v, "xla")
  assert out.shape == q.shape
  np.testing.assert_allclose(out, reference_attention(q, k, v), atol=2e-5, rtol=2e-5)


def test_cudnn_is_chosen_only_on_gpu_in_half_precision_for_head_dims_it_takes():
  assert [cudnn_head_dim(h) for h in (40, 44, 56, 76, 128)] == [40, 48, 56, 80, 128]
  assert uses_cudnn_attention(jnp.bfloat16, 76, platform="gpu")       # 400M suite, padded to 80
  assert uses_cudnn_attention(jnp.float16, 128, platform="gpu")
  assert not uses_cudnn_attention(jnp.float32, 64, platform="gpu")    # cuDNN flash: bf16/fp16
  assert not uses_cudnn_attention(jnp.bfloat16, 136, platform="gpu")  # beyond cuDNN's head dim
  assert not uses_cudnn_attention(jnp.bfloat16, 64, platform="cpu")
  assert not uses_cudnn_attention(jnp.bfloat16, 64, platform="tpu")
