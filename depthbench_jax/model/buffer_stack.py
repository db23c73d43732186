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
  ``dy`` (plus the 1/RMS and logit paths), ``jax.vjp`` of the branch ``F(N(h_k))`` recomputes
  it and returns the parameter and ``dh`` gradients, and the depth read's VJP (its softmax
  recomputed from the final buffer) adds into ``dV``.

Because slots ``> k`` are known to be empty here (not just masked), every pass over the buffer
(``read_slots``, ``read_slots_vjp``) loops over the written slots ``0..k`` only, 8 per
iteration (``base.slot_chunks``; the last chunk reads up to 7 masked slots): about half the
memory traffic of a masked read over all ``2L+1`` slots, summed over the stack. And because
the pseudo-queries are parameters, not functions of the input, a slot's logits for *every*
sublayer, ``q_k . v_s`` for all k, are one [B*T, d] x [d, 2L] matmul when the slot is written
(``slot_logits``, kept in the carry as [S,B,T,2L]); a read is then one pass over its slots
(the weighted sum) and its VJP one more (``da_s = v_s . g_h`` beside ``dV_s += a_s g_h``),
where recomputing ``q_k . v_s`` per read took a second pass each way and ``dq`` a third
backward. The logits' cotangents reach ``v_s`` and the queries as two small matmuls at the
slot's write. At 8x512 (2 CPU cores): Full AttnRes step 1.186 -> 1.157x Pre-LN. The math is
``base.depth_softmax``'s (``tests/model/test_buffer_stack.py`` checks it against that).

