"""Greedy decoding with a per-layer attention KV cache (and a full-recompute fallback).

Every residual design's ``read``/``write``/``skip``/``init_state``/``readout`` is position-wise,
so the only thing that couples positions is attention. Caching each layer's K/V
(``Attention(decode=True)``, the ``cache`` collection, stacked on the layer axis by the scan) is
therefore exact for every design that uses the default ``LayerWiring.attend``: running the model
on the new tokens only, with their absolute ``positions``, gives the same logits as recomputing
the whole sequence.

MoDA overrides ``attend`` and handles the cache itself (``attend_handles_kv_cache``): its depth
keys are per-layer projections of earlier sublayers at the *same* position, which the new
tokens' own forward pass rebuilds, so its cache is the ordinary per-layer K/V and
``moda_attention_cached`` joins it with the depth keys under one softmax. A design whose
``attend`` override does not declare that falls back to full recompute: each step runs the model
on a fixed-size ``[B, S]`` buffer (one compile) and reads the logits at the last filled
position. Correct for every design, O(S) times slower per token.

Batches: prompts are right-padded to a power of two (at least ``pad_to``). Prefill writes every
padded slot; afterwards each row's ``cache_index`` is set to its true length, so the next token
overwrites the first padded slot and the causal mask never lets a query see a slot beyond its own
position.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from depthbench_jax.model.config import ModelConfig
from depthbench_jax.model.transformer import Transformer
from depthbench_jax.residual import registry
from depthbench_jax.residual.base import LayerWiring

Array = jax.Array


def supports_kv_cache(cfg: ModelConfig) -> bool:
  """True when per-layer K/V caching is exact for the design: it attends with the default hook,
  or its ``attend`` override handles the cache (``LayerWiring.attend_handles_kv_cache``)."""
  return design_supports_kv_cache(cfg.design)


def design_supports_kv_cache(design: str) -> bool:
  """``supports_kv_cache`` by the design's registered name."""
  layer = registry.get(design).layer
  return layer.attend is LayerWiring.attend or layer.attend_handles_kv_cache


def init_cache(cfg: ModelConfig, batch: int, max_len: int) -> Any:
  """Zero cache for ``batch`` rows of up to ``max_len`` tokens (scanned layout):
  ``{'layers': {'self_attn': {'kv_cache': {'cached_key', 'cached_value': [L,B,S,K,hd],
  'cache_index': [L,B]}}}}``."""
  model = Transformer(cfg, decode=True)
  tokens = jax.ShapeDtypeStruct((batch, max_len), jnp.int32)
  shapes = jax.eval_shape(lambda t: model.init(jax.random.PRNGKey(0), t), tokens)["cache"]
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def set_cache_index(cache: Any, index: Array) -> Any:
  """Every layer's ``cache_index`` := ``index`` [B] (tokens stored per row)."""
  def set_leaf(path, leaf):
    if jax.tree_util.keystr(path).endswith("['cache_index']"):
      return jnp.broadcast_to(jnp.asarray(index, jnp.int32), leaf.shape)
    return leaf
  return jax.tree_util.tree_map_with_path(set_leaf, cache)


@functools.lru_cache(maxsize=None)
def cached_step(cfg: ModelConfig):
  """The jitted KV-cached decode step of ``cfg``, one per config: ``generate`` runs it and
  ``systems/decode_bench.py`` times it, so the bench measures the program generation uses."""
  model = Transformer(cfg, decode=True)

  @functools.partial(jax.jit, donate_argnums=(1,))
  def step(params, cache, tokens, positions, last):
    """tokens/positions [B,T]; last [B] = index of the logits row to read -> (next [B], logits
    [B,V] at ``last``, cache)."""
    logits, mutated = model.apply({"params": params, "cache": cache}, tokens,
                                  positions=positions, logits_at=last, mutable=["cache"])
    picked = logits[:, 0]
    return jnp.argmax(picked, axis=-1).astype(jnp.int32), picked, mutated["cache"]

  return step


