"""Multi-stream algebra of HC and mHC, with hand-written gradients.

The residual state is ``H`` [B,T,n,d] (n streams, the stream axis next to d, so that each
token's n x d block is contiguous) and every map between streams is a per-token n x n (or n x 1)
matrix. Here each map is one fused elementwise loop forward, and its VJP is written out: the
stream-axis sums stay unrolled multiply-adds and the weight gradients (inner products over d)
are token-batched ``n x d`` by ``d x n`` einsums. All arithmetic is fp32 (the residual path
stays exact under bf16 compute); outputs take the dtype of ``H``.

Layout: with the streams in front (``[n,B,T,d]``, until the twenty-eighth session) every op
read n arrays ``B T d`` apart and the Grams reduced an ``n x n x d`` product per token. Tokens in
front took HC's train step at 8x512 on 2 Zen 5 cores from 1.136-1.157x Pre-LN to 1.090-1.118x
(runs of 11 interleaved rounds; mHC 1.204 -> 1.154), and the Grams as einsums beat a
multiply-and-reduce over d in this layout (HC 1.090 against 1.210): benchmarks/README.md. Not
yet timed on a GPU (there the einsums are token-batched tiny dots). Autodiff of einsum maps
would slice ``H[..., i, :]`` and pad the cotangents back per stream.

  collapse_streams(w, H)          = sum_i w[i] H[i]                         [B,T,d]
  stream_update(M, H, w_out, y)[j] = sum_i M[j, i] H[i] + w_out[j] y         [B,T,n,d]
  sum_streams(H)                  = sum_i H[i]                              [B,T,d]
  copy_streams(x, n)[j]           = x                                       [B,T,n,d]

(``H[i]`` is stream i, ``H[..., i, :]``.)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

Array = jax.Array
_F32 = jnp.float32


def _weighted_sum(w: Array, h: Array) -> Array:
  """``sum_i w[..., i] h[i]`` in fp32: w [B,T,n], h [B,T,n,d] -> [B,T,d].

  ``_mix``'s one-row case, written out: as ``_mix(w[..., None, :], h)[..., 0, :]`` XLA:CPU
  fused HC's step differently (306 more HLO instructions; HC/Pre-LN 1.120-1.148 against
  1.089-1.114 for this loop, two runs each of 11 interleaved rounds, alternating).
  """
  w = w.astype(_F32)
  out = w[..., 0, None] * h[..., 0, :].astype(_F32)
  for i in range(1, h.shape[-2]):
    out = out + w[..., i, None] * h[..., i, :].astype(_F32)
  return out


def _mix(m: Array, h: Array) -> Array:
  """``out[j] = sum_i m[..., j, i] h[i]`` in fp32: m [B,T,q,n], h [B,T,n,d] -> [B,T,q,d].

  A sum over i of broadcast products ``m[:, i] (x) h[i]``, so XLA emits one elementwise loop
  writing [B,T,q,d] once.
  """
  m = m.astype(_F32)[..., None]                                                # [B,T,q,n,1]
  out = m[..., 0, :] * h[..., 0:1, :].astype(_F32)
  for i in range(1, h.shape[-2]):
    out = out + m[..., i, :] * h[..., i:i + 1, :].astype(_F32)
  return out


def _inner(a: Array, b: Array) -> Array:
  """``out[..., q, p] = <b[q], a[p]>`` over d: a [B,T,p,d], b [B,T,q,d] -> [B,T,q,p] (fp32)."""
  return jnp.einsum("btqd,btpd->btqp", b.astype(_F32), a.astype(_F32))


@jax.custom_vjp
def collapse_streams(w: Array, h: Array) -> Array:
  """``sum_i w[i] H[i]``: w [B,T,n], h [B,T,n,d] -> [B,T,d] (h's dtype)."""
  return _weighted_sum(w, h).astype(h.dtype)


def _collapse_fwd(w, h):
  return collapse_streams(w, h), (w, h)


def _collapse_bwd(res, g):
  w, h = res
  g32 = g.astype(_F32)
  dh = w.astype(_F32)[..., None] * g32[..., None, :]
  dw = _inner(h, g32[..., None, :])[..., 0, :]
  return dw.astype(w.dtype), dh.astype(h.dtype)


collapse_streams.defvjp(_collapse_fwd, _collapse_bwd)


@jax.custom_vjp
def stream_update(m: Array, h: Array, w_out: Array, y: Array) -> Array:
  """``H_new[j] = sum_i M[j, i] H[i] + w_out[j] y``.

  m [B,T,n,n] (row j = new stream j), h [B,T,n,d], w_out [B,T,n], y [B,T,d] -> [B,T,n,d].
  VJP for a cotangent ``G``: ``dH[i] = sum_j M[j, i] G[j]``, ``dy = sum_j w_out[j] G[j]``,
  ``dM[j, i] = <H[i], G[j]>``, ``dw_out[j] = <y, G[j]>`` (inner products over d).
  """
  out = _mix(m, h) + w_out.astype(_F32)[..., None] * y.astype(_F32)[..., None, :]
  if h.dtype == out.dtype:
    return out
  # Rounded to the streams' dtype (bf16) and materialised once as such: without the barrier
  # XLA:GPU wrote the fp32 sum and had every consumer read it and round it again (the next
  # sublayer's norm, projection, collapse and update, and the backward's Gram: each an fp32
  # pass over n x d where a bf16 one suffices).
  return jax.lax.optimization_barrier(out.astype(h.dtype))


def _update_fwd(m, h, w_out, y):
  return stream_update(m, h, w_out, y), (m, h, w_out, y)


def _update_bwd(res, g):
  m, h, w_out, y = res
  dh = _mix(jnp.swapaxes(m, -1, -2), g)
  dy = _weighted_sum(w_out, g)
  dm = _inner(h, g)
  dw_out = _inner(y[..., None, :], g)[..., 0]
  return dm.astype(m.dtype), dh.astype(h.dtype), dw_out.astype(w_out.dtype), dy.astype(y.dtype)


stream_update.defvjp(_update_fwd, _update_bwd)


def sum_streams(h: Array) -> Array:
  """``sum_i H[i]``: [B,T,n,d] -> [B,T,d] (the readout's and ``hidden``'s stream sum).

  ``collapse_streams`` with unit weights; the unused weight gradient is dead code to XLA.
  """
  return collapse_streams(jnp.ones(h.shape[:-1], _F32), h)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def copy_streams(x: Array, n: int) -> Array:
  """n copies of ``x`` [B,T,d] -> [B,T,n,d] (the streams' start); its VJP is ``sum_streams``."""
  return jnp.stack([x] * n, axis=-2)


def _copy_fwd(x, n):
  return copy_streams(x, n), None


def _copy_bwd(n, _, g):
  return (sum_streams(g),)


copy_streams.defvjp(_copy_fwd, _copy_bwd)
