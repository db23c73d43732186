"""Model-side scoring: teacher-forced token log-probs of continuations, and greedy completions.

``continuation_logprobs`` runs ``[context ++ continuation]`` through the model in fixed-shape
batches (rows sorted by length, padded to a power-of-two bucket, so a set compiles a handful of
shapes) and returns ``log p(c_j | context, c_<j)`` for every continuation token ``c_j``.
A sequence longer than ``max_len`` loses tokens from the front (context first); if the
continuation alone is longer than ``max_len - 1`` its first tokens are dropped and not scored
(the returned array is then shorter than the continuation).
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from depthbench_jax.model.config import ModelConfig
from depthbench_jax.model.decode import greedy_generate
from depthbench_jax.model.transformer import Transformer


@functools.lru_cache(maxsize=None)
def _logprob_fn(cfg: ModelConfig):
  model = Transformer(cfg)

  @jax.jit
  def next_token_logprobs(params, tokens):
    """tokens [B,T] -> [B,T-1]: ``log softmax(logits[:, t])[tokens[:, t+1]]``."""
    logits = model.apply({"params": params}, tokens[:, :-1])
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]

  return next_token_logprobs


def _bucket(n: int, max_len: int, smallest: int = 32) -> int:
  size = smallest
  while size < n:
    size *= 2
  return min(size, max_len)


def continuation_logprobs(cfg: ModelConfig, params: Any,
                          pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *,
                          batch_size: int = 8, max_len: int | None = None) -> list[np.ndarray]:
  """Per pair ``(context ids, continuation ids)`` (context non-empty): float32 [n] log-probs."""
  max_len = max_len or cfg.max_seq_len
  fn = _logprob_fn(cfg)
  params = nn.unbox(params)
  rows = []  # (tokens, first scored position in tokens)
  for ctx, cont in pairs:
    if not ctx:
      raise ValueError("continuation_logprobs: empty context (prepend eos as BOS)")
    seq = list(ctx) + list(cont)
    start = len(ctx)
    drop = max(0, len(seq) - max_len)
    seq, start = seq[drop:], max(1, start - drop)
    rows.append((seq, start))
  order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
  out: list[np.ndarray | None] = [None] * len(rows)
  for lo in range(0, len(order), batch_size):
    idx = order[lo:lo + batch_size]
    width = _bucket(max(len(rows[i][0]) for i in idx), max_len)
    tokens = np.zeros((batch_size, width), np.int32)
    for r, i in enumerate(idx):
      tokens[r, :len(rows[i][0])] = rows[i][0]
    logp = np.asarray(fn(params, tokens))
    for r, i in enumerate(idx):
      seq, start = rows[i]
      out[i] = logp[r, start - 1:len(seq) - 1].astype(np.float32)  # predicts seq[start:]
  return out  # type: ignore[return-value]


def truncate_at_stops(text: str, stops: Sequence[str]) -> str:
  """``text`` up to the earliest occurrence of any stop sequence."""
  cut = len(text)
  for s in stops:
    k = text.find(s)
    if k != -1:
      cut = min(cut, k)
  return text[:cut]


def greedy_completions(cfg: ModelConfig, params: Any, tokenizer: Any, prompts: Sequence[str], *,
                       max_new_tokens: int = 256, stops: Sequence[str] = (),
                       batch_size: int = 8, max_len: int | None = None) -> list[str]:
  """Greedy text continuation of each prompt (``<eos>`` prepended), cut at ``stops``/eos.

  Prompts longer than ``max_len - max_new_tokens`` tokens keep their last tokens.
  """
  max_len = max_len or cfg.max_seq_len
  if max_new_tokens >= max_len:
    raise ValueError(f"--max_new_tokens={max_new_tokens} leaves no room for a prompt in the "
                     f"model's {max_len} positions; allowed: < {max_len}")
  keep = max_len - max_new_tokens
  ids = [([tokenizer.eos_id] + tokenizer.encode(p))[-keep:] for p in prompts]
  texts = []
  for lo in range(0, len(ids), batch_size):
    chunk = ids[lo:lo + batch_size]
    padded = chunk + [[tokenizer.eos_id]] * (batch_size - len(chunk))  # One batch shape.
    outs = greedy_generate(cfg, params, padded, max_new_tokens, eos_id=tokenizer.eos_id,
                           pad_to=32, n_real=len(chunk))[:len(chunk)]
    for o in outs:
      if o and o[-1] == tokenizer.eos_id:
        o = o[:-1]
      texts.append(truncate_at_stops(tokenizer.decode(o), stops))
  return texts
