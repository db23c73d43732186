"""AdamW with linear warmup and cosine decay, global-norm clipping, and weight decay on the
``kernel``/``embedding`` leaves and each design's ``Design.decayed`` (``weight_decay_mask``)."""

from __future__ import annotations

import functools

import jax
import optax

from depthbench_jax.residual import registry

DECAYED_LEAVES = ("kernel", "embedding")


def warmup_steps_of(config, total_steps: int) -> int:
  """``warmup_steps`` as an int, or as a fraction of ``total_steps`` when in (0, 1)."""
  w = config.warmup_steps
  return int(round(w * total_steps)) if isinstance(w, float) and 0 < w < 1 else int(w)


def lr_schedule(config, total_steps: int) -> optax.Schedule:
  """``lr * t / W`` for t < W, then cosine from ``lr`` down to ``min_lr_ratio * lr`` at the end."""
  warmup = max(warmup_steps_of(config, total_steps), 1)
  decay_steps = max(total_steps - warmup, 1)
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=config.lr, warmup_steps=warmup,
      decay_steps=warmup + decay_steps, end_value=config.lr * config.min_lr_ratio)


def weight_decay_mask(params, extra: tuple[str, ...] = ()):
  """True on the leaves AdamW decays: the matmul weights and the embedding, plus ``extra`` (a
  design's ``Design.decayed``: HC's and mHC's dynamic projections, HC Sec. 4); not norm gains,
  scales (HC's ``s_alpha``, ``s_beta`` too: the paper does not name them, see residual/hc.py),
  pseudo-queries or static mixing weights (HC Sec. 4: static connection weights get no decay)."""
  names = DECAYED_LEAVES + tuple(extra)
  def decayed(path, _):
    last = path[-1]
    return getattr(last, "key", getattr(last, "name", None)) in names
  return jax.tree_util.tree_map_with_path(decayed, params)


def make_optimizer(config, total_steps: int) -> optax.GradientTransformation:
  return optax.chain(
      optax.clip_by_global_norm(config.grad_clip) if config.grad_clip > 0 else optax.identity(),
      optax.adamw(lr_schedule(config, total_steps), b1=config.b1, b2=config.b2, eps=1e-8,
                  weight_decay=config.weight_decay, mask=functools.partial(
                      weight_decay_mask, extra=registry.get(config.model.residual.name).decayed)))
