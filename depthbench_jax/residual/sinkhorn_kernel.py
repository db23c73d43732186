"""mHC's Sinkhorn-Knopp as one Pallas kernel each way, for GPUs (opt-in, not yet timed on one).

``base.sinkhorn_knopp`` runs its rounds over [B,T,n,n] as XLA ops: on an H200 each round is a
few kernels on a 1 MB array, and the forward, the remat recompute and the backward each run
every round (mHC's connection maps took 14.2 ms forward and 34.0 ms backward of a 16x1216 step
against HC's 4.0 and 22.2; benchmarks/README.md). Here one program holds a block of tokens'
matrices as an [n, n, BLOCK] tile (tokens on the lanes) and runs all rounds on it. The VJP is
a second kernel that walks the rounds backwards; for round r it recomputes the round's input
from ``M0`` (r rounds: O(R^2) rounds in all, arithmetic that is free next to the memory
traffic) and applies the round's adjoint. With ``c``/``s`` the column/row sums plus eps:

  y = x / c,   z = y / s                          (one round: columns, then rows; base's order)
  dy = (dz - rowsum(dz o z)) / s,   dx = (dy - colsum(dy o y)) / c

and at the end ``dlogits = dM0 o M0`` (the max shift carries no gradient, as in base). Same
math as ``base.sinkhorn_knopp``: ``tests/residual/test_sinkhorn_kernel.py`` compares values and
gradients, running the kernels in Pallas's interpreter off-GPU (which is also what the model
does there), and lowers both to Triton for a CUDA target without a GPU (what is left untested
is Triton's own compile and the speed). Chosen by mHC's ``residual.sinkhorn_kernel='pallas'``;
Triton's block shapes need n a power of two.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pallas_triton

Array = jax.Array
BLOCK = 128  # tokens per program (the tile's lane axis)


def _round(m: Array, eps: float) -> tuple[Array, Array, Array]:
  """One Sinkhorn round on an [n(i), n(j), tokens] tile: (y = M / colsums, c, s = rowsums of y)."""
  c = jnp.sum(m, axis=0, keepdims=True) + eps
  y = m / c
  return y, c, jnp.sum(y, axis=1, keepdims=True) + eps


def _start(logits: Array) -> Array:
  shift = jnp.max(jnp.max(logits, axis=0, keepdims=True), axis=1, keepdims=True)
  return jnp.exp(logits - shift)


def _rounds(m: Array, count, eps: float) -> Array:
  def one(_, m):
    y, _, s = _round(m, eps)
    return y / s
  return jax.lax.fori_loop(0, count, one, m)


def _forward_kernel(logits_ref, out_ref, *, iterations: int, eps: float):
  out_ref[...] = _rounds(_start(logits_ref[...]), iterations, eps)


def _backward_kernel(logits_ref, g_ref, out_ref, *, iterations: int, eps: float):
  m0 = _start(logits_ref[...])

  def adjoint(k, dz):
    y, c, s = _round(_rounds(m0, iterations - 1 - k, eps), eps)
    dy = (dz - jnp.sum(dz * (y / s), axis=1, keepdims=True)) / s
    return (dy - jnp.sum(dy * y, axis=0, keepdims=True)) / c
  out_ref[...] = jax.lax.fori_loop(0, iterations, adjoint, g_ref[...]) * m0


def _tiles(x: Array) -> tuple[Array, int]:
  """[..., n, n] -> ([n, n, N'] with the tokens padded to a multiple of BLOCK, N)."""
  n = x.shape[-1]
  tokens = math.prod(x.shape[:-2])
  flat = jnp.moveaxis(x.reshape(tokens, n, n).astype(jnp.float32), 0, -1)
  return jnp.pad(flat, ((0, 0), (0, 0), (0, -tokens % BLOCK))), tokens


def _untile(tiles: Array, tokens: int, shape) -> Array:
  return jnp.moveaxis(tiles[..., :tokens], -1, 0).reshape(shape)


def _call(kernel, *arrays: Array) -> Array:
  n, _, width = arrays[0].shape
  spec = pl.BlockSpec((n, n, BLOCK), lambda i: (0, 0, i))
  return pl.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct(arrays[0].shape, jnp.float32),
      grid=(width // BLOCK,), in_specs=[spec] * len(arrays), out_specs=spec,
      compiler_params=pallas_triton.CompilerParams(num_warps=4, num_stages=1),
      interpret=_interpret())(*arrays)


def _interpret() -> bool:
  """Pallas's interpreter off-GPU (tests, CPU runs); Triton on a GPU."""
  return jax.default_backend() != "gpu"


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def sinkhorn_pallas(logits: Array, iterations: int = 20, eps: float = 0.0) -> Array:
  """``base.sinkhorn_knopp(logits, iterations, eps)`` [..., n, n] -> fp32, as one kernel."""
  tiles, tokens = _tiles(logits)
  kernel = functools.partial(_forward_kernel, iterations=iterations, eps=eps)
  return _untile(_call(kernel, tiles), tokens, logits.shape)


def _fwd(logits, iterations, eps):
  return sinkhorn_pallas(logits, iterations, eps), logits


def _bwd(iterations, eps, logits, g):
  tiles, tokens = _tiles(logits)
  g_tiles, _ = _tiles(g)
  kernel = functools.partial(_backward_kernel, iterations=iterations, eps=eps)
  return (_untile(_call(kernel, tiles, g_tiles), tokens, logits.shape).astype(logits.dtype),)


sinkhorn_pallas.defvjp(_fwd, _bwd)
