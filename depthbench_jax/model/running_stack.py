"""A layer stack over a buffer of finished slots and one running slot, with O(L) activation
memory in training (Block AttnRes).

Block AttnRes carries its block summaries ``values`` [S,B,T,d] and their ``inv_rms`` [S,B,T]
(S = blocks + 1): layer ``l`` adds its sublayers' outputs into the slot of the block it is in,
the running partial sum, and, where a block ends inside the layer, opens the next slot. Through
``nn.scan`` reverse-mode saves every layer's carry, all S slots: L x S slots where Pre-LN saves
L (the 1.6B suite's 56 x 1472 Block AttnRes step held 278 GiB per device of temporaries on 16
devices, XLA:CPU). But a layer's input buffer is known from the final one:

* the slots before ``first_slot(l)``, the slot layer ``l`` first writes, are finished blocks:
  nothing writes them again, so they equal the final buffer's;
* slot ``first_slot(l)`` holds the running partial sum: saved, one slot per layer, as Pre-LN
  saves its stream;
* the slots after it are unwritten: they equal the stack's initial buffer (saved once).

So the forward saves per layer one slot and what the remat policy keeps (``replay``), and the
final and initial buffers once; the backward rebuilds each layer's input exactly (a select, no
masking argument needed), replays the layer's VJP on it and carries the buffer's cotangent down
the layers. Loss and every gradient equal the plain scan's (``tests/model/test_running_stack.py``).

Full AttnRes has its own stack (``buffer_stack``: every slot is written once, reads are
specialised); MoDA's append-only buffer has ``append_stack``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from depthbench_jax.model import replay

Array = jax.Array
# layer(params_l, values [S,B,T,d], inv_rms [S,B,T], l) -> (values, inv_rms) after layer l.
Layer = Callable[[Any, Array, Array, Array], tuple[Array, Array]]


def running_buffer_stack(layer: Layer, first_slot: Callable[[Array], Array], params: Any,
                         values: Array, inv_rms: Array,
                         policy: Callable = jax.checkpoint_policies.nothing_saveable,
                         pin: Callable = lambda tree: tree, shared: Any = ()
                         ) -> tuple[Array, Array]:
  """Runs L layers (``params`` stacked [L, ...]); returns the final ``(values, inv_rms)``.

  first_slot(l): the lowest slot layer ``l`` writes, nondecreasing in ``l``; layer ``l`` must
  write no slot below it, and the slots above it must still hold their initial values when it
  starts. policy: the ``jax.checkpoint_policies`` entry saying what of a layer the forward keeps
  for the backward. pin(tree) -> tree: the batch-rows sharding constraint of the ``[.., B, T,
  ..]`` arrays (``model.transformer.batch_sharded``), applied to both scans' carries.
  shared: the arrays ``layer`` closes over that every layer reads unchanged (the RoPE table):
  not saved per layer (``replay.Shared``).
  """
  return _stack(layer, first_slot, policy, pin, replay.Shared(shared), params, values, inv_rms)


def _slot(x: Array, s: Array) -> Array:
  return jax.lax.dynamic_index_in_dim(x, s, 0, keepdims=False)


def entry_buffer(final: Array, initial: Array, running: Array, first: Array) -> Array:
  """A layer's input buffer: ``final`` below slot ``first``, ``running`` at it, ``initial``
  above it (``final``, ``initial`` [S, ...]; ``running`` [...])."""
  slots = jnp.arange(final.shape[0]).reshape((-1,) + (1,) * (final.ndim - 1))
  return jnp.where(slots < first, final, jnp.where(slots == first, running[None], initial))


def _layer_vjp(layer, policy, shared, p, values, inv_rms, l):
  """``replay.policy_vjp`` of layer ``l``: its params, buffer and shared arrays are not saved."""
  return replay.policy_vjp(lambda p, v, r: layer(p, v, r, l), policy, (p, values, inv_rms),
                           (p, values, inv_rms, shared.tree))


def _forward(layer, first_slot, policy, pin, shared, params, values, inv_rms, save: bool):
  """The layer scan; with ``save``, per layer also the running slot at its entry and its
  VJP's kept residuals."""
  def step(carry, xs):
    values, inv_rms = pin(carry)
    p, l = xs
    if not save:
      return pin(layer(p, values, inv_rms, l)), None
    first = first_slot(l)
    running = pin((_slot(values, first), _slot(inv_rms, first)))
    out, leaves, _, kept = _layer_vjp(layer, policy, shared, p, values, inv_rms, l)
    return pin(out), (running, replay.saved_leaves(leaves, kept))

  n_layers = jax.tree.leaves(params)[0].shape[0]
  return jax.lax.scan(step, pin((values, inv_rms)), (params, jnp.arange(n_layers)))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3, 4))
def _stack(layer, first_slot, policy, pin, shared, params, values, inv_rms):
  return _forward(layer, first_slot, policy, pin, shared, params, values, inv_rms, False)[0]


def _stack_fwd(layer, first_slot, policy, pin, shared, params, values, inv_rms):
  final, saved = _forward(layer, first_slot, policy, pin, shared, params, values, inv_rms, True)
  return final, (params, saved, final, (values, inv_rms))


def _stack_bwd(layer, first_slot, policy, pin, shared, res, cotangents):
  params, saved, final, initial = res

  def step(carry, xs):
    g_values, g_inv = pin(carry)
    p, (running, saved_l), l = xs
    first = first_slot(l)
    values, inv_rms = (entry_buffer(f, i, r, first) for f, i, r in zip(final, initial, running))
    _, leaves, tree, kept = _layer_vjp(layer, policy, shared, p, values, inv_rms, l)
    g_p, g_values, g_inv = replay.rebind(tree, leaves, kept, saved_l)((g_values, g_inv))
    return pin((g_values, g_inv)), g_p

  n_layers = jax.tree.leaves(params)[0].shape[0]
  (g_values, g_inv), g_params = jax.lax.scan(step, pin(cotangents),
                                             (params, saved, jnp.arange(n_layers)), reverse=True)
  return g_params, g_values, g_inv


_stack.defvjp(_stack_fwd, _stack_bwd)
