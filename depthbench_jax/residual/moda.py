"""MoDA, Mixture-of-Depths Attention (Zhu et al., 2026, arXiv 2603.15619; code hustvl/MoDA).

Each attention head attends, under **one softmax** with scale 1/sqrt(hd), to the causal sequence
keys/values of its own layer and to the *depth* keys/values that earlier sublayers produced at
the **same position**:

  o_t = sum_(j<=t) a_tj V_j + sum_(i<2l) a_ti Vd_i[t],
  (a_t.) = softmax([ q_t . K_j / sqrt(hd) ]_(j<=t) ++ [ q_t . Kd_i[t] / sqrt(hd) ]_(i present)),

with GQA groups sharing depth K/V (query head h reads KV head h // (H/K)). The residual stream
itself stays Pre-LN (``x <- x + F(N(x))``); DepthBench runs MoDA on the shared Pre-LN backbone
(the paper reports post-norm helps MoDA more; the project compares residual wirings, so MoDA keeps
the baseline norm layout; recorded here as the spec asks).

What is written to the depth stream (the paper's default variant, Table 3 row 4, matching the
authors' LM code ``bla_gpt_moda_depth_scaling.py``):
* attention sublayer of layer l -> slot 2l: that layer's own K/V projections of its input
  (``k_proj(u)``, ``v_proj(u)``), stored before QK-norm and RoPE as the authors' code does
  (``origin_k``); the reading layer applies its own ``k_norm`` to depth keys when QK-norm is on,
  and no RoPE (the query carries RoPE; depth keys do not). The paper text is silent on both
  (Sec. 4.2.1 only says it "directly reuse[s] the preceding layer's sequence KV as the depth
  KV"), so the code decides.
* MLP sublayer of layer l -> slot 2l+1: a light extra KV projection of the FFN's input ``u``
  (``ffn_depth_k_proj`` / ``ffn_depth_v_proj``, d -> K*hd each; ``ffn_kv=False`` drops it, giving
  the attention-only variant of the DeiT code).
Attention of layer l reads slots ``0..2l-1`` of layers ``< l``. A scanned layer's index is
traced, so it reads all 2L slots with the later ones masked; the unrolled loop's is a Python
int, and there it reads only the first 2l, rounded up to 8 slots (``base.static_prefix``):
the same result for about half the depth reads (benchmarks/README.md, the decode bench's
prefill).

State: ``x`` [B,T,d]; ``k``, ``v`` [B, T, K, 2L, hd] preallocated depth buffers carried by the
scan, written with ``dynamic_update_slice`` at the traced slot; ``presence`` [2L] (1 = written).
Trained through ``model/append_stack.py`` (``Design.append_buffer``): through ``nn.scan`` the
buffers would be saved once per layer, O(L^2) memory.
The slot axis sits after the KV heads so that the depth attention, a batch over (b, t, k) of
[G, hd] x [hd, 2L] products, reads the buffers in place: with the slot axis first XLA copied
both whole buffers into that layout in every layer, forward and backward (interleaved A/B at
8x512 on 2 CPU cores: 1.30 -> 1.26x Pre-LN's step, new/old per-round median 0.93).
A depth entry's softmax weight is multiplied by its presence, so unwritten slots are masked and
a gated-out layer (gate 0) vanishes from later layers' depth keys; ``skip`` blends ``x`` and
``presence`` only (never the buffers). ``hidden(state) = x``.

The depth-augmented attention always runs the XLA einsum path below
(``config.model.attention_kernel='fused'``, cuDNN on GPU, does not apply to it).

Differences of the PyPI reference ``moda-attention==0.1.0`` (all checked in
tests/residual/test_moda_parity.py): it reads its whole zero-initialised cache, so unwritten slots
take part in the softmax as keys 0 / values 0 (the paper attends to preceding layers only); its
attention writes separate ``k_depth_proj`` / ``v_depth_proj`` projections; its FFN projects the
block *output* rather than the FFN input; it uses no RoPE, LayerNorm and a GELU MLP. Its kernel
``moda_attention_naive`` on fully written depth KV equals ``moda_attention`` here.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from depthbench_jax.model.layers import (apply_rope, causal_blocks, dtype_of, grouped_query,
                                         heads_major, join_query_blocks, normal_init,
                                         tokens_major)
from depthbench_jax.model.matmul import projection_dot_general
from depthbench_jax.residual.base import (AppendBuffer, Design, LayerWiring, StateIO,
                                          check_fields, static_prefix)

Array = jax.Array


def _depth_logits(q: Array, depth_k: Array, presence: Array) -> Array:
  """q [B,T,H,hd] against the same position's depth keys [B,T,K,S,hd] -> logits [B,K,G,T,S] in
  fp32, scaled by 1/sqrt(hd) (``grouped_query``), ``log presence`` added, absent slots -inf."""
  dep = jnp.einsum("btkgd,btknd->btkgn", grouped_query(q, depth_k.shape[2]), depth_k,
                   preferred_element_type=jnp.float32)
  present = presence > 0
  log_p = jnp.log(jnp.where(present, presence, 1.0).astype(jnp.float32))
  return jnp.transpose(jnp.where(present, dep + log_p, -jnp.inf), (0, 2, 3, 1, 4))


def _depth_out(p_dep: Array, depth_v: Array, shape) -> Array:
  """Depth probabilities [B,K,G,T,S] times the values [B,T,K,S,hd] -> [B,T,H,hd] (``shape``)."""
  out = jnp.einsum("btkgn,btknd->btkgd", jnp.transpose(p_dep, (0, 3, 1, 2, 4)), depth_v)
  return out.reshape(shape)


def moda_attention(q: Array, k: Array, v: Array, depth_k: Array, depth_v: Array,
                   presence: Array) -> Array:
  """Causal sequence attention and same-position depth attention under one softmax.

  q: [B,T,H,hd]; k, v: [B,T,K,hd] (H a multiple of K, GQA); depth_k, depth_v: [B,T,K,S,hd];
  presence: [S] float in [0,1] (0 = slot absent; weights are ``p_i e^(z_i) / Z``). Scale 1/sqrt(hd)
  on both parts. Returns [B,T,H,hd].

  The sequence part runs heads-major (``heads_major``) over the backbone's ``causal_blocks``
  (query block i against its first keys only, each row's softmax joined with its own depth
  logits), the depth part tokens-major (a batch over (b, t, k) of [G, hd] x [hd, S] products),
  so neither moves the depth buffers; only the small [.., G, S] logits and probabilities change
  layout.
  """
  qg, kt, vt = heads_major(q, k, v)                                 # q scaled, [B,K,G,T,hd]
  dep = _depth_logits(q, depth_k, presence)                         # [B,K,G,T,S]
  out_seq, p_dep = [], []
  for rows, keys, keep in causal_blocks(q.shape[1]):
    seq = jnp.einsum("bkgqd,bksd->bkgqs", qg[..., rows, :], kt[..., :keys, :],
                     preferred_element_type=jnp.float32)
    probs = jax.nn.softmax(
        jnp.concatenate([jnp.where(keep, seq, -jnp.inf), dep[..., rows, :]], axis=-1), axis=-1)
    out_seq.append(jnp.einsum("bkgqs,bksd->bkgqd", probs[..., :keys].astype(v.dtype),
                              vt[..., :keys, :]))
    p_dep.append(probs[..., keys:].astype(v.dtype))
  return (tokens_major(join_query_blocks(out_seq))
          + _depth_out(join_query_blocks(p_dep), depth_v, q.shape))


def moda_attention_cached(q: Array, k_all: Array, v_all: Array, mask: Array, depth_k: Array,
                          depth_v: Array, presence: Array) -> Array:
  """``moda_attention`` for new tokens against a KV cache (the decode path).

  q: [B,T,H,hd] of the T new tokens; k_all, v_all: [B,S,K,hd] the layer's cache with the new
  keys written; mask: [B,T,S] (query i of row b sees slots ``<= index[b] + i``); depth_k,
  depth_v: [B,T,K,2L,hd] the new tokens' own depth buffers. Depth keys are the same position's
  only, so the cache of a MoDA layer is the ordinary one and this is exact.
  """
  qg, kt, vt = heads_major(q, k_all, v_all)
  seq = jnp.einsum("bkgqd,bksd->bkgqs", qg, kt, preferred_element_type=jnp.float32)
  seq = jnp.where(mask[:, None, None], seq, -jnp.inf)
  probs = jax.nn.softmax(
      jnp.concatenate([seq, _depth_logits(q, depth_k, presence)], axis=-1), axis=-1)
  s = k_all.shape[1]
  out_seq = jnp.einsum("bkgqs,bksd->bkgqd", probs[..., :s].astype(v_all.dtype), vt)
  return tokens_major(out_seq) + _depth_out(probs[..., s:].astype(v_all.dtype), depth_v, q.shape)


class MoDA(LayerWiring):
  """Pre-LN residual + MoDA attention over a preallocated depth-KV buffer (module docstring).

  Decoding (``attn.decode``): the sequence K/V go through the layer's ordinary KV cache and the
  new tokens attend to it and to their own depth keys (``moda_attention_cached``), exactly."""

  attend_handles_kv_cache = True

  def setup(self):
    cfg = self.cfg
    self.input_norm = self.norm("input_layernorm")
    self.post_attention_norm = self.norm("post_attention_layernorm")
    if cfg.residual.get("ffn_kv", True):
      dense = lambda name: nn.DenseGeneral(
          (cfg.n_kv_heads, cfg.head_dim), use_bias=False, dtype=dtype_of(cfg.dtype),
          param_dtype=dtype_of(cfg.param_dtype),
          kernel_init=normal_init(cfg.init_std, "embed", "kv_heads", "head_dim"),
          dot_general=projection_dot_general, name=name)
      self.ffn_depth_k = dense("ffn_depth_k_proj")
      self.ffn_depth_v = dense("ffn_depth_v_proj")

  def read(self, state, sub, layer):
    return self.input_norm(state["x"]) if sub == 0 else self.post_attention_norm(state["x"])

  @staticmethod
  def _store(state, slot, k, v):
    put = lambda buf, val: jax.lax.dynamic_update_index_in_dim(
        buf, val.astype(buf.dtype), slot, axis=3)
    return {**state, "k": put(state["k"], k), "v": put(state["v"], v),
            "presence": state["presence"].at[slot].set(1.0)}

  def attend(self, attn, u, rope, state, layer):
    q, k_raw, v = attn.wq(u), attn.wk(u), attn.wv(u)
    depth_k, depth_v, presence = state["k"], state["v"], state["presence"]
    n_read = static_prefix(2 * layer, depth_k.shape[3])  # the 2l slots of layers < l
    if n_read is not None:  # The unrolled loop: read only those (rounded up).
      depth_k, depth_v, presence = (depth_k[:, :, :, :n_read], depth_v[:, :, :, :n_read],
                                    presence[:n_read])
    k = k_raw
    if attn.qk_norm:
      q, k, depth_k = attn.q_norm(q), attn.k_norm(k), attn.k_norm(depth_k)
    q = apply_rope(q, rope)
    k = apply_rope(k, rope)
    depth_k, depth_v = depth_k.astype(q.dtype), depth_v.astype(v.dtype)
    mask = None
    if attn.decode:  # As Attention.attend_cached: mask None on the call that creates the cache.
      k_all, v_all, mask = attn.kv_cache(k, v)
    if mask is None:
      o = moda_attention(q, k, v, depth_k, depth_v, presence)
    else:
      o = moda_attention_cached(q, k_all, v_all, mask, depth_k, depth_v, presence)
    return attn.project_out(o), self._store(state, 2 * layer, k_raw, v)

  def write(self, state, y, sub, layer):
    if sub == 1 and self.cfg.residual.get("ffn_kv", True):
      u = self.post_attention_norm(state["x"])  # the FFN's input (same module, same value)
      state = self._store(state, 2 * layer + 1, self.ffn_depth_k(u), self.ffn_depth_v(u))
    return {**state, "x": state["x"] + y}

  def hidden(self, state):
    return state["x"]

  def skip(self, old, new, gate):
    """Gate 0: ``x`` as if the layer were absent, its depth slots masked (presence 0)."""
    blend = lambda o, n: (gate * n + (1.0 - gate) * o).astype(n.dtype)
    return {**new, "x": blend(old["x"], new["x"]),
            "presence": blend(old["presence"], new["presence"])}


class MoDAIO(StateIO):
  """``init_state``: ``x = x0`` plus empty depth buffers [B,T,K,2L,hd]; readout ``N_f(x)``."""

  def init_state(self, x0):
    cfg = self.cfg
    b, t, _ = x0.shape
    shape = (b, t, cfg.n_kv_heads, 2 * cfg.n_layers, cfg.head_dim)
    return {"x": x0, "k": jnp.zeros(shape, x0.dtype), "v": jnp.zeros(shape, x0.dtype),
            "presence": jnp.zeros((2 * cfg.n_layers,), jnp.float32)}

  def readout(self, state):
    return self.final_norm(state["x"])


def presence_before(cfg, layer: Array) -> Array:
  """``presence`` [2L] before layer ``layer`` of an ungated stack: the slots of earlier layers
  (attention slots only when ``ffn_kv=False``)."""
  slot = jnp.arange(2 * cfg.n_layers)
  written = (slot % 2 == 0) | cfg.residual.get("ffn_kv", True)
  return ((slot < 2 * layer) & written).astype(jnp.float32)


def _check(residual, n_layers):
  check_fields(residual, {
      "ffn_kv": (lambda v: isinstance(v, bool),
                 "True (paper default: FFN KV projection writes depth KV) or False"),
  })


DESIGN = Design(name="moda", layer=MoDA, io=MoDAIO, defaults={"ffn_kv": True}, check=_check,
                backbone_attention=False,
                append_buffer=AppendBuffer(("k", "v"), axis=3, width=2,
                                           presence=presence_before),
                description="Pre-LN + attention over sequence KV and same-position depth KV")
