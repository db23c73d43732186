"""The train and eval losses: next-token targets, and sums that average exactly over batches."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from configs import smoke
from depthbench_jax.model.config import model_config_from
from depthbench_jax.model.transformer import Transformer
from depthbench_jax.train.step import eval_step, lm_loss


def _model_params_tokens():
  cfg = model_config_from(smoke.get_config("arch=preln,shape=2x32").model)
  model = Transformer(cfg)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 9), 0, cfg.vocab_size)
  params = nn.unbox(model.init(jax.random.PRNGKey(0), tokens[:, :-1])["params"])
  return model, params, tokens


def test_lm_loss_predicts_the_next_token():
  """Position t's logits (having read tokens 0..t) score token t+1."""
  model, params, tokens = _model_params_tokens()
  logp = np.asarray(jax.nn.log_softmax(model.apply({"params": params}, tokens[:, :-1]), -1))
  b, t = np.indices(tokens[:, 1:].shape)
  want = -logp[b, t, np.asarray(tokens[:, 1:])].mean()
  np.testing.assert_allclose(lm_loss(params, model, tokens), want, rtol=1e-5)
  same = -logp[b, t, np.asarray(tokens[:, :-1])].mean()   # the current token: another number
  assert abs(want - same) > 1e-3


def test_eval_step_sums_loss_and_counts_tokens():
  model, params, tokens = _model_params_tokens()
  out = eval_step(params, {"tokens": tokens}, model=model)
  n = tokens.shape[0] * (tokens.shape[1] - 1)
  assert float(out["count"]) == n
  np.testing.assert_allclose(out["loss_sum"], n * lm_loss(params, model, tokens), rtol=1e-5)
  # Two half batches sum to the whole: evaluation averages exactly over batches of any size.
  halves = [eval_step(params, {"tokens": tokens[i:i + 1]}, model=model) for i in (0, 1)]
  np.testing.assert_allclose(sum(float(h["loss_sum"]) for h in halves), out["loss_sum"],
                             rtol=1e-5)
  assert jnp.issubdtype(out["count"].dtype, jnp.floating)


def test_gradient_accumulation_is_the_whole_batchs_loss_and_gradient(monkeypatch):
  """Two microbatches of one row each give the mean loss and gradient of the whole batch (equal
  up to fp32 summation order); the gradients keep the params' dtype. The loss is traced on the
  slices' rows (with the accumulation never taken, both sides were the whole batch)."""
  from depthbench_jax.train import step
  model, params, tokens = _model_params_tokens()
  rows, real = [], step.lm_loss
  monkeypatch.setattr(step, "lm_loss", lambda p, m, t: rows.append(t.shape[0]) or real(p, m, t))
  run = lambda k: jax.jit(lambda p, t: step.loss_and_grads(p, model, t, microbatches=k))(
      params, tokens)
  (loss, grads), (loss_k, grads_k) = run(1), run(2)
  assert rows == [tokens.shape[0], tokens.shape[0] // 2], rows
  np.testing.assert_allclose(loss_k, loss, rtol=1e-6)
  for g_k, g in zip(jax.tree.leaves(grads_k), jax.tree.leaves(grads)):
    assert g_k.dtype == g.dtype
    np.testing.assert_allclose(g_k, g, rtol=2e-5, atol=1e-7)


def test_skip_nonfinite_keeps_the_state_on_a_finite_loss_with_a_non_finite_gradient(monkeypatch):
  """The skip tests inject a NaN batch, which makes the loss and the gradient non-finite
  together: a skip reading the loss alone passed them. A finite loss with one inf gradient
  entry must keep params and optimizer state too, and report the step as not finite."""
  import optax
  from depthbench_jax.train import step as step_lib
  model, params, tokens = _model_params_tokens()
  optimizer = optax.adamw(1e-3)
  state = step_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                              opt_state=optimizer.init(params))

  def finite_loss_inf_grad(params, *args):
    grads = jax.tree.map(jnp.zeros_like, params)
    leaves, tree = jax.tree.flatten(grads)
    leaves[0] = leaves[0].at[(0,) * leaves[0].ndim].set(jnp.inf)
    return jnp.float32(2.5), jax.tree.unflatten(tree, leaves)

  monkeypatch.setattr(step_lib, "loss_and_grads", finite_loss_inf_grad)
  new, metrics = step_lib.train_step(state, {"tokens": tokens}, model=model, optimizer=optimizer,
                                     schedule=lambda count: 1e-3, skip_nonfinite=True)
  assert float(metrics["loss"]) == 2.5 and float(metrics["finite"]) == 0.0
  same = lambda a, b: all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a),
                                                                jax.tree.leaves(b)))
  assert same(new.params, params) and same(new.opt_state, state.opt_state)
  assert int(new.step) == 1


def test_an_injected_fault_is_a_guard_field():
  """A diverged run rerun with another debug.nan_at_step resumes (the faults decide whether it
  diverges); dropping 'debug.' from GUARD_FIELDS passed every test."""
  from depthbench_jax import recipe
  from depthbench_jax.train import config_check
  from tests.helpers import tiny_config
  saved = config_check.as_json(tiny_config(**{"debug.nan_at_step": 7}))
  now = config_check.as_json(tiny_config(**{"debug.nan_at_step": 9}))
  assert recipe.guard_changes(saved, now) == ["debug.nan_at_step"]
  assert recipe.guard_changes(saved, config_check.as_json(tiny_config(
      **{"debug.nan_at_step": 7, "log_every": 3}))) == []
