"""Small shared pieces for the residual-design tests: a tiny config, real text, a train loop."""

from __future__ import annotations

import functools
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from configs.base import get_config
from depthbench_jax.model.config import model_config_from
from depthbench_jax.model.transformer import Transformer
from depthbench_jax.residual import registry

# The tests compile many tiny programs and run each a few times: cheap codegen beats fast code
# (~40% less CPU). O0 once turned a gradient through sinkhorn's max-shift ties into NaN where
# the default build did not; base.sinkhorn_knopp now stops that (cancelling) gradient.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def jit(f):
  return jax.jit(f, compiler_options=FAST_COMPILE)


VOCAB = 61
# A character vocabulary of 61 symbols for real English text: id 0 = anything else.
ALPHABET = " abcdefghijklmnopqrstuvwxyz0123456789.,;:'\"!?()-/&$%\n"
assert len(ALPHABET) < VOCAB


def tiny_cfg(name: str, n_layers: int = 2, d_model: int = 32, residual=None, **model):
  """A validated ModelConfig: d=32, 4 heads, vocab 61, scan + remat on unless overridden."""
  m = get_config().model
  m.vocab_size, m.d_model, m.n_layers, m.n_heads = VOCAB, d_model, n_layers, 4
  m.max_seq_len = 256
  for key, value in model.items():
    setattr(m, key, value)
  m.residual = ml_collections.ConfigDict({"name": name, **(residual or {})})
  return model_config_from(m)


@functools.cache
def text_tokens(n_tokens: int = 4096) -> np.ndarray:
  """The first ``n_tokens`` characters of the embedded corpus's Lee news articles as ids [n].

  (``depthbench_jax.data.corpus``: real English text shipped in the gensim wheel; the wiki part
  needs a slow markup parse, the Lee part is plain text.) Falls back to a fixed pseudo-text with
  word structure when gensim is absent, so the test still runs.
  """
  try:
    from depthbench_jax.data import corpus  # pylint: disable=g-import-not-at-top
    path = os.path.join(corpus.gensim_test_data_dir(), corpus.LEE_FILE)
    text = "\n".join(corpus.lee_articles(path))[:n_tokens].lower()
  except (ImportError, OSError, ValueError):
    rng = np.random.RandomState(0)
    words = ["the", "of", "and", "a", "to", "in", "is", "was", "it", "for", "on", "that"]
    text = " ".join(words[i] for i in rng.randint(0, len(words), size=n_tokens))[:n_tokens]
  index = {c: i + 1 for i, c in enumerate(ALPHABET)}
  return np.array([index.get(c, 0) for c in text], np.int32)


def text_batch(batch: int = 4, seq: int = 32) -> np.ndarray:
  ids = text_tokens()
  return np.stack([ids[i * seq:(i + 1) * seq] for i in range(batch)])


@functools.cache
def _init_fn(cfg):
  tokens = jnp.zeros((1, 8), jnp.int32)
  return jit(lambda rng: nn.unbox(Transformer(cfg).init(rng, tokens)["params"]))


def init(cfg, seed: int = 0):
  """Unboxed params of ``Transformer(cfg)`` (the jitted init is cached per config)."""
  return _init_fn(cfg)(jax.random.PRNGKey(seed))


@functools.cache
def forward(cfg):
  """Jitted ``(params, tokens, gate) -> (logits, {'hidden', 'update'})``, cached per config."""
  return jit(lambda params, tokens, gate: Transformer(cfg).apply(
      {"params": params}, tokens, gate=gate, return_layers=True))


def run(cfg, params, tokens, gate=None):
  gate = jnp.ones((cfg.n_layers,), jnp.float32) if gate is None else jnp.asarray(gate, jnp.float32)
  return forward(cfg)(params, tokens, gate)


def wiring_call(cfg, params, method: str, *args):
  """Runs ``LayerWiring.<method>(*args)`` of ``cfg``'s design with the given per-layer params.

  Returns (output, sown intermediates).
  """
  module = registry.get(cfg.design).layer(cfg)
  return module.apply({"params": params}, *args, method=getattr(type(module), method),
                      mutable=["intermediates"])


def rms(x, eps=1e-6):
  """Hand-written RMS over the last axis (numpy), the reference for the update equations."""
  x = np.asarray(x, np.float64)
  return np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def perturb(params, scale: float = 0.1, seed: int = 1):
  """Adds noise to every leaf so no gain is 1 and no dynamic weight is 0 (numpy: no compiles)."""
  rng = np.random.RandomState(seed)
  return jax.tree.map(
      lambda x: jnp.asarray(np.asarray(x) + scale * rng.standard_normal(x.shape), x.dtype), params)


def transplant(src, dst):
  """``dst`` with every leaf that also exists in ``src`` (same path, same shape) copied over."""
  if isinstance(dst, dict):
    return {k: (transplant(src[k], v) if isinstance(src, dict) and k in src else v)
            for k, v in dst.items()}
  assert np.shape(src) == np.shape(dst), (np.shape(src), np.shape(dst))
  return src


