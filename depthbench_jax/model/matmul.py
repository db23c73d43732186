"""The projections' ``dot_general`` (``x W``) with its weight gradient as one 2-D matmul.

  y  = x W              x [..., K] (contracted axes trailing), W [K..., M...] (leading)
  dx = g W^T            contracted over W's free axes
  dW = X^T G            X = x as [N, K], G = g as [N, M] (N = all token axes flattened)

The math is autodiff's; only the shape of the weight-gradient dot differs. Autodiff contracts
the token axes ``(b, t)`` of ``x`` and ``g`` as two axes, which XLA:CPU canonicalises into
transposes of both operands; inside the layer scan those transposes fuse into the elementwise
producers (the SiLU backward, the norm backward), which then write strided and ran at
~0.1 GB/s: 1.1 s of a 5.1 s Pre-LN step at 8x512 (benchmarks/README.md). Flattening the token
axes first makes it a plain ``[K, N] x [N, M]`` GEMM with no copy (a 4-layer SwiGLU stack
under scan + remat, fwd+bwd: 800 -> 500 ms on 2 CPU cores). On GPU it is the same GEMM.
A narrow output (``M <= NARROW``: the connection projections of HC and mHC, M = 6 and 24)
takes ``weight_gradient``'s transposed form.

Flax's ``nn.Dense``/``nn.DenseGeneral`` take it as ``dot_general=projection_dot_general``:
parameter names, shapes and init are unchanged. The output carries the checkpoint name
``PROJECTION`` (remat sees a custom VJP as one opaque call, so the policies that save dots
save this name too: ``model/transformer.py``). Dimension numbers of another form (batch axes,
contracted axes not trailing in ``x`` or not leading in ``W``) fall back to ``lax.dot_general``.
"""

from __future__ import annotations

import functools
import math

import jax
from jax import lax
from jax.ad_checkpoint import checkpoint_name

Array = jax.Array

PROJECTION = "projection"
NARROW = 128


def weight_gradient(x: Array, g: Array, precision=None) -> Array:
  """``dW = X^T G`` [K, M] for X [N..., K], G [N..., M] (the token axes N... contracted).

  The token axes may be several (HC's streams ``[B, T, n]``): contracted as axes, not merged
  by a reshape, so that a batch axis sharded over devices stays sharded (each device's rows
  give a partial ``dW``, summed across devices) where merging an axis in front of a sharded
  ``B`` all-gathered the whole batch (HC's streams were laid out ``[n, B, T]`` then). On one
  device X's token axes merge into rows with no copy and G is transposed to [M, N] (N M
  floats) for XLA:CPU's GEMM library: at n = 4, 8 x 128 tokens, K = 512, M = 6 it ran 0.58 ms
  against 1.05 for the flattened operands (2 CPU cores, interleaved, median of 15), and HC's
  train step at the bench shape was 0.975x the flattened form's (paired median of 11
  interleaved rounds).

  For a narrow output (``M <= NARROW``) it is computed as ``(G^T X)^T``: the same products,
  with the [M, K] result transposed behind an ``optimization_barrier`` (XLA would otherwise fold
  the transpose back into the dot). XLA:CPU sends a [K, M] dot with M a few columns to its own
  loop emitter, which runs it at ~8 GFLOP/s, while the [M, K] form goes to its GEMM library:
  at N = 4096, K = 512 it is 3.4 -> 0.23 ms for M = 6 (HC's projection), 3.8 -> 1.1 ms for M = 24
  (mHC's), 5.4 -> 3.6 ms for M = 128; from M = 256 the two are within a few percent, and for
  wide outputs the barrier's copy of [M, K] makes the transposed form 3-8% slower
  (benchmarks/README.md). On a GPU the extra work is one copy of an [M <= 128, K] matrix (not
  yet timed there).
  """
  tokens = tuple(range(x.ndim - 1))
  contract = ((tokens, tokens), ((), ()))
  if g.shape[-1] > NARROW:
    return lax.dot_general(x, g, contract, precision=precision)
  return lax.optimization_barrier(lax.dot_general(g, x, contract, precision=precision)).T


def projection_dot_general(lhs: Array, rhs: Array, dimension_numbers, precision=None,
                           preferred_element_type=None) -> Array:
  """``lax.dot_general`` (same signature) with the weight gradient ``dW = X^T G`` in 2-D."""
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
  k = len(lhs_contract)
  trailing = tuple(a % lhs.ndim for a in lhs_contract) == tuple(range(lhs.ndim - k, lhs.ndim))
  leading = tuple(a % rhs.ndim for a in rhs_contract) == tuple(range(k))
  if lhs_batch or rhs_batch or not (trailing and leading):
    return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                           preferred_element_type=preferred_element_type)
  return checkpoint_name(_projection(lhs, rhs, k, precision, preferred_element_type), PROJECTION)


def _dot(lhs, rhs, k, precision, preferred_element_type):
  """``lhs``'s last ``k`` axes contracted with ``rhs``'s first ``k``."""
  contract = (tuple(range(lhs.ndim - k, lhs.ndim)), tuple(range(k)))
  return lax.dot_general(lhs, rhs, (contract, ((), ())), precision=precision,
                         preferred_element_type=preferred_element_type)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _projection(lhs, rhs, k, precision, preferred_element_type):
  return _dot(lhs, rhs, k, precision, preferred_element_type)


def _projection_fwd(lhs, rhs, k, precision, preferred_element_type):
  return _projection(lhs, rhs, k, precision, preferred_element_type), (lhs, rhs)


def _projection_bwd(k, precision, _, res, g):
  lhs, rhs = res
  n_out = rhs.ndim - k
  # dx = g W^T: g's trailing output axes against W's free (trailing) axes.
  d_lhs = lax.dot_general(g, rhs.astype(g.dtype),
                          ((tuple(range(g.ndim - n_out, g.ndim)), tuple(range(k, rhs.ndim))),
                           ((), ())), precision=precision)
  # dW = X^T G with the token axes flattened to one.
  size_in, size_out = math.prod(rhs.shape[:k]), math.prod(rhs.shape[k:])
  x2 = lhs.reshape(-1, size_in).astype(g.dtype)
  g2 = g.reshape(-1, size_out)
  d_rhs = weight_gradient(x2, g2, precision)
  return d_lhs.astype(lhs.dtype), d_rhs.reshape(rhs.shape).astype(rhs.dtype)


_projection.defvjp(_projection_fwd, _projection_bwd)