The remat policy decides what of the branch is kept, as it would under ``nn.remat``: the
forward runs each branch through ``jax.vjp(jax.checkpoint(branch, policy))`` and saves that
VJP's residuals per sublayer except the layer's params and the shared arrays (``replay``), and
the backward replays it. Under ``nothing_saveable`` (the paper suites' default) the saved
residual is the branch's input ``h`` and the replay recomputes the branch; under
``dots_saveable`` the matmul outputs are kept too.
``Transformer`` takes this path for designs with ``Design.source_buffer`` whenever it trains
with remat: no gate, no per-layer outputs, no ``intermediates``, no decode.
``tests/model/test_buffer_stack.py`` checks loss and every gradient against the plain scan.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from depthbench_jax.model import replay
from depthbench_jax.residual.base import (SLOT_CHUNK, _slot_weighted_sum, inverse_rms,
                                          slot_chunks, write_slot)

Array = jax.Array


def _slot(x: Array, s: Array) -> Array:
  return jax.lax.dynamic_index_in_dim(x, s, 0, keepdims=False)


def _softmax_over_written(logits: Array, inv_rms: Array, k: Array) -> Array:
  """``a = softmax_s(inv_rms_s (q_k . v_s))`` over slots ``0..k``, 0 after: [S,B,T]."""
  written = (jnp.arange(logits.shape[0]) <= k)[:, None, None]
  return jax.nn.softmax(jnp.where(written, logits * inv_rms, -jnp.inf), axis=0)


def slot_logits(value: Array, queries: Array) -> Array:
  """``q_k . v`` for every sublayer query at once: value [...,d], queries [K,d] -> [...,K] fp32.

  One small matmul when a slot is written, instead of one pass over the slot per later read
  (queries in the buffer's dtype, fp32 accumulation, as ``base.depth_softmax``).
  """
  return jnp.einsum("...d,kd->...k", value, queries.astype(value.dtype),
                    preferred_element_type=jnp.float32)


def read_slots(logits: Array, values: Array, inv_rms: Array, k: Array,
               chunk: int = SLOT_CHUNK) -> Array:
  """Sublayer ``k``'s depth read ``h = sum_(s<=k) a_s v_s`` [B,T,d] (fp32): one pass over the
  written slots, ``chunk`` at a time. logits [S,B,T]: ``q_k . v_s`` (``slot_logits``, stored at
  each write)."""
  return _slot_weighted_sum(_softmax_over_written(logits, inv_rms, k), values, k + 1, chunk)


def read_slots_vjp(logits, values, inv_rms, k, g_h, g_values, chunk: int = SLOT_CHUNK):
  """The read's VJP for the cotangent ``g_h`` of ``h``, in one pass over slots ``0..k``.

  With ``da_s = v_s . g_h``: adds ``a_s g_h`` into ``g_values`` (the path through the weighted
  sum) and returns it with ``dz = a (da - sum_s a da)`` [S,B,T], the cotangent of the softmax's
  input ``z_s = inv_rms_s logits_s``. The caller routes ``dz`` on: ``d logits_s = dz_s
  inv_rms_s`` (to ``v_s`` and ``q_k`` through ``slot_logits``) and ``d inv_rms_s = dz_s
  logits_s``. The slots are visited ``chunk`` at a time (``base.slot_chunks``).
  """
  g_h = g_h.astype(jnp.float32)
  a = _softmax_over_written(logits, inv_rms, k)

  def add_chunk(start, live, carry):
    g_values, da = carry
    c = live.shape[0]
    window = lambda x: jax.lax.dynamic_slice_in_dim(x, start, c, 0)
    w = jnp.where(live[:, None, None], window(a), 0.0)
    dv = window(g_values).astype(jnp.float32) + w[..., None] * g_h[None]
    # One reduce per slot: over the chunk's window, XLA:CPU copied the window out before its
    # reduce (the depth read's VJP alone, 16 reads at [17, 8, 128, 512]: 62-84 -> 40-49 ms).
    da_c = jnp.stack([jnp.sum(_slot(values, start + j).astype(jnp.float32) * g_h, axis=-1)
                      for j in range(c)])
    da_c = jnp.where(live[:, None, None], da_c, window(da))
    return (jax.lax.dynamic_update_slice_in_dim(g_values, dv.astype(g_values.dtype), start, 0),
            jax.lax.dynamic_update_slice_in_dim(da, da_c, start, 0))
  g_values, da = slot_chunks(k + 1, values.shape[0], chunk, add_chunk,
                             (g_values, jnp.zeros(values.shape[:-1], jnp.float32)))
  return g_values, a * (da - jnp.sum(a * da, axis=0, keepdims=True))


def source_buffer_stack(branch: Callable, query: Callable, eps: float, params: Any,
                        values: Array, inv_rms: Array,
                        policy: Callable = jax.checkpoint_policies.nothing_saveable,
                        pin: Callable = lambda tree: tree, shared: Any = ()
                        ) -> tuple[Array, Array]:
  """Runs L layers of Full AttnRes over the buffer; returns the final ``(values, inv_rms)``.

  branch(p_l, h, sub) -> y: sublayer ``sub`` of a layer with params ``p_l`` on its aggregated
  input ``h`` [B,T,d] (pre-norm included). query(p_l, sub) -> [d]: its depth query (key gain
  folded in). params: the stacked layer params [L, ...]. values [S,B,T,d] and inv_rms [S,B,T]:
  the initial buffer (slot 0 = embedding, the other slots unwritten). Sublayer ``k = 2l + sub``
  reads slots ``0..k`` and writes slot ``k + 1``. policy: the ``jax.checkpoint_policies`` entry
  deciding what of each branch the backward reuses rather than recomputes. pin(tree) -> tree:
  the sharding constraint of the ``[.., B, T, ..]`` arrays (``model.transformer.batch_sharded``),
  applied to the scans' carries, each read ``h`` and write ``y`` and their cotangents: without
  it XLA sharded the buffer on the weights' fsdp-sharded ``embed`` axis and every device ran
  the branches on the whole batch. shared: the arrays ``branch`` closes over that every layer
  reads unchanged (the RoPE table), not saved per layer (``replay.Shared``).
  """
  return _stack(branch, query, eps, policy, pin, replay.Shared(shared), params, values, inv_rms)


def _all_queries(query: Callable, params: Any) -> Array:
  """[2L, d]: row ``k = 2l + sub`` is sublayer k's depth query, from the stacked params."""
  per_layer = jax.vmap(lambda p: jnp.stack([query(p, 0), query(p, 1)]))(params)   # [L, 2, d]
  return per_layer.reshape(-1, per_layer.shape[-1])


def _branch_vjp(branch, policy, shared, p, h, sub):
  """``replay.policy_vjp`` of sublayer ``sub``'s branch: its params and the shared arrays are
  not saved (the backward passes its own); ``h`` and what ``policy`` keeps are."""
  return replay.policy_vjp(lambda p, h: branch(p, h, sub), policy, (p, h), (p, shared.tree))


def _forward(branch, eps, policy, pin, shared, queries, params, values, inv_rms, save: bool):
  """The layer scan; with ``save``, per layer also each sublayer's branch VJP residuals.

  The carry holds, beside the buffer, every written slot's ``slot_logits`` [S,B,T,2L].
  """
  n_layers = jax.tree.leaves(params)[0].shape[0]
  logits = jnp.zeros(values.shape[:-1] + queries.shape[:1], jnp.float32)
  logits = logits.at[0].set(slot_logits(values[0], queries))

  def layer(carry, xs):
    values, inv_rms, logits = pin(carry)
    p, l = xs
    saved = []
    for sub in (0, 1):
      k = 2 * l + sub
      logits_k = jax.lax.dynamic_index_in_dim(logits, k, axis=3, keepdims=False)
      h = pin(read_slots(logits_k, values, inv_rms, k).astype(values.dtype))
      if save:
        y, leaves, _, kept = _branch_vjp(branch, policy, shared, p, h, sub)
        saved.append(replay.saved_leaves(leaves, kept))
      else:
        y = branch(p, h, sub)
      values, inv_rms = write_slot(values, inv_rms, k + 1, pin(y), eps)
      logits = jax.lax.dynamic_update_index_in_dim(
          logits, slot_logits(_slot(values, k + 1), queries), k + 1, 0)
    return pin((values, inv_rms, logits)), (saved if save else None)

  return jax.lax.scan(layer, pin((values, inv_rms, logits)), (params, jnp.arange(n_layers)))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3, 4, 5))