@functools.lru_cache(maxsize=None)
def _full_step(cfg: ModelConfig):
  model = Transformer(cfg)

  @jax.jit
  def step(params, tokens, last):
    """Full recompute over tokens [B,S]; reads the logits at ``last`` [B]."""
    logits = model.apply({"params": params}, tokens)
    picked = jnp.take_along_axis(logits, last[:, None, None], axis=1)[:, 0]
    return jnp.argmax(picked, axis=-1).astype(jnp.int32), picked

  return step


def _round_up(n: int, k: int) -> int:
  return max(k, -(-n // k) * k)


def _pow2_at_least(n: int, smallest: int) -> int:
  size = smallest
  while size < n:
    size *= 2
  return size


def greedy_generate(cfg: ModelConfig, params: Any, prompts: Sequence[Sequence[int]],
                    max_new_tokens: int, eos_id: int | None = None, *,
                    use_cache: bool | None = None, pad_to: int = 16,
                    return_logits: bool = False, n_real: int | None = None):
  """Greedy continuation of each prompt (list of token ids, at least one token each).

  Returns, per prompt, the generated ids (stopping after ``eos_id`` if given, which is
  included, or after ``max_new_tokens``). ``use_cache=None`` uses the KV cache when
  ``supports_kv_cache(cfg)``; ``False`` forces full recompute. With ``return_logits`` also
  returns the [steps, B, V] logits each step chose from (rows finished early keep stepping).
  ``n_real``: rows from this index on only pad the batch to a fixed shape; they start finished
  (empty output) so they never keep the loop running.
  """
  if use_cache is None:
    use_cache = supports_kv_cache(cfg)
  if use_cache and not supports_kv_cache(cfg):
    raise ValueError(f"design {cfg.design!r} overrides attend; KV caching is not exact for it "
                     "(use_cache=False recomputes the full sequence)")
  params = nn.unbox(params)
  lens = np.array([len(p) for p in prompts], np.int32)
  if lens.min() < 1:
    raise ValueError("greedy_generate: every prompt needs at least one token")
  # Power-of-two prompt buckets: a whole eval set compiles a handful of shapes.
  batch, prompt_len = len(prompts), _pow2_at_least(int(lens.max()), pad_to)
  total = prompt_len + _round_up(max_new_tokens, pad_to)
  buffer = np.zeros((batch, total), np.int32)
  for b, p in enumerate(prompts):
    buffer[b, :len(p)] = p

  out: list[list[int]] = [[] for _ in prompts]
  if max_new_tokens <= 0:  # Nothing to generate (the cached path's prefill would emit one).
    return (out, np.zeros((0, batch, cfg.vocab_size), np.float32)) if return_logits else out
  done = np.zeros(batch, bool)
  if n_real is not None:
    done[n_real:] = True
  all_logits = []

  def record(next_ids, logits):
    next_ids = np.asarray(next_ids)
    if return_logits:
      all_logits.append(np.asarray(logits))
    for b in range(batch):
      if not done[b]:
        out[b].append(int(next_ids[b]))
        done[b] = eos_id is not None and int(next_ids[b]) == eos_id
    return next_ids

  if use_cache:
    step = cached_step(cfg)
    cache = init_cache(cfg, batch, total)
    positions = np.broadcast_to(np.arange(prompt_len, dtype=np.int32), (batch, prompt_len))
    next_ids, logits, cache = step(params, cache, buffer[:, :prompt_len], positions, lens - 1)
    cache = set_cache_index(cache, lens)
    next_ids = record(next_ids, logits)
    zero = np.zeros(batch, np.int32)
    for t in range(1, max_new_tokens):
      if done.all():
        break
      pos = (lens + t - 1)[:, None]
      next_ids, logits, cache = step(params, cache, next_ids[:, None].astype(np.int32), pos, zero)
      next_ids = record(next_ids, logits)
  else:
    step = _full_step(cfg)
    for t in range(max_new_tokens):
      if done.all():
        break
      next_ids, logits = step(params, buffer, lens + t - 1)
      next_ids = record(next_ids, logits)
      buffer[np.arange(batch), lens + t] = next_ids
  return (out, np.stack(all_logits)) if return_logits else out