def loss_fn(cfg, params, tokens):
  logits = Transformer(cfg).apply({"params": params}, tokens[:, :-1])
  labels = tokens[:, 1:]
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def train(cfg, steps: int = 30, lr: float = 3e-3, seed: int = 0):
  """``steps`` AdamW steps on one fixed batch of real text; returns (losses, grad norms)."""
  tokens = jnp.asarray(text_batch())
  params = init(cfg, seed)
  opt = optax.adamw(lr, b1=0.9, b2=0.95, weight_decay=0.0)
  state = opt.init(params)

  @jit
  def step(params, state):
    loss, grads = jax.value_and_grad(functools.partial(loss_fn, cfg))(params, tokens)
    finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss, optax.global_norm(grads), finite

  losses, norms = [], []
  for _ in range(steps):
    params, state, loss, norm, finite = step(params, state)
    assert bool(finite), f"{cfg.design}: non-finite gradient at step {len(losses)}"
    losses.append(float(loss))
    norms.append(float(norm))
  return np.array(losses), np.array(norms)


# ---------------------------------------------------------------------------------------------
# Checks every design must pass; each test file runs them over its own designs.
# ---------------------------------------------------------------------------------------------

def check_scan_matches_unrolled(name: str, residual=None):
  """nn.scan + remat and the unrolled loop give the same logits and per-layer outputs."""
  from depthbench_jax.model.transformer import unstack_layers  # pylint: disable=g-import-not-at-top
  cfg_scan = tiny_cfg(name, residual=residual)
  cfg_loop = tiny_cfg(name, residual=residual, scan_layers=False, remat_policy="none")
  params = perturb(init(cfg_scan))
  tokens = jnp.asarray(text_batch(2, 12))
  got = run(cfg_scan, params, tokens)
  want = run(cfg_loop, unstack_layers(params, cfg_scan.n_layers), tokens)
  np.testing.assert_allclose(got[0], want[0], atol=2e-5, rtol=1e-5)
  for key in ("hidden", "update"):
    np.testing.assert_allclose(got[1][key], want[1][key], atol=2e-5, rtol=1e-5)
  assert got[1]["hidden"].shape == (cfg_scan.n_layers, 2, 12, cfg_scan.d_model)


def check_gate_zero_removes_layer(name: str, residual=None):
  """gate[1] = 0 leaves the state as layer 0 left it, and changes the output; a gate of ones
  gives the model without a gate (which skips the blend)."""
  cfg = tiny_cfg(name, residual=residual)
  params = perturb(init(cfg))
  tokens = jnp.asarray(text_batch(2, 12))
  logits, layers = run(cfg, params, tokens, [1.0, 0.0])
  np.testing.assert_allclose(layers["hidden"][1], layers["hidden"][0], atol=1e-6)
  logits_full, layers_full = run(cfg, params, tokens)
  assert not np.allclose(layers_full["hidden"][1], layers_full["hidden"][0], atol=1e-3)
  assert not np.allclose(logits, logits_full, atol=1e-4)
  no_gate = jit(lambda p, t: Transformer(cfg).apply({"params": p}, t))(params, tokens)
  np.testing.assert_allclose(no_gate, logits_full, atol=1e-5, rtol=1e-5)


def check_permute_layers(name: str, residual=None):
  """The identity order reproduces the model; swapping the two layers changes it."""
  from depthbench_jax.model.transformer import permute_layers  # pylint: disable=g-import-not-at-top
  cfg = tiny_cfg(name, residual=residual)
  params = perturb(init(cfg))
  tokens = jnp.asarray(text_batch(2, 12))
  base = run(cfg, params, tokens)[0]
  np.testing.assert_allclose(run(cfg, permute_layers(params, jnp.array([0, 1])), tokens)[0],
                             base, atol=1e-6)
  swapped = run(cfg, permute_layers(params, jnp.array([1, 0])), tokens)[0]
  assert not np.allclose(swapped, base, atol=1e-4)


def check_training_lowers_loss(name: str, residual=None):
  """30 AdamW steps (scan + remat on) on a fixed batch of real text: finite grads, lower loss."""
  cfg = tiny_cfg(name, residual=residual)
  assert cfg.scan_layers and cfg.remat_policy != "none"
  losses, norms = train(cfg, steps=30)
  assert np.all(np.isfinite(losses)) and np.all(np.isfinite(norms)) and norms[0] > 0
  assert losses[-3:].mean() < losses[:3].mean() - 0.5, losses


SHARED_CHECKS = {"scan_matches_unrolled": check_scan_matches_unrolled,
                 "gate_zero_removes_layer": check_gate_zero_removes_layer,
                 "permute_layers": check_permute_layers,
                 "training_lowers_loss": check_training_lowers_loss}


def shared_checks_test(designs):
  """A test running every ``SHARED_CHECKS`` entry on every design in ``designs``.

  A test file binds it to a ``test_*`` name (``test_shared_checks = shared_checks_test(DESIGNS)``);
  ids ``<check>-<design>``, run check by check (every design's scan check first).
  """
  @pytest.mark.parametrize("name", designs)
  @pytest.mark.parametrize("check", list(SHARED_CHECKS))
  def test(name, check):
    SHARED_CHECKS[check](name)
  return test
