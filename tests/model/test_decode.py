"""KV-cache decoding equals full recompute; the default forward pass is untouched by decode."""

import flax.linen as nn
import ml_collections
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.base import get_config
from depthbench_jax.model import decode
from depthbench_jax.model.config import model_config_from
from depthbench_jax.model.transformer import Transformer, abstract_params
from depthbench_jax.residual import registry


def cfg_of(**overrides):
  m = get_config().model
  m.vocab_size, m.d_model, m.n_layers, m.n_heads, m.ffn_dim = 61, 32, 2, 4, 64
  m.remat_policy = "none"
  for k, v in overrides.items():
    setattr(m, k, v)
  return model_config_from(m)


PROMPTS = [[5, 9, 2, 33, 7, 1, 8], [4, 4, 4], [12, 50, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 9]]


def random_params(cfg, seed=0, std=0.3):
  """Random params of the model's shapes, drawn in numpy (no init compile); sharp logits."""
  rng = np.random.RandomState(seed)
  draw = lambda leaf: (std * rng.randn(*leaf.shape)).astype(np.float32)
  return jax.tree.map(draw, nn.unbox(abstract_params(cfg)))


MODA = ml_collections.ConfigDict({"name": "moda"})


@pytest.mark.parametrize("overrides", [
    dict(), dict(n_kv_heads=2, qk_norm=True, scan_layers=False),
    # MoDA's own cached attention, with GQA depth keys through the reading layer's k_norm.
    dict(n_layers=3, n_kv_heads=2, qk_norm=True, residual=MODA),
    # Unrolled, MoDA's layers read only the first 8 of the 10 depth slots (a static index).
    dict(n_layers=5, n_kv_heads=2, qk_norm=True, residual=MODA, scan_layers=False)])
def test_kv_cache_equals_full_recompute(overrides, monkeypatch):
  cfg = cfg_of(**overrides)
  assert decode.supports_kv_cache(cfg)
  params = random_params(cfg)
  # The cached side runs the cached step (with its branch never taken, both sides recomputed
  # and the test passed): one prefill, then a step per new token.
  calls, real = [], decode.cached_step
  monkeypatch.setattr(decode, "cached_step",
                      lambda c: (lambda *a: calls.append(1) or real(c)(*a)))
  cached, cached_logits = decode.greedy_generate(cfg, params, PROMPTS, 6, return_logits=True)
  assert len(calls) == 6
  full, full_logits = decode.greedy_generate(cfg, params, PROMPTS, 6, use_cache=False,
                                             return_logits=True)
  assert len(calls) == 6 and cached == full
  np.testing.assert_allclose(cached_logits, full_logits, atol=1e-5, rtol=1e-5)
  # And against a plain forward pass of the unpadded prompt + generated tokens.
  seq = PROMPTS[0] + cached[0][:-1]
  logits = Transformer(cfg).apply({"params": params}, jnp.array([seq], jnp.int32))
  np.testing.assert_allclose(cached_logits[:, 0], logits[0, len(PROMPTS[0]) - 1:], atol=1e-5)


def test_decoding_past_the_prompt_bucket_equals_full_recompute():
  """A 16-token prompt fills its bucket (pad_to=16): every new token is written past it, into
  the cache's room for generated tokens. Every other case stayed inside the prompt bucket, so
  a cache without that room (a write past its end clamps onto the last slot, silently) passed."""
  cfg = cfg_of()
  params = random_params(cfg)
  prompt = [[(7 * i + 3) % 61 for i in range(16)]]
  cached, cached_logits = decode.greedy_generate(cfg, params, prompt, 4, pad_to=16,
                                                 return_logits=True)
  full, full_logits = decode.greedy_generate(cfg, params, prompt, 4, pad_to=16, use_cache=False,
                                             return_logits=True)
  assert cached == full and len(cached[0]) == 4
  np.testing.assert_allclose(cached_logits, full_logits, atol=1e-5, rtol=1e-5)


def test_zero_new_tokens_generates_nothing_on_either_path():
  cfg = cfg_of()
  params = random_params(cfg)
  for use_cache in (True, False):
    assert decode.greedy_generate(cfg, params, PROMPTS, 0, use_cache=use_cache) == [
        [] for _ in PROMPTS], use_cache


def test_eos_stops_a_row():
  cfg = cfg_of()
  params = random_params(cfg)
  first = decode.greedy_generate(cfg, params, PROMPTS, 6)
  eos = first[0][1]
  out = decode.greedy_generate(cfg, params, PROMPTS, 6, eos_id=eos)
  assert len(out[0]) <= 2
  for row, ref in zip(out, first):  # Each row stops at its own first eos (included).
    stop = ref.index(eos) + 1 if eos in ref else len(ref)
    assert row == ref[:stop]


def test_decode_mode_does_not_change_the_default_forward():
  cfg = cfg_of()
  params = random_params(cfg)
  tokens = jnp.array(PROMPTS[:1], jnp.int32)
  plain = Transformer(cfg).apply({"params": params}, tokens)
  cache = decode.init_cache(cfg, 1, 16)
  cached, _ = Transformer(cfg, decode=True).apply(
      {"params": params, "cache": cache}, tokens, mutable=["cache"])
  np.testing.assert_allclose(cached, plain, atol=1e-6)


