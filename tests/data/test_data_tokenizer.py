import sys

import pytest

from depthbench_jax.data import tokenizer as tokenizer_lib
from depthbench_jax.errors import ConfigError


def test_gpt2_known_ids_and_roundtrip():
  tok = tokenizer_lib.get_tokenizer("gpt2")
  assert tok.encode("Hello world") == [15496, 995]
  assert (tok.vocab_size, tok.eos_id) == (50257, 50256)
  text = "The Ἀτλαντὶς sea, naïve café — 1234 tokens!\n\n  indented"
  assert tok.decode(tok.encode(text)) == text
  assert tok.decode([tok.eos_id]) == "<|endoftext|>"
  # Text that spells the special token is encoded as plain text, never as eos.
  assert tok.eos_id not in tok.encode("a<|endoftext|>b")
  assert tok.encode_batch(["Hello world", "x"]) == [[15496, 995], tok.encode("x")]


def test_gpt2_asset_found_without_importing_whisper():
  tokenizer_lib.get_tokenizer("gpt2")
  assert tokenizer_lib.gpt2_bpe_path().endswith("whisper/assets/gpt2.tiktoken")
  assert "whisper" not in sys.modules


def test_byte_roundtrip():
  tok = tokenizer_lib.get_tokenizer("byte")
  assert (tok.vocab_size, tok.eos_id) == (257, 256)
  text = "héllo wörld"
  ids = tok.encode(text)
  assert max(ids) < 256 and tok.decode(ids) == text
  assert tok.decode(tok.encode("a") + [256] + tok.encode("b")) == "a<|endoftext|>b"


def test_unknown_tokenizer_names_field_and_allowed():
  with pytest.raises(ConfigError, match=r"config\.data\.tokenizer.*allowed: gpt2, byte"):
    tokenizer_lib.get_tokenizer("sentencepiece")
