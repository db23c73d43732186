"""Multi-stream algebra of HC and mHC, with hand-written gradients.

The residual state is ``H`` [n,B,T,d] (n streams) and every map between streams is a per-token
n x n (or n x 1) matrix. Written as einsums these lower to B*T batched tiny dots, and their
autodiff slices ``H[i]`` and pads the cotangents back to [n,B,T,d] once per stream; both cost
3-5x the memory traffic the math needs on XLA:CPU (benchmarks/README.md). Here each map is one
fused elementwise loop forward, and its VJP is written out: stream-axis sums stay unrolled
multiply-adds and the weight gradients are single reductions over d. All arithmetic is fp32
(the residual path stays exact under bf16 compute); outputs take the dtype of ``H``.

  collapse_streams(w, H)          = sum_i w[i] H[i]                         [B,T,d]
  stream_update(M, H, w_out, y)[j] = sum_i M[j, i] H[i] + w_out[j] y         [n,B,T,d]
  sum_streams(H)                  = sum_i H[i]                              [B,T,d]
  copy_streams(x, n)[j]           = x                                       [n,B,T,d]
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

Array = jax.Array
_F32 = jnp.float32


def _weighted_sum(w: Array, h: Array) -> Array:
  """``sum_i w[..., i] h[i]`` in fp32: w [B,T,n], h [n,B,T,d] -> [B,T,d] (``_mix``, one row)."""
  return _mix(w[..., None, :], h)[0]


def _mix(m: Array, h: Array) -> Array:
  """``out[j] = sum_i m[..., j, i] h[i]`` in fp32: m [B,T,q,n], h [n,B,T,d] -> [q,B,T,d].

  A sum over i of broadcast products ``m[:, i] (x) h[i]``, so XLA emits one elementwise loop
  writing [q,B,T,d] once (a stack of q weighted sums is q loops plus a concatenate copy, which
  XLA:CPU repeats for each consumer).
  """
  mt = jnp.moveaxis(m.astype(_F32), (-2, -1), (0, 1))[..., None]                # [q,n,B,T,1]
  out = mt[:, 0] * h[0].astype(_F32)[None]
  for i in range(1, h.shape[0]):
    out = out + mt[:, i] * h[i].astype(_F32)[None]
  return out


def _inner(a: Array, b: Array) -> Array:
  """``out[..., q, p] = sum_d b[q] a[p]``: a [p,B,T,d], b [q,B,T,d] -> [B,T,q,p] (fp32)."""
  # No unit axis in the reduce's output: XLA:CPU runs such a reduce 5-10x slower.
  if b.shape[0] == 1:
    return jnp.moveaxis(jnp.sum(b[0].astype(_F32) * a.astype(_F32), axis=-1), 0, -1)[..., None, :]
  if a.shape[0] == 1:
    return jnp.moveaxis(jnp.sum(b.astype(_F32) * a[0].astype(_F32), axis=-1), 0, -1)[..., None]
  prod = b[:, None].astype(_F32) * a[None].astype(_F32)                        # [q,p,B,T,d]
  return jnp.moveaxis(jnp.sum(prod, axis=-1), (0, 1), (2, 3))


@jax.custom_vjp
def collapse_streams(w: Array, h: Array) -> Array:
  """``sum_i w[i] H[i]``: w [B,T,n], h [n,B,T,d] -> [B,T,d] (h's dtype)."""
  return _weighted_sum(w, h).astype(h.dtype)


def _collapse_fwd(w, h):
  return collapse_streams(w, h), (w, h)


def _collapse_bwd(res, g):
  w, h = res
  g32 = g.astype(_F32)
  # A stack here, not one broadcast product: interleaved at 8x512 HC/Pre-LN 1.14 vs 1.19.
  dh = jnp.stack([w[..., i, None].astype(_F32) * g32 for i in range(h.shape[0])])
  dw = _inner(h, g32[None])[..., 0, :]
  return dw.astype(w.dtype), dh.astype(h.dtype)


collapse_streams.defvjp(_collapse_fwd, _collapse_bwd)


@jax.custom_vjp
def stream_update(m: Array, h: Array, w_out: Array, y: Array) -> Array:
  """``H_new[j] = sum_i M[j, i] H[i] + w_out[j] y``.

  m [B,T,n,n] (row j = new stream j), h [n,B,T,d], w_out [B,T,n], y [B,T,d] -> [n,B,T,d].
  VJP for a cotangent ``G``: ``dH[i] = sum_j M[j, i] G[j]``, ``dy = sum_j w_out[j] G[j]``,
  ``dM[j, i] = <H[i], G[j]>``, ``dw_out[j] = <y, G[j]>`` (inner products over d).
  """
  out = _mix(m, h) + jnp.moveaxis(w_out.astype(_F32), -1, 0)[..., None] * y.astype(_F32)[None]
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
  dw_out = _inner(y[None], g)[..., 0]
  return dm.astype(m.dtype), dh.astype(h.dtype), dw_out.astype(w_out.dtype), dy.astype(y.dtype)


stream_update.defvjp(_update_fwd, _update_bwd)


def sum_streams(h: Array) -> Array:
  """``sum_i H[i]``: [n,B,T,d] -> [B,T,d] (the readout's and ``hidden``'s stream sum).

  ``collapse_streams`` with unit weights; the unused weight gradient is dead code to XLA.
  """
  return collapse_streams(jnp.ones(h.shape[1:3] + h.shape[:1], _F32), h)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def copy_streams(x: Array, n: int) -> Array:
  """n copies of ``x`` [B,T,d] -> [n,B,T,d] (the streams' start); its VJP is ``sum_streams``."""
  return jnp.stack([x] * n)


def _copy_fwd(x, n):
  return copy_streams(x, n), None


def _copy_bwd(n, _, g):
  return (sum_streams(g),)


copy_streams.defvjp(_copy_fwd, _copy_bwd)