FAST_DESIGNS = ("hc", "moda")  # The rest are slow-marked (each ~3-12 s on 2 cores).


@pytest.mark.parametrize("design", [
    d if d in FAST_DESIGNS else pytest.param(d, marks=pytest.mark.slow)
    for d in registry.names() if d != "preln"])
def test_every_design_decodes_like_full_recompute(design):
  """KV caching is exact for every design: the default attend, and MoDA's cached attention.
  Block AttnRes gets 2 blocks: its default 8 at 4 layers are single sublayers (Full AttnRes),
  which never ran a partial sum here."""
  residual = {"name": design, **({"n_blocks": 2} if design == "attnres_block" else {})}
  cfg = cfg_of(n_layers=4, residual=ml_collections.ConfigDict(residual))
  params = random_params(cfg, std=0.2)
  assert decode.supports_kv_cache(cfg)
  out, logits = decode.greedy_generate(cfg, params, PROMPTS, 3, return_logits=True)
  full, full_logits = decode.greedy_generate(cfg, params, PROMPTS, 3, use_cache=False,
                                             return_logits=True)
  assert out == full
  np.testing.assert_allclose(logits, full_logits, atol=2e-5, rtol=1e-5)


def test_an_attend_override_that_does_not_handle_the_cache_decodes_by_recompute(monkeypatch):
  from depthbench_jax.residual import moda
  monkeypatch.setattr(moda.MoDA, "attend_handles_kv_cache", False)
  cfg = cfg_of(residual=MODA)
  assert not decode.supports_kv_cache(cfg)
  params = random_params(cfg)
  with pytest.raises(ValueError, match="overrides attend"):
    decode.greedy_generate(cfg, params, PROMPTS, 3, use_cache=True)
  assert len(decode.greedy_generate(cfg, params, PROMPTS, 3)[0]) == 3  # Recompute by default.


def test_padding_rows_generate_nothing_and_one_token_prompts_decode():
  """``n_real``: the rows after it pad a batch (evals' last batch) and stay empty; a one-token
  prompt decodes the same with and without the cache; an empty prompt is one clear error."""
  cfg = cfg_of()
  params = random_params(cfg)
  real = decode.greedy_generate(cfg, params, [[5, 9]], 3)
  out = decode.greedy_generate(cfg, params, [[5, 9], [5, 9]], 3, n_real=1)
  assert out == [real[0], []] and len(real[0]) == 3
  one = decode.greedy_generate(cfg, params, [[5]], 2)
  assert one == decode.greedy_generate(cfg, params, [[5]], 2, use_cache=False) and len(one[0]) == 2
  with pytest.raises(ValueError, match="at least one token"):
    decode.greedy_generate(cfg, params, [[]], 2)


def test_return_logits_has_one_row_per_step_taken():
  """Logits are [steps, B, V]: no rows for zero new tokens, and once every row has emitted eos
  decoding stops, so a prompt whose first token is eos takes one step (on both paths)."""
  cfg = cfg_of()
  params = random_params(cfg)
  for use_cache in (True, False):
    out, logits = decode.greedy_generate(cfg, params, PROMPTS, 0, use_cache=use_cache,
                                         return_logits=True)
    assert out == [[], [], []] and logits.shape == (0, 3, 61), use_cache
    eos = decode.greedy_generate(cfg, params, [[5, 9]], 4, use_cache=use_cache)[0][0]
    out, logits = decode.greedy_generate(cfg, params, [[5, 9]], 4, eos_id=eos,
                                         use_cache=use_cache, return_logits=True)
    assert out == [[eos]] and logits.shape == (1, 1, 61), use_cache
    assert int(np.argmax(logits[0, 0])) == eos


def test_prompts_pad_to_a_power_of_two_of_at_least_pad_to():
  """The prompt bucket: pad_to itself for prompts up to pad_to tokens (not the next size up),
  then doubling; so a whole eval set compiles a handful of shapes."""
  bucket = decode._pow2_at_least  # pylint: disable=protected-access
  assert [bucket(n, 16) for n in (1, 16, 17, 32, 33)] == [16, 16, 32, 32, 64]
  assert bucket(5, 4) == 8 and bucket(4, 4) == 4


def test_a_prefill_runs_the_lm_head_on_the_read_position_only():
  """The cached step computed logits at all T prompt positions and kept one row: for a
  512-token prefill at 8x512 the head was about half the FLOPs timed as prefill."""
  cfg = cfg_of()
  params = random_params(cfg)
  batch, prompt = 2, 16
  cache = decode.init_cache(cfg, batch, 32)
  tokens = jnp.ones((batch, prompt), jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(prompt, dtype=jnp.int32), (batch, prompt))
  text = decode.cached_step(cfg).lower(params, cache, tokens, positions,
                                       jnp.full((batch,), prompt - 1, jnp.int32)).as_text()
  assert f"tensor<{batch}x{prompt}x61x" not in text and f"tensor<{batch}x1x61xf32>" in text