def _stack(branch, query, eps, policy, pin, shared, params, values, inv_rms):
  queries = _all_queries(query, params)
  (values, inv_rms, _), _ = _forward(branch, eps, policy, pin, shared, queries, params, values,
                                     inv_rms, False)
  return values, inv_rms


def _stack_fwd(branch, query, eps, policy, pin, shared, params, values, inv_rms):
  queries = _all_queries(query, params)
  (values, inv_rms, logits), saved = _forward(branch, eps, policy, pin, shared, queries, params,
                                              values, inv_rms, True)
  return (values, inv_rms), (params, queries, values, inv_rms, logits, saved)


def _logits_vjp(g_logits: Array, value: Array, queries: Array) -> tuple[Array, Array]:
  """``slot_logits``' VJP for one slot: (dv [B,T,d] = g Q, dQ [K,d] = g^T v), fp32 matmuls
  over the flattened tokens."""
  g = g_logits.reshape(-1, g_logits.shape[-1])
  v = value.reshape(-1, value.shape[-1]).astype(jnp.float32)
  dv = (g @ queries.astype(jnp.float32)).reshape(value.shape)
  return dv, jax.lax.dot_general(g, v, (((0,), (0,)), ((), ())))


def _stack_bwd(branch, query, eps, policy, pin, shared, res, cotangents):
  params, queries, values, inv_rms, logits, saved = res   # final buffer; per layer the residuals
  g_values, g_inv = pin(cotangents)
  n_layers = jax.tree.leaves(params)[0].shape[0]

  def branch_vjp(p, saved_l, sub):
    # The VJP's structure, its params and shared leaves bound to this layer's; the rest from the
    # forward (this trace's values of them, on a placeholder input, are dead code). With the
    # dtype of the branch's output: the compute dtype, which an fp32 buffer
    # (``model.stream_dtype='float32'``) does not share.
    placeholder = jnp.zeros(values.shape[1:], values.dtype)
    y, leaves, tree, kept = _branch_vjp(branch, policy, shared, p, placeholder, sub)
    return replay.rebind(tree, leaves, kept, saved_l[sub]), y.dtype

  def layer(carry, xs):
    g_values, g_inv, g_logits, g_queries = carry
    g_values, g_inv, g_logits = pin((g_values, g_inv, g_logits))
    p, saved_l, l = xs
    g_p = jax.tree.map(jnp.zeros_like, p)
    for sub in (1, 0):
      k = 2 * l + sub
      slot = k + 1
      # The write: every later read's cotangent has reached the slot, through its value, its
      # 1/RMS and its logits; the slot held zeros before it.
      y = _slot(values, slot)
      _, inv_vjp = jax.vjp(lambda y: inverse_rms(y, eps), y)
      g_y_logits, g_q = _logits_vjp(_slot(g_logits, slot), y, queries)
      g_y = pin(_slot(g_values, slot) + inv_vjp(_slot(g_inv, slot))[0] + g_y_logits)
      g_queries = g_queries + g_q
      g_values = jax.lax.dynamic_update_index_in_dim(
          g_values, jnp.zeros_like(g_values[0]), slot, 0)
      g_inv = jax.lax.dynamic_update_index_in_dim(g_inv, jnp.zeros_like(g_inv[0]), slot, 0)
      # The branch F(N(h)), replayed from its saved residuals.
      vjp, y_dtype = branch_vjp(p, saved_l, sub)
      g_p_branch, g_h = vjp(g_y.astype(y_dtype))
      g_h = pin(g_h)
      # The depth read over slots 0..k of the final buffer.
      logits_k = jax.lax.dynamic_index_in_dim(logits, k, axis=3, keepdims=False)
      g_values, dz = read_slots_vjp(logits_k, values, inv_rms, k, g_h, g_values)
      g_inv = g_inv + (dz * logits_k).astype(g_inv.dtype)
      g_logits = jax.lax.dynamic_update_index_in_dim(g_logits, dz * inv_rms, k, axis=3)
      g_p = jax.tree.map(lambda a, b: a + b, g_p, g_p_branch)
    return (*pin((g_values, g_inv, g_logits)), g_queries), g_p

  carry = (*pin((g_values, g_inv, jnp.zeros_like(logits))),
           jnp.zeros(queries.shape, jnp.float32))
  (g_values, g_inv, g_logits, g_queries), g_params = jax.lax.scan(
      layer, carry, (params, saved, jnp.arange(n_layers)), reverse=True)
  # Slot 0 (the embedding) is read by every sublayer and written by none.
  g_v0, g_q = _logits_vjp(g_logits[0], values[0], queries)
  g_values = g_values.at[0].add(g_v0.astype(g_values.dtype))
  _, queries_vjp = jax.vjp(lambda p: _all_queries(query, p), params)
  g_queries = (g_queries + g_q).astype(queries.dtype)
  g_params = jax.tree.map(jnp.add, g_params, queries_vjp(g_queries)[0])
  return g_params, g_values, g_inv


_stack.defvjp(_stack_fwd, _stack_bwd)
