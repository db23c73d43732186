"""A layer stack over an append-only buffer with O(L) activation memory in training (MoDA).

A design whose state carries a preallocated buffer that layer ``l`` appends to (MoDA's depth
K/V: slots ``2l, 2l+1`` of [B,T,K,2L,hd]) and whose reads see only the slots written before
(masked by ``presence``) trains through ``nn.scan`` with O(L^2) memory: reverse-mode saves
every iteration's carry, so L copies of an O(L) buffer (at 400M, 16 x 1216, batch 8 x 2048:
a 92 GiB step on an H200). The observation that ``buffer_stack.py`` makes for Full AttnRes
holds here too: the buffer layer ``l`` read equals the *final* buffer with the slots from
``l``'s own on masked, and masked slots get zero weight and zero gradient. So:

* forward: the usual scan, saving per layer its input ``x_l`` [B,T,d] and what the remat
  policy keeps (below), and, once, the final buffer;
* backward: one reverse scan carrying ``(dx, dbuffer)``: layer ``l``'s VJP is replayed on
  ``(x_l, final buffer)`` with the cotangent of its writes read off
  ``dbuffer`` at its slots (every later read has added into them by then); its VJP gives the
  parameter gradient, ``dx_l``, and the read's cotangent, which lands on earlier slots only.

Layer ``l`` reads slots ``< width * l`` only, so the layers run in ``SEGMENTS`` scans, a segment
``[a, b)`` carrying only the first ``width * b`` slots (its reads, its VJP's full-size buffer
cotangent and their adds then cover 5/8 of the slots on average over 4 segments, not all; the
masked rest of a prefix still takes part).

The remat policy decides what of a layer is kept, as under ``nn.remat``: the forward runs each
layer through ``jax.vjp(jax.checkpoint(layer, policy))`` and saves that VJP's residuals (a
``jax.VJP`` is a pytree of them) except those that *are* the layer's inputs ``params_l`` and
the buffers: a residual that is the buffer would keep L copies of it. The backward puts the
layer's parameters and the final buffer in their place (equal wherever the layer reads) and
replays the VJP. Under ``nothing_saveable`` (the suites' default) the residuals are the inputs
and the layer is recomputed; under ``dots_saveable`` the matmul outputs are kept, so the
backward does not run the layer's matmuls again (interleaved at 8x512 on 2 CPU cores, MoDA's
step over Pre-LN's: see benchmarks/README.md). ``tests/model/test_append_stack.py`` checks loss
and every gradient against the plain scan, and the memory's growth with depth.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from depthbench_jax.model import replay

Array = jax.Array
# Layer segments, each carrying only the buffer prefix its layers reach (``segments``).
SEGMENTS = 4
# layer(params_l, x [B,T,d], buffers {name: array}, l) -> (x_next, writes {name: the slots
# [width*l, width*(l+1)) along the slot axis}); reads of ``buffers`` see slots < width*l only.
Layer = Callable[[Any, Array, dict, Array], tuple[Array, dict]]


def append_buffer_stack(layer: Layer, axis: int, width: int, params: Any, x: Array,
                        buffers: dict,
                        policy: Callable = jax.checkpoint_policies.nothing_saveable,
                        shared: Any = ()) -> tuple[Array, dict]:
  """Runs L layers (``params`` stacked [L, ...]); returns the final ``(x, buffers)``.

  axis: the buffers' slot axis; width: slots each layer writes, at ``width * l``; policy: the
  ``jax.checkpoint_policies`` entry saying what of a layer the forward keeps for the backward;
  shared: the arrays ``layer`` closes over that every layer reads unchanged (the RoPE table),
  not saved per layer (``replay.Shared``).
  """
  return _stack(layer, axis, width, policy, replay.Shared(shared), params, x, buffers)


def segments(n_layers: int, n_segments: int | None = None) -> list[tuple[int, int]]:
  """``n_segments`` (default ``SEGMENTS``) contiguous layer ranges ``[a, b)`` of near-equal
  length covering ``0..n_layers-1`` (fewer when there are fewer layers)."""
  k = max(1, min(SEGMENTS if n_segments is None else n_segments, n_layers))
  bounds = [round(i * n_layers / k) for i in range(k + 1)]
  return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def _prefix(buffers: dict, n_slots: int, axis: int) -> dict:
  return {n: jax.lax.slice_in_dim(b, 0, n_slots, axis=axis) for n, b in buffers.items()}


def _put_prefix(buffers: dict, prefix: dict, axis: int) -> dict:
  return {n: jax.lax.dynamic_update_slice_in_dim(buffers[n], prefix[n], 0, axis)
          for n in buffers}


def _layer_params(params: Any, l: Array) -> Any:
  return jax.tree.map(lambda t: jax.lax.dynamic_index_in_dim(t, l, keepdims=False), params)


def _write(buffers: dict, writes: dict, start: Array, axis: int) -> dict:
  return {n: jax.lax.dynamic_update_slice_in_dim(buffers[n], writes[n].astype(buffers[n].dtype),
                                                 start, axis) for n in buffers}


def _layer_vjp(layer, policy, shared, p, x, buffers, l):
  """``replay.policy_vjp`` of layer ``l``: the inputs ``p`` and ``buffers`` and the shared
  arrays are not saved (the backward passes its own); ``x`` and the kept matmul outputs are."""
  return replay.policy_vjp(lambda p, x, b: layer(p, x, b, l), policy, (p, x, buffers),
                           (p, buffers, shared.tree))


def _forward(layer, axis, width, policy, shared, params, x, buffers, save: bool):
  """The layers segment by segment; a segment ``[a, b)`` carries only the first ``width * b``
  slots, all that its layers read or write. Returns ``((x, buffers), per-segment saved
  residuals)`` (``_layer_vjp``'s kept leaves, per layer)."""
  def step(carry, l):
    x, buffers = carry
    if save:
      (x_next, writes), leaves, _, kept = _layer_vjp(layer, policy, shared,
                                                      _layer_params(params, l), x, buffers, l)
      saved = replay.saved_leaves(leaves, kept)
    else:
      x_next, writes = layer(_layer_params(params, l), x, buffers, l)
      saved = None
    return (x_next, _write(buffers, writes, width * l, axis)), saved

  saved = []
  for a, b in segments(jax.tree.leaves(params)[0].shape[0]):
    (x, prefix), seg_saved = jax.lax.scan(step, (x, _prefix(buffers, width * b, axis)),
                                          jnp.arange(a, b))
    buffers = _put_prefix(buffers, prefix, axis)
    saved.append(seg_saved)
  return (x, buffers), tuple(saved)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3, 4))
