"""MoDA through model/append_stack.py equals the plain nn.scan, loss and every gradient."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from depthbench_jax.model import append_stack
from depthbench_jax.model.config import model_config_from
from depthbench_jax.model.transformer import Transformer
from depthbench_jax.residual import moda
from depthbench_jax.train.step import cross_entropy
from tests.helpers import tiny_config


def _cfg(policy="nothing_saveable", layout=None, **residual):
  c = tiny_config(**{"model.n_layers": 3, "model.d_model": 32, "model.n_heads": 4,
                     "model.ffn_dim": None, **(layout or {})})
  c.model.residual = {"name": "moda", **residual}
  c.model.remat_policy = policy
  return model_config_from(c.model)


def _loss(cfg, params, tokens, gate=None):
  logits = Transformer(cfg).apply({"params": params}, tokens[:, :-1], gate=gate)
  return jnp.mean(cross_entropy(logits, tokens[:, 1:]))


@pytest.mark.parametrize("policy,residual,layout", [
    ("nothing_saveable", {}, {}),
    ("dots_saveable", {"ffn_kv": False}, {}),                      # attention slots only
    ("nothing_saveable", {}, {"model.n_kv_heads": 2, "model.qk_norm": True}),   # Qwen3 GQA
])
def test_loss_and_gradients_equal_the_plain_scan(policy, residual, layout, monkeypatch):
  cfg = _cfg(policy, layout, **residual)
  params = nn.unbox(Transformer(cfg).init(jax.random.PRNGKey(0),
                                          jnp.zeros((1, 8), jnp.int32))["params"])
  tokens = jax.random.randint(jax.random.PRNGKey(2), (2, 13), 0, cfg.vocab_size)
  calls = []
  real = append_stack.append_buffer_stack
  monkeypatch.setattr(append_stack, "append_buffer_stack",
                      lambda *a: calls.append(1) or real(*a))
  fast = jax.jit(jax.value_and_grad(functools.partial(_loss, cfg)))(params, tokens)
  assert calls, "the training path did not go through append_stack"
  gate = jnp.ones((cfg.n_layers,))  # a gate forces the plain nn.scan path; 1 = same network
  plain = jax.jit(jax.value_and_grad(lambda p, t: _loss(cfg, p, t, gate)))(params, tokens)
  np.testing.assert_allclose(fast[0], plain[0], rtol=1e-6)
  for (path, got), want in zip(jax.tree_util.tree_leaves_with_path(fast[1]),
                               jax.tree.leaves(plain[1])):
    assert float(jnp.max(jnp.abs(want))) > 0, jax.tree_util.keystr(path)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-6,
                               err_msg=jax.tree_util.keystr(path))


def test_presence_before_a_layer_marks_the_slots_of_earlier_layers():
  both, attention_only = _cfg(), _cfg(ffn_kv=False)
  np.testing.assert_array_equal(moda.presence_before(both, jnp.asarray(2)), [1, 1, 1, 1, 0, 0])
  np.testing.assert_array_equal(moda.presence_before(attention_only, jnp.asarray(2)),
                                [1, 0, 1, 0, 0, 0])
  np.testing.assert_array_equal(moda.presence_before(both, jnp.asarray(0)), [0] * 6)
