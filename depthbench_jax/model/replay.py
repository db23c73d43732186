"""A layer's VJP split into the residuals the forward must save and the inputs the backward
supplies again: how the custom layer stacks (``append_stack``, ``running_stack``,
``buffer_stack``) keep O(L) memory while honouring the remat policy.

``jax.vjp(jax.checkpoint(f, policy))`` returns a ``jax.VJP``, a pytree whose leaves are the
residuals ``policy`` keeps: the inputs (under ``nothing_saveable`` nothing else) plus the kept
intermediates (under ``dots_saveable`` the matmul outputs). A stack saving every leaf per layer
would save each layer's input buffer, L copies of it; it saves only the leaves that are not
inputs (``kept``) and, in the backward, traces the same VJP on inputs it rebuilt (the final
buffer, the layer's params) and swaps the saved leaves in (``rebind``).

Arrays the layer function closes over and every layer reads unchanged (the RoPE table) are
residuals too. A stack passes them as ``Shared`` and adds them to ``supplied``: saved per layer,
they were L copies, and the backward's loop read its layer's copy as a new array each step, so
XLA recomputed everything derived from them there.
"""

from __future__ import annotations

from typing import Any, Callable

import jax


class Shared:
  """Arrays every layer reads unchanged (``tree``, a pytree; ``()`` for none) that the layer
  function closes over. Held by reference, so a ``jax.custom_vjp`` takes it beside that
  function as a non-differentiable argument (its nondiff arguments may hold no tracer)."""

  def __init__(self, tree: Any = ()):
    self.tree = tree


def policy_vjp(fn: Callable, policy: Callable, primals: tuple, supplied: Any
               ) -> tuple[Any, list, Any, list[bool]]:
  """``(out, leaves, treedef, kept)`` of ``fn``'s VJP at ``primals`` under ``policy``.

  supplied: the inputs (a pytree of some of ``primals``' arrays) that the backward passes in
  again. ``kept[i]`` is False where leaf ``i`` *is* one of them (the residual is the input
  itself, matched by identity), True for what the forward must save.
  """
  out, vjp = jax.vjp(jax.checkpoint(fn, policy=policy), *primals)
  leaves, tree = jax.tree.flatten(vjp)
  inputs = {id(a) for a in jax.tree.leaves(supplied)}
  return out, leaves, tree, [id(a) not in inputs for a in leaves]


def saved_leaves(leaves: list, kept: list[bool]) -> list:
  """The leaves the forward saves: those ``policy_vjp`` marked ``kept``."""
  return [a for a, k in zip(leaves, kept) if k]


def rebind(tree: Any, leaves: list, kept: list[bool], saved: list) -> Callable:
  """The VJP function of a backward-side ``policy_vjp`` trace (``tree``, ``leaves``, ``kept``)
  with its kept leaves replaced by the forward's ``saved`` ones (this trace's own values of them
  are dead code that XLA drops)."""
  it = iter(saved)
  return jax.tree.unflatten(tree, [next(it) if k else a for a, k in zip(leaves, kept)])
