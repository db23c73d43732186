"""A layer stack over an append-only buffer with O(L) activation memory in training (MoDA).

A design whose state carries a preallocated buffer that layer ``l`` appends to (MoDA's depth
K/V: slots ``2l, 2l+1`` of [B,T,K,2L,hd]) and whose reads see only the slots written before
(masked by ``presence``) trains through ``nn.scan`` with O(L^2) memory: reverse-mode saves
every iteration's carry, so L copies of an O(L) buffer (at 400M, 16 x 1216, batch 8 x 2048:
a 92 GiB step on an H200). The observation that ``buffer_stack.py`` makes for Full AttnRes
holds here too: the buffer layer ``l`` read equals the *final* buffer with the slots from
``l``'s own on masked, and masked slots get zero weight and zero gradient. So:

* forward: the usual scan, saving per layer only its input ``x_l`` [B,T,d] (and, once, the
  final buffer);
* backward: one reverse scan carrying ``(dx, dbuffer)``: layer ``l`` is recomputed on
  ``(x_l, final buffer)`` under ``jax.vjp`` with the cotangent of its writes read off
  ``dbuffer`` at its slots (every later read has added into them by then); its VJP gives the
  parameter gradient, ``dx_l``, and the read's cotangent, which lands on earlier slots only.

Each layer is recomputed once in the backward whatever the remat policy (the forward cannot
keep residuals that hold the buffer without keeping L of them), which is what the suites'
``nothing_saveable`` does anyway. ``tests/model/test_append_stack.py`` checks loss and every
gradient against the plain scan, and the memory's growth with depth.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

Array = jax.Array
# layer(params_l, x [B,T,d], buffers {name: array}, l) -> (x_next, writes {name: the slots
# [width*l, width*(l+1)) along the slot axis}); reads of ``buffers`` see slots < width*l only.
Layer = Callable[[Any, Array, dict, Array], tuple[Array, dict]]


def append_buffer_stack(layer: Layer, axis: int, width: int, params: Any, x: Array,
                        buffers: dict) -> tuple[Array, dict]:
  """Runs L layers (``params`` stacked [L, ...]); returns the final ``(x, buffers)``.

  axis: the buffers' slot axis; width: slots each layer writes, at ``width * l``.
  """
  return _stack(layer, axis, width, params, x, buffers)


def _write(buffers: dict, writes: dict, start: Array, axis: int) -> dict:
  return {n: jax.lax.dynamic_update_slice_in_dim(buffers[n], writes[n].astype(buffers[n].dtype),
                                                 start, axis) for n in buffers}


def _forward(layer, axis, width, params, x, buffers, save: bool):
  def step(carry, xs):
    x, buffers = carry
    p, l = xs
    x_next, writes = layer(p, x, buffers, l)
    return (x_next, _write(buffers, writes, width * l, axis)), (x if save else None)

  n_layers = jax.tree.leaves(params)[0].shape[0]
  return jax.lax.scan(step, (x, buffers), (params, jnp.arange(n_layers)))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _stack(layer, axis, width, params, x, buffers):
  return _forward(layer, axis, width, params, x, buffers, False)[0]


def _stack_fwd(layer, axis, width, params, x, buffers):
  (x, buffers), inputs = _forward(layer, axis, width, params, x, buffers, True)
  return (x, buffers), (params, inputs, buffers)


def _stack_bwd(layer, axis, width, res, cotangents):
  params, inputs, buffers = res            # per layer its input x_l; the final buffer, once
  g_x, g_buffers = cotangents

  def step(carry, xs):
    g_x, g_buffers = carry
    p, x_l, l = xs
    start = width * l
    g_writes = {n: jax.lax.dynamic_slice_in_dim(g, start, width, axis)
                for n, g in g_buffers.items()}
    # The written slots' cotangents are consumed here: the slots held nothing before.
    g_buffers = {n: jax.lax.dynamic_update_slice_in_dim(g, jnp.zeros_like(g_writes[n]), start,
                                                        axis) for n, g in g_buffers.items()}
    _, vjp = jax.vjp(lambda p, x, b: layer(p, x, b, l), p, x_l, buffers)
    g_p, g_x, g_read = vjp((g_x, g_writes))
    return (g_x, jax.tree.map(jnp.add, g_buffers, g_read)), g_p

  n_layers = jax.tree.leaves(params)[0].shape[0]
  (g_x, g_buffers), g_params = jax.lax.scan(
      step, (g_x, g_buffers), (params, inputs, jnp.arange(n_layers)), reverse=True)
  return g_params, g_x, g_buffers


_stack.defvjp(_stack_fwd, _stack_bwd)
