"""The pure train and eval steps: ``(state, batch) -> (state, metrics)``.

A batch is ``{'tokens': int32 [B, T+1]}``; inputs are ``tokens[:, :-1]``, targets
``tokens[:, 1:]``; the loss is the mean next-token cross-entropy over all B*T positions.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax

from depthbench_jax.model.transformer import Transformer, batch_sharded


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """Per-position ``-log softmax(logits)[target]`` [B, T], in fp32."""
  return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)


def lm_loss(params, model: Transformer, tokens: jax.Array) -> jax.Array:
  logits = model.apply({"params": params}, tokens[:, :-1])
  return jnp.mean(cross_entropy(logits, tokens[:, 1:]))


def loss_and_grads(params, model: Transformer, tokens: jax.Array, microbatches: int = 1):
  """``(lm_loss, its gradient)`` over the batch ``tokens [B, T+1]``.

  With ``microbatches = k`` (gradient accumulation) the batch is k slices of B/k rows, run one
  after another in a scan: ``loss = (1/k) sum_j loss_j`` and ``grad = (1/k) sum_j grad_j``, summed
  in fp32, which equal the whole batch's mean and gradient (every slice has B/k x T positions)
  with the activations of B/k rows at a time. Slice j holds rows j, k + j, 2k + j, ... and is
  pinned to rows over ``data x fsdp`` (``batch_sharded``): a device's rows, one contiguous block
  under the batch sharding, feed every slice, as in MaxText's gradient accumulation."""
  if microbatches == 1:
    return jax.value_and_grad(lm_loss)(params, model, tokens)
  b, t = tokens.shape
  slices = tokens.reshape(b // microbatches, microbatches, t).swapaxes(0, 1)
  slices = batch_sharded(slices, model.mesh, b // microbatches, t)

  def one_slice(total, rows):
    loss, grads = jax.value_and_grad(lm_loss)(params, model, rows)
    return jax.tree.map(lambda a, g: a + g.astype(jnp.float32), total, (loss, grads)), None

  zero = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), (jnp.zeros(()), params))
  (loss, grads), _ = jax.lax.scan(one_slice, zero, slices)
  return loss / microbatches, jax.tree.map(lambda g, p: (g / microbatches).astype(p.dtype),
                                           grads, params)


def init_state(model: Transformer, optimizer: optax.GradientTransformation, rng: jax.Array,
               seq_len: int) -> TrainState:
  params = nn.unbox(model.init(rng, jnp.zeros((1, seq_len), jnp.int32))["params"])
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    opt_state=optimizer.init(params))


def train_step(state: TrainState, batch: dict, *, model: Transformer,
               optimizer: optax.GradientTransformation, schedule: optax.Schedule,
               skip_nonfinite: bool = False, microbatches: int = 1) -> tuple[TrainState, dict]:
  """One AdamW step on the batch's gradient (in ``microbatches`` slices: ``loss_and_grads``).
  With ``skip_nonfinite`` a step whose loss or gradient is not finite leaves params and
  optimizer state untouched (the step counter still advances)."""
  loss, grads = loss_and_grads(state.params, model, batch["tokens"], microbatches)
  grad_norm = optax.global_norm(grads)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  if skip_nonfinite:
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    params, opt_state = keep(params, state.params), keep(opt_state, state.opt_state)
  new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state)
  metrics = {"loss": loss, "grad_norm": grad_norm, "lr": schedule(_schedule_count(state)),
             "finite": finite.astype(jnp.float32)}
  return new_state, metrics


def _schedule_count(state: TrainState):
  """The step count optax's LR schedule reads (``ScaleByScheduleState.count``): the LR this
  step applies. It equals ``state.step`` unless ``skip_nonfinite`` kept a step's optimizer state,
  which holds the schedule back by one."""
  counts = [v for path, v in optax.tree_utils.tree_get_all_with_path(state.opt_state, "count")
            if getattr(path[-1], "tuple_name", None) == "ScaleByScheduleState"]
  return counts[0] if counts else state.step


def eval_step(params, batch: dict, *, model: Transformer) -> dict:
  """Summed loss and token count, so batches of any size average exactly."""
  tokens = batch["tokens"]
  nll = cross_entropy(model.apply({"params": params}, tokens[:, :-1]), tokens[:, 1:])
  return {"loss_sum": jnp.sum(nll), "count": jnp.asarray(nll.size, jnp.float32)}