def _stack(layer, axis, width, policy, shared, params, x, buffers):
  return _forward(layer, axis, width, policy, shared, params, x, buffers, False)[0]


def _stack_fwd(layer, axis, width, policy, shared, params, x, buffers):
  (x, buffers), saved = _forward(layer, axis, width, policy, shared, params, x, buffers, True)
  return (x, buffers), (params, saved, buffers)


def _stack_bwd(layer, axis, width, policy, shared, res, cotangents):
  params, saved, buffers = res  # per segment its layers' saved residuals; the final buffer, once
  g_x, g_buffers = cotangents

  def step(carry, xs):
    g_x, g_buffers, read = carry
    saved_l, l = xs
    p_l = _layer_params(params, l)
    # The VJP's structure, its input leaves bound to p_l and the final buffer; the rest of the
    # leaves from the forward (this trace's own values of them are dead code).
    x_like = jax.tree.map(jnp.zeros_like, g_x)
    _, leaves, tree, kept = _layer_vjp(layer, policy, shared, p_l, x_like, read, l)
    vjp = replay.rebind(tree, leaves, kept, saved_l)
    start = width * l
    g_writes = {n: jax.lax.dynamic_slice_in_dim(g, start, width, axis)
                for n, g in g_buffers.items()}
    # The written slots' cotangents are consumed here: the slots held nothing before.
    g_buffers = {n: jax.lax.dynamic_update_slice_in_dim(g, jnp.zeros_like(g_writes[n]), start,
                                                        axis) for n, g in g_buffers.items()}
    g_p, g_x, g_read = vjp((g_x, g_writes))
    return (g_x, jax.tree.map(jnp.add, g_buffers, g_read), read), g_p

  g_params = []
  n_layers = jax.tree.leaves(params)[0].shape[0]
  for (a, b), seg_saved in reversed(list(zip(segments(n_layers), saved))):
    n_slots = width * b
    (g_x, g_prefix, _), g_p = jax.lax.scan(
        step, (g_x, _prefix(g_buffers, n_slots, axis), _prefix(buffers, n_slots, axis)),
        (seg_saved, jnp.arange(a, b)), reverse=True)
    g_buffers = _put_prefix(g_buffers, g_prefix, axis)
    g_params.insert(0, g_p)
  g_params = jax.tree.map(lambda *parts: jnp.concatenate(parts), *g_params)
  return g_params, g_x, g_buffers


_stack.defvjp(_stack_fwd, _stack_bwd)
