"""The layer stack of Full AttnRes with O(L d) activation memory per token in training.

Full AttnRes carries a preallocated source buffer ``V`` [S,B,T,d] (S = 2L+1) through the layer
scan. Reverse-mode through ``nn.scan`` saves every iteration's carry, so training stores L copies
of the buffer: O(L^2 d) per token (at 400M, 70 x 640, T = 2048: 26 GB per sequence in bf16).
PyTorch keeps a list of tensors and saves references, O(L d). This stack gets there in JAX with
one observation: sublayer ``k`` reads the slots ``0..k`` and nothing writes them again, so the
buffer it read equals the *final* buffer with slots ``> k`` masked, and masked slots get zero
weight and zero gradient (``base.depth_softmax``). So:

* forward: the usual scan, saving per sublayer only its aggregated input ``h_k`` [B,T,d];
* backward: one reverse scan over layers carrying the buffer's cotangents ``(dV, d inv_rms)``
  beside the final buffer (saved once): per sublayer, the written slot's cotangent becomes
  ``dy`` (plus the 1/RMS path), ``jax.vjp`` of the branch ``F(N(h_k))`` recomputes it and
  returns the parameter and ``dh`` gradients, and the depth read's VJP (its softmax recomputed
  from the final buffer) adds into ``dV``.

Because slots ``> k`` are known to be empty here (not just masked), every pass over the buffer
(``read_slots``, ``read_slots_vjp``) loops over the written slots ``0..k`` only: half the
memory traffic of a masked read over all ``2L+1`` slots, summed over the stack. The math is
``base.depth_softmax``'s (``tests/model/test_buffer_stack.py`` checks it against that).

The remat policy decides what of the branch is kept, as it would under ``nn.remat``: the
forward runs each branch through ``jax.vjp(jax.checkpoint(branch, policy))`` and saves that
VJP's residuals per sublayer (a ``jax.VJP`` is a pytree of them), and the backward replays it.
Under ``nothing_saveable`` (the paper suites' default) the residuals are the branch's inputs and
the replay recomputes it; under ``dots_saveable`` the matmul outputs are kept too.
``Transformer`` takes this path for designs with ``Design.source_buffer`` whenever it trains
with remat: no gate, no per-layer outputs, no ``intermediates``, no decode.
``tests/model/test_buffer_stack.py`` checks loss and every gradient against the plain scan.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from depthbench_jax.residual.base import _slot_weighted_sum, inverse_rms, write_slot

Array = jax.Array


def _slot_loop(k: Array, body: Callable, init):
  """``body(s, carry)`` for the written slots ``s = 0..k`` (a while loop: ``k`` is traced)."""
  return jax.lax.fori_loop(0, k + 1, body, init)


def _slot(x: Array, s: Array) -> Array:
  return jax.lax.dynamic_index_in_dim(x, s, 0, keepdims=False)


def _softmax_over_written(qv: Array, inv_rms: Array, k: Array) -> Array:
  """``a = softmax_s(inv_rms_s (q . v_s))`` over slots ``0..k``, 0 after: [S,B,T]."""
  written = (jnp.arange(qv.shape[0]) <= k)[:, None, None]
  return jax.nn.softmax(jnp.where(written, qv * inv_rms, -jnp.inf), axis=0)


def _query_dot(q: Array, v: Array) -> Array:
  """``q . v`` [B,T] fp32 for one slot ``v`` [B,T,d] (q in the buffer's dtype, as
  ``base.depth_softmax``; the backward recomputes exactly the forward's logits)."""
  return jnp.einsum("btd,d->bt", v, q.astype(v.dtype), preferred_element_type=jnp.float32)


def read_slots(q: Array, values: Array, inv_rms: Array, k: Array) -> Array:
  """Sublayer ``k``'s depth read ``h = sum_(s<=k) a_s v_s`` [B,T,d] (fp32), two passes."""
  logit = lambda s, qv: qv.at[s].set(_query_dot(q, _slot(values, s)))
  qv = _slot_loop(k, logit, jnp.zeros(values.shape[:-1], jnp.float32))
  return _slot_weighted_sum(_softmax_over_written(qv, inv_rms, k), values, k + 1)


def read_slots_vjp(q, values, inv_rms, k, g_h, g_values, g_inv):
  """Adds the read's cotangents into ``(g_values, g_inv)`` (slots ``0..k``); returns them and
  ``dq``. With ``da_s = v_s . g_h``, ``dz = a (da - sum_s a da)``: ``dv_s = a_s g_h + dz_s
  inv_rms_s q``, ``d inv_rms_s = dz_s (q . v_s)``, ``dq = sum_s dz_s inv_rms_s v_s``."""
  g_h = g_h.astype(jnp.float32)
  q32 = q.astype(jnp.float32)

  def dots(s, carry):
    qv, da = carry
    v = _slot(values, s)
    return (qv.at[s].set(_query_dot(q, v)),
            da.at[s].set(jnp.sum(v.astype(jnp.float32) * g_h, axis=-1)))
  zeros = jnp.zeros(values.shape[:-1], jnp.float32)
  qv, da = _slot_loop(k, dots, (zeros, zeros))
  a = _softmax_over_written(qv, inv_rms, k)
  dz = a * (da - jnp.sum(a * da, axis=0, keepdims=True))
  dz_scaled = dz * inv_rms

  def scatter(s, carry):
    g_values, dq = carry
    w, c = _slot(a, s)[..., None], _slot(dz_scaled, s)[..., None]
    dv = _slot(g_values, s).astype(jnp.float32) + w * g_h + c * q32
    dq = dq + jnp.einsum("bt,btd->d", c[..., 0], _slot(values, s).astype(jnp.float32))
    return g_values.at[s].set(dv.astype(g_values.dtype)), dq
  g_values, dq = _slot_loop(k, scatter, (g_values, jnp.zeros_like(q32)))
  return g_values, g_inv + (dz * qv).astype(g_inv.dtype), dq


def source_buffer_stack(branch: Callable, query: Callable, eps: float, params: Any,
                        values: Array, inv_rms: Array,
                        policy: Callable = jax.checkpoint_policies.nothing_saveable
                        ) -> tuple[Array, Array]:
  """Runs L layers of Full AttnRes over the buffer; returns the final ``(values, inv_rms)``.

  branch(p_l, h, sub) -> y: sublayer ``sub`` of a layer with params ``p_l`` on its aggregated
  input ``h`` [B,T,d] (pre-norm included). query(p_l, sub) -> [d]: its depth query (key gain
  folded in). params: the stacked layer params [L, ...]. values [S,B,T,d] and inv_rms [S,B,T]:
  the initial buffer (slot 0 = embedding). Sublayer ``k = 2l + sub`` reads slots ``0..k`` and
  writes slot ``k + 1``. policy: the ``jax.checkpoint_policies`` entry deciding what of each
  branch the backward reuses rather than recomputes.
  """
  return _stack(branch, query, eps, policy, params, values, inv_rms)


def _branch_vjp(branch, policy, p, h, sub):
  """``(y, (residuals, tree))`` of sublayer ``sub``'s branch VJP, keeping what ``policy``
  saves (a ``jax.VJP`` is a pytree of its residuals)."""
  y, vjp = jax.vjp(jax.checkpoint(lambda p, h: branch(p, h, sub), policy=policy), p, h)
  return y, jax.tree.flatten(vjp)


def _forward(branch, query, eps, policy, params, values, inv_rms, save: bool):
  """The layer scan; with ``save``, per layer also each sublayer's branch VJP residuals."""
  n_layers = jax.tree.leaves(params)[0].shape[0]

  def layer(carry, xs):
    values, inv_rms = carry
    p, l = xs
    saved = []
    for sub in (0, 1):
      k = 2 * l + sub
      h = read_slots(query(p, sub), values, inv_rms, k).astype(values.dtype)
      if save:
        y, (residuals, _) = _branch_vjp(branch, policy, p, h, sub)
        saved.append(residuals)
      else:
        y = branch(p, h, sub)
      values, inv_rms = write_slot(values, inv_rms, k + 1, y, eps)
    return (values, inv_rms), (saved if save else None)

  return jax.lax.scan(layer, (values, inv_rms), (params, jnp.arange(n_layers)))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _stack(branch, query, eps, policy, params, values, inv_rms):
  (values, inv_rms), _ = _forward(branch, query, eps, policy, params, values, inv_rms, False)
  return values, inv_rms


def _stack_fwd(branch, query, eps, policy, params, values, inv_rms):
  (values, inv_rms), saved = _forward(branch, query, eps, policy, params, values, inv_rms, True)
  return (values, inv_rms), (params, values, inv_rms, saved)


def _stack_bwd(branch, query, eps, policy, res, cotangents):
  params, values, inv_rms, saved = res   # final buffer; per layer the branch VJP residuals
  g_values, g_inv = cotangents
  n_layers = jax.tree.leaves(params)[0].shape[0]

  def branch_vjp(p, saved_l, sub):
    # The residuals' structure, from a trace on a placeholder input that XLA then drops.
    placeholder = jnp.zeros(values.shape[1:], values.dtype)
    _, (_, tree) = _branch_vjp(branch, policy, p, placeholder, sub)
    return jax.tree.unflatten(tree, saved_l[sub])

  def layer(carry, xs):
    g_values, g_inv = carry
    p, saved_l, l = xs
    g_p = jax.tree.map(jnp.zeros_like, p)
    for sub in (1, 0):
      k = 2 * l + sub
      slot = k + 1
      # The write: dy from the slot and from its 1/RMS; the slot held zeros before it.
      y = _slot(values, slot)
      _, inv_vjp = jax.vjp(lambda y: inverse_rms(y, eps), y)
      g_y = _slot(g_values, slot) + inv_vjp(_slot(g_inv, slot))[0]
      g_values = jax.lax.dynamic_update_slice_in_dim(
          g_values, jnp.zeros_like(g_values[:1]), slot, 0)
      g_inv = jax.lax.dynamic_update_slice_in_dim(g_inv, jnp.zeros_like(g_inv[:1]), slot, 0)
      # The branch F(N(h)), replayed from its saved residuals.
      g_p_branch, g_h = branch_vjp(p, saved_l, sub)(g_y.astype(y.dtype))
      # The depth read over slots 0..k of the final buffer.
      q, query_vjp = jax.vjp(lambda p: query(p, sub), p)
      g_values, g_inv, g_q = read_slots_vjp(q, values, inv_rms, k, g_h, g_values, g_inv)
      g_p = jax.tree.map(lambda a, b, c: a + b + c, g_p, g_p_branch, query_vjp(g_q)[0])
    return (g_values, g_inv), g_p

  (g_values, g_inv), g_params = jax.lax.scan(
      layer, (g_values, g_inv), (params, saved, jnp.arange(n_layers)), reverse=True)
  return g_params, g_values, g_inv


_stack.defvjp(_stack_fwd, _stack_bwd)
