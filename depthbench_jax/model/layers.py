"""Backbone layers: RMSNorm, RoPE, causal MHA/GQA attention with optional QK-norm, SwiGLU.

Parameters carry logical axis names (``embed``, ``heads``, ``kv_heads``, ``head_dim``, ``mlp``,
``vocab``) that ``train/sharding.py`` maps onto the (data, fsdp, tensor) mesh.
"""

from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from depthbench_jax.model.matmul import projection_dot_general

Array = jax.Array
DType = Any


def dtype_of(name: str) -> DType:
  return {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}[name]


def normal_init(std: float, *axes: str) -> Callable:
  return nn.with_logical_partitioning(nn.initializers.normal(stddev=std), axes)


class RMSNorm(nn.Module):
  """``y = x / sqrt(mean(x^2) + eps) * scale`` over the last axis, computed in fp32.

  ``use_scale=False`` gives the gain-free ``N0`` of the residual spec.
  """

  eps: float = 1e-6
  use_scale: bool = True
  dtype: DType = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    if self.use_scale:
      scale = self.param(
          "scale", nn.with_logical_partitioning(nn.initializers.ones, ("norm",)), (x.shape[-1],),
          jnp.float32)
      y = y * scale
    return y.astype(self.dtype)


def rope_frequencies(head_dim: int, theta: float) -> Array:
  """Inverse frequencies ``theta^(-2i/head_dim)`` for i in [0, head_dim/2)."""
  return 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))


def rope_table(positions: Array, head_dim: int, theta: float) -> tuple[Array, Array]:
  """``(cos, sin)`` [B, T, head_dim/2] fp32 of the angles ``positions * theta^(-2i/head_dim)``.

  Computed once per forward pass and read by every layer, as ``transformers``' LLaMA and Qwen3
  compute ``position_embeddings`` once in the model. Computed inside each layer, the angles
  were recomputed in every backward step of the custom layer stacks (``model/*_stack.py``),
  fused into the rotation once per head: a third of Full AttnRes's attention backward on CPU.
  """
  freqs = positions[..., None].astype(jnp.float32) * rope_frequencies(head_dim, theta)
  return jnp.cos(freqs), jnp.sin(freqs)


