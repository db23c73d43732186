"""Shared bits of the eval tests: the fixture dir, a byte tokenizer, a tiny model config."""

import os

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


class ByteTok:
  """UTF-8 bytes 0..255, eos = 256 (vocab 257); defined here so the tests need no data module."""
  name, vocab_size, eos_id = "byte", 257, 256

  def encode(self, text):
    return list(text.encode("utf-8"))

  def decode(self, ids):
    return bytes(i for i in ids if i < 256).decode("utf-8", "replace")


def tiny_model_cfg(**overrides):
  from configs.base import get_config
  from depthbench_jax.model.config import model_config_from
  m = get_config().model
  m.vocab_size, m.d_model, m.n_layers, m.n_heads, m.ffn_dim = 257, 32, 1, 2, 64
  m.remat_policy, m.max_seq_len = "none", 512
  for k, v in overrides.items():
    setattr(m, k, v)
  return model_config_from(m)
