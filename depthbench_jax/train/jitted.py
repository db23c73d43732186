"""The train and eval steps as training compiles them for a mesh (params, Adam moments and
batches sharded), without the data pipeline or checkpointing: ``systems/train_memory.py``
compiles them on a device image that has neither grain nor the training data."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from absl import logging

from depthbench_jax.model.transformer import Transformer
from depthbench_jax.train import sharding
from depthbench_jax.train.optimizer import lr_schedule, make_optimizer
from depthbench_jax.train.step import TrainState, eval_step, init_state, train_step


@dataclasses.dataclass(frozen=True)
class JittedSteps:
  """The model, its optimizer, the state's abstract shapes and shardings, and the jitted steps."""
  model: Transformer
  optimizer: Any
  abstract_state: TrainState
  param_sharding: Any
  state_sharding: TrainState
  batch_sharding: Any
  step_fn: Any
  eval_fn: Any


def jitted_steps(config, model_cfg, mesh, steps: int) -> JittedSteps:
  """The train and eval steps as ``train_and_evaluate`` runs them on ``mesh``: params and Adam
  moments by the logical rules (``sharding.py``), batch rows and the model's activations over
  ``data x fsdp``. Nothing is allocated (shapes from ``jax.eval_shape``)."""
  model = Transformer(model_cfg, mesh=mesh)
  schedule = lr_schedule(config, steps)
  optimizer = make_optimizer(config, steps)
  seq_len = config.data.seq_len
  boxed = jax.eval_shape(
      lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, seq_len), jnp.int32))["params"])
  param_sharding = sharding.logical_shardings(boxed, mesh)
  warning = sharding.fsdp_warning(boxed, mesh)
  if warning:
    logging.warning(warning)
  abstract_state = jax.eval_shape(
      functools.partial(init_state, model, optimizer, seq_len=seq_len),
      jax.random.PRNGKey(config.seed))
  opt_sharding = _opt_state_sharding(abstract_state.opt_state, param_sharding, mesh)
  state_sharding = TrainState(step=sharding.replicated(mesh), params=param_sharding,
                              opt_state=opt_sharding)
  batch_sharding = sharding.batch_sharding(mesh)
  repl = sharding.replicated(mesh)
  step_fn = jax.jit(
      functools.partial(train_step, model=model, optimizer=optimizer, schedule=schedule,
                        skip_nonfinite=config.skip_nonfinite_steps,
                        microbatches=config.grad_accum_steps),
      in_shardings=(state_sharding, batch_sharding), out_shardings=(state_sharding, repl),
      donate_argnums=(0,))
  eval_fn = jax.jit(functools.partial(eval_step, model=model),
                    in_shardings=(param_sharding, batch_sharding), out_shardings=repl)
  return JittedSteps(model, optimizer, abstract_state, param_sharding, state_sharding,
                     batch_sharding, step_fn, eval_fn)


def _opt_state_sharding(abstract_opt_state, param_sharding, mesh):
  """Adam moments shard like their params; everything else (step counts) is replicated."""
  param_structure = jax.tree.structure(param_sharding)

  def match(subtree):
    if jax.tree.structure(subtree) == param_structure:
      return param_sharding
    return None
  return _map_param_like(abstract_opt_state, param_sharding, match, mesh)


def _map_param_like(tree, param_sharding, match, mesh):
  """Walks optax's state, replacing every param-structured subtree by the param shardings."""
  matched = match(tree)
  if matched is not None:
    return matched
  if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # NamedTuple (optax states).
    return type(tree)(*[_map_param_like(t, param_sharding, match, mesh) for t in tree])
  if isinstance(tree, (tuple, list)):
    return type(tree)(_map_param_like(t, param_sharding, match, mesh) for t in tree)
  if isinstance(tree, dict):
    return {k: _map_param_like(v, param_sharding, match, mesh) for k, v in tree.items()}
  return jax.tree.map(lambda _: sharding.replicated(mesh), tree)