def apply_rope(x: Array, rope: tuple[Array, Array]) -> Array:
  """Rotary embedding in the LLaMA/HF "rotate_half" layout.

  x: [B, T, heads, head_dim]; rope: ``rope_table`` [B, T, head_dim/2] of the tokens'
  positions. Pairs (i, i + head_dim/2) rotate by ``positions * theta^(-2i/head_dim)``, which is
  what ``transformers`` LLaMA and Qwen3 do.
  """
  head_dim = x.shape[-1]
  cos, sin = (t[:, :, None, :] for t in rope)
  x32 = x.astype(jnp.float32)
  x1, x2 = x32[..., : head_dim // 2], x32[..., head_dim // 2:]
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return rotated.astype(x.dtype)


def grouped_query(q: Array, n_kv_heads: int) -> Array:
  """q [B,Tq,H,hd] -> ``q / sqrt(hd)`` as [B,Tq,K,H/K,hd], the query heads grouped by the KV
  head they read (GQA), still tokens-major.

  The product is taken in fp32 and rounded once to q's dtype: a bf16 ``1/sqrt(hd)`` is off by
  up to 0.24% (hd = 44, the 56x704 shape), a fixed error in every logit's temperature that
  cuDNN's path (scale passed as a float) does not have."""
  b, tq, h, hd = q.shape
  scaled = (q.astype(jnp.float32) * (hd ** -0.5)).astype(q.dtype)
  return scaled.reshape(b, tq, n_kv_heads, h // n_kv_heads, hd)


def heads_major(q: Array, k: Array, v: Array) -> tuple[Array, Array, Array]:
  """q [B,Tq,H,hd] -> ``q / sqrt(hd)`` as [B,K,H/K,Tq,hd]; k, v [B,S,K,hd] -> [B,K,S,hd].

  The layout of XLA's batched dots: with the heads next to the batch axis, ``q k^T`` and
  ``p v`` are plain batches of [G*Tq, hd] x [hd, S] products. The scale multiplies q (as
  ``flax.linen.dot_product_attention`` does) rather than the [Tq, S] logits. Both together, on
  2 CPU cores: attention alone (8 layers fwd+bwd at 8x128 tokens, 16 heads) 335 -> 212 ms; in
  the 8x512 bench step less of it shows (Pre-LN 0.94x, 0.97x and 0.97x in three interleaved
  A/Bs; MoDA 0.90x); benchmarks/README.md.
  """
  qg = grouped_query(q, k.shape[2])
  return jnp.transpose(qg, (0, 2, 3, 1, 4)), jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)


def tokens_major(out: Array) -> Array:
  """[B,K,G,Tq,hd] -> [B,Tq,K*G,hd], the inverse of ``heads_major``'s query layout."""
  b, kvh, g, tq, hd = out.shape
  return jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(b, tq, kvh * g, hd)


def grouped_attention(q: Array, k: Array, v: Array, keep: Array) -> Array:
  """``softmax(q k^T / sqrt(hd) where keep, else fp32 min) v`` with GQA head groups.

  q: [B, Tq, H, hd]; k, v: [B, S, K, hd] with H a multiple of K (query head h reads KV head
  h // (H/K)); keep: bool, broadcastable to [B, K, H/K, Tq, S]. Logits and softmax in fp32.
  Returns [B, Tq, H, hd].
  """
  return tokens_major(_softmax_attend(*heads_major(q, k, v), keep))


def _softmax_attend(qg: Array, kt: Array, vt: Array, keep: Array) -> Array:
  """Heads-major attention: qg [B,K,G,Tq,hd] (scaled), kt, vt [B,K,S,hd] -> [B,K,G,Tq,hd]."""
  logits = jnp.einsum("bkgqd,bksd->bkgqs", qg, kt, preferred_element_type=jnp.float32)
  logits = jnp.where(keep, logits, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(logits, axis=-1).astype(vt.dtype)
  return jnp.einsum("bkgqs,bksd->bkgqd", probs, vt)


def causal_query_blocks(t: int, min_block: int = 32, max_blocks: int = 8) -> int:
  """How many query blocks causal attention splits T tokens into: the most (up to
  ``max_blocks``) that divide T into blocks of at least ``min_block`` tokens, else 1.

  On 2 CPU cores, 8 layers fwd+bwd under remat, against one block: T=128 in 4 blocks of 32
  0.78-0.86x (8 blocks of 16: 1.07x, the dots too small); T=512 in 8 blocks 0.84x. The whole
  Pre-LN train step at 8x512, batch 8 x 128: 0.983x (11 interleaved rounds, per-round IQR
  0.960-1.007), benchmarks/README.md.
  """
  for n in range(min(max_blocks, t // min_block), 1, -1):
    if t % n == 0:
      return n
  return 1


def causal_fraction(t: int) -> float:
  """Share of the full ``T x T`` logits that blocked causal attention computes: block i of n
  reads i + 1 of the n key blocks, ``(n + 1) / 2n`` in all (1 for one block, -> 1/2)."""
  n = causal_query_blocks(t)
  return (n + 1) / (2 * n)


def causal_blocks(t: int, n_blocks: int | None = None) -> list[tuple[slice, int, Array]]:
  """``(queries, keys, keep)`` per query block: block i is the rows ``[i c, (i + 1) c)``
  (``c = T / n``) and reads only the first ``(i + 1) c`` keys, ``keep`` [c, (i + 1) c] its
  causal mask. The key blocks wholly above the diagonal are never computed, as causal
  flash-attention kernels skip them; each query row's softmax sees the same keys as
  unblocked, so the result is the same up to fp32 rounding. ``n_blocks`` defaults to
  ``causal_query_blocks(T)``."""
  n = causal_query_blocks(t) if n_blocks is None else n_blocks
  if t % n:
    raise ValueError(f"n_blocks={n} must divide the sequence length {t}")
  c = t // n
  return [(slice(i * c, (i + 1) * c), (i + 1) * c,
           jnp.arange((i + 1) * c)[None, :] <= (i * c + jnp.arange(c))[:, None])
          for i in range(n)]


def join_query_blocks(parts: list[Array]) -> Array:
  """The per-block results of ``causal_blocks`` [..., c, x] back in token order [..., T, x]."""
  return jnp.concatenate(parts, axis=-2) if len(parts) > 1 else parts[0]


def causal_attention(q: Array, k: Array, v: Array, n_blocks: int | None = None) -> Array:
  """``grouped_attention`` where query i sees keys j <= i (q, k, v of the same T tokens), run
  over ``causal_blocks``: ``causal_fraction(T)`` of the ``T x T`` logits are computed (and
  saved by remat): 9/16 with 8 blocks (T >= 256 and a multiple of 8)."""
  t = q.shape[1]
  if k.shape[1] != t:
    raise ValueError(f"causal_attention needs as many keys as queries, got {t} and {k.shape[1]}")
  qg, kt, vt = heads_major(q, k, v)
  outs = [_softmax_attend(qg[..., rows, :], kt[..., :keys, :], vt[..., :keys, :], keep)
          for rows, keys, keep in causal_blocks(t, n_blocks)]
  return tokens_major(join_query_blocks(outs))


CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
CUDNN_MAX_HEAD_DIM = 128  # 256 on Hopper; 128 holds on every GPU cuDNN flash attention runs on.


def cudnn_head_dim(head_dim: int) -> int:
  """``head_dim`` rounded up to the multiple of 8 that cuDNN flash attention requires."""
  return -(-head_dim // 8) * 8


def uses_cudnn_attention(dtype: DType, head_dim: int, platform: str | None = None) -> bool:
  """Whether ``attention_kernel='fused'`` runs cuDNN flash attention here: on a GPU, for bf16 or
  fp16 compute and a (padded) head dim cuDNN takes. Everywhere else it runs
  ``causal_attention``: ``jax.nn.dot_product_attention`` without ``implementation='cudnn'``
  is XLA's whole masked T x T, which the blocked form beats in time and memory."""
  platform = platform or jax.default_backend()
  return (platform in ("gpu", "cuda") and jnp.dtype(dtype) in map(jnp.dtype, CUDNN_DTYPES)
          and cudnn_head_dim(head_dim) <= CUDNN_MAX_HEAD_DIM)


def padded_dot_product_attention(q: Array, k: Array, v: Array,
                                 implementation: str | None = "cudnn") -> Array:
  """Causal ``softmax(q k^T / sqrt(hd)) v`` through ``jax.nn.dot_product_attention``, the head
  dim zero-padded to a multiple of 8 (the 400M suite's 16 heads at d=1216 have hd=76).

  Zero columns leave ``q . k`` unchanged and give zero output columns, which are cut off; the
  scale stays ``1/sqrt(hd)`` of the true head dim."""
  hd = q.shape[-1]
  pad = [(0, 0)] * (q.ndim - 1) + [(0, cudnn_head_dim(hd) - hd)]
  out = jax.nn.dot_product_attention(jnp.pad(q, pad), jnp.pad(k, pad), jnp.pad(v, pad),
                                     scale=hd ** -0.5, is_causal=True,
                                     implementation=implementation)
  return out[..., :hd]


def masked_attention(q: Array, k: Array, v: Array, mask: Array) -> Array:
  """``grouped_attention`` with an explicit mask (the KV-cache decode path).

  q: [B, Tq, H, hd]; k, v: [B, S, K, hd]; mask: [B, Tq, S] bool (True = query may see key).
  """
  return grouped_attention(q, k, v, mask[:, None, None])


class KVCache(nn.Module):
  """The ``cache`` collection of one attention layer: K/V [B,S,K,hd] and ``cache_index`` [B].

  ``(k, v)`` [B,T,K,hd] are written at slots ``index[b] .. index[b]+T-1`` and the index advances
  by T. Returns the whole cache and the mask [B,T,S] (query i of row b sees slots
  ``<= index[b] + i``); on the call that creates the cache (sized from its input) returns
  ``(k, v, None)`` and stores nothing.
  """

  @nn.compact
  def __call__(self, k: Array, v: Array) -> tuple[Array, Array, Array | None]:
    initialized = self.has_variable("cache", "cached_key")
    cached_k = self.variable("cache", "cached_key", jnp.zeros, k.shape, k.dtype)
    cached_v = self.variable("cache", "cached_value", jnp.zeros, v.shape, v.dtype)
    index = self.variable("cache", "cache_index", jnp.zeros, (k.shape[0],), jnp.int32)
    if not initialized:
      return k, v, None
    idx = index.value
    write = jax.vmap(lambda c, new, i: jax.lax.dynamic_update_slice(c, new.astype(c.dtype),
                                                                    (i, 0, 0)))
    cached_k.value = write(cached_k.value, k, idx)
    cached_v.value = write(cached_v.value, v, idx)
    index.value = idx + k.shape[1]
    q_pos = idx[:, None] + jnp.arange(k.shape[1])[None, :]                            # [B, T]
    mask = jnp.arange(cached_k.value.shape[1])[None, None, :] <= q_pos[:, :, None]  # [B, T, S]
    return cached_k.value, cached_v.value, mask


class Attention(nn.Module):
  """Causal multi-head attention with RoPE, GQA (``n_kv_heads``) and optional QK-norm (Qwen3).

  Split into ``project_qkv`` / ``project_out`` so designs that change what attention attends to
  (MoDA's depth keys) reuse the same projections.

  ``decode=True`` (inference only, ``model/decode.py``): K/V live in the ``cache`` collection
  (submodule ``kv_cache``: ``cached_key``/``cached_value`` [B, S, K, hd], ``cache_index`` [B] =
  tokens already stored per row). A call with T new tokens writes them at slots
  ``index[b] .. index[b]+T-1``, lets query i see slots ``<= index[b] + i`` and advances the index
  by T; ``rope`` must be the table of positions ``index[b] + arange(T)``. The first call (cache
  creation, e.g. under ``init``) sizes the cache from its input and runs plain causal attention.
  """

  d_model: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  qk_norm: bool = False
  norm_eps: float = 1e-6
  init_std: float = 0.02
  out_init_scale: float = 1.0   # DeepNorm beta rescales the output projection.
  value_init_scale: float = 1.0  # DeepNorm beta also rescales the value projection.
  dtype: DType = jnp.float32
  param_dtype: DType = jnp.float32
  use_fused_kernel: bool = False  # cuDNN flash attention where uses_cudnn_attention.
  decode: bool = False            # KV cache in the 'cache' collection (see the class docstring).

  def setup(self):
    dense = lambda heads, axes, std, name: nn.DenseGeneral(
        (heads, self.head_dim), axis=-1, use_bias=False, dtype=self.dtype,
        param_dtype=self.param_dtype, kernel_init=normal_init(std, "embed", *axes),
        dot_general=projection_dot_general, name=name)
    self.wq = dense(self.n_heads, ("heads", "head_dim"), self.init_std, "q_proj")
    self.wk = dense(self.n_kv_heads, ("kv_heads", "head_dim"), self.init_std, "k_proj")
    self.wv = dense(self.n_kv_heads, ("kv_heads", "head_dim"),
                    self.init_std * self.value_init_scale, "v_proj")
    self.wo = nn.DenseGeneral(
        self.d_model, axis=(-2, -1), use_bias=False, dtype=self.dtype,
        param_dtype=self.param_dtype,
        kernel_init=normal_init(self.init_std * self.out_init_scale, "heads", "head_dim", "embed"),
        dot_general=projection_dot_general, name="o_proj")
    if self.qk_norm:
      self.q_norm = RMSNorm(self.norm_eps, dtype=self.dtype, name="q_norm")
      self.k_norm = RMSNorm(self.norm_eps, dtype=self.dtype, name="k_norm")
    if self.decode:
      self.kv_cache = KVCache(name="kv_cache")

  def project_qkv(self, x: Array, rope: tuple[Array, Array]) -> tuple[Array, Array, Array]:
    """x [B,T,d] -> q [B,T,H,hd], k, v [B,T,K,hd], RoPE (``rope_table``; and QK-norm) applied."""
    q, k, v = self.wq(x), self.wk(x), self.wv(x)
    if self.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    return apply_rope(q, rope), apply_rope(k, rope), v

  def project_out(self, o: Array) -> Array:
    return self.wo(o)

  def attend(self, q: Array, k: Array, v: Array) -> Array:
    if self.use_fused_kernel and uses_cudnn_attention(q.dtype, q.shape[-1]):
      return padded_dot_product_attention(q, k, v, "cudnn")
    return causal_attention(q, k, v)

  def attend_cached(self, q: Array, k: Array, v: Array) -> Array:
    """Appends k, v [B,T,K,hd] to the cache and attends q [B,T,H,hd] to everything stored."""
    k_all, v_all, mask = self.kv_cache(k, v)
    if mask is None:  # The call that created the cache.
      return causal_attention(q, k, v)
    return masked_attention(q, k_all, v_all, mask)

  def __call__(self, x: Array, rope: tuple[Array, Array]) -> Array:
    q, k, v = self.project_qkv(x, rope)
    if self.decode:
      return self.project_out(self.attend_cached(q, k, v))
    return self.project_out(self.attend(q, k, v))


class SwiGLU(nn.Module):
  """``down(silu(gate(x)) * up(x))``, the LLaMA MLP."""

  d_model: int
  ffn_dim: int
  init_std: float = 0.02
  out_init_scale: float = 1.0
  in_init_scale: float = 1.0
  dtype: DType = jnp.float32
  param_dtype: DType = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    dense = lambda features, axes, std, name: nn.Dense(
        features, use_bias=False, dtype=self.dtype, param_dtype=self.param_dtype,
        kernel_init=normal_init(std, *axes), dot_general=projection_dot_general, name=name)
    gate = dense(self.ffn_dim, ("embed", "mlp"), self.init_std * self.in_init_scale, "gate_proj")
    up = dense(self.ffn_dim, ("embed", "mlp"), self.init_std * self.in_init_scale, "up_proj")
    down = dense(self.d_model, ("mlp", "embed"), self.init_std * self.out_init_scale, "down_proj")
    return down(nn.silu(gate(x)) * up(x))
