"""Tokenizers by name: `get_tokenizer(config.data.tokenizer)`.

- 'gpt2': GPT-2 BPE, 50257 ids, `<|endoftext|>` = 50256 = eos. The merge table is the
  `whisper/assets/gpt2.tiktoken` file that ships in the `openai-whisper` wheel (byte-identical
  to tiktoken's r50k_base). It is found with `importlib.util.find_spec`, which locates the
  package without importing it (importing whisper would import torch).
- 'byte': raw UTF-8 bytes 0..255 plus eos = 256 (vocab 257), for tiny tests.

Every tokenizer has `.encode(str) -> list[int]`, `.encode_batch(list[str]) -> list[list[int]]`,
`.decode(ids) -> str`, `.vocab_size`, `.eos_id` and `.name` (the cache key of tokenized data).
`encode` never emits eos: text that happens to contain "<|endoftext|>" is encoded as plain text;
documents are separated by eos in the pipeline.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import Sequence

from depthbench_jax.errors import ConfigError

# tiktoken's r50k/gpt2 split pattern (equivalent to the original GPT-2 regex, faster).
GPT2_SPLIT_PATTERN = (
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
)
GPT2_EOS = "<|endoftext|>"
GPT2_EOS_ID = 50256
# sha256 of whisper/assets/gpt2.tiktoken == tiktoken's r50k_base.tiktoken.
GPT2_BPE_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"

ALLOWED = ("gpt2", "byte")


def gpt2_bpe_path() -> str:
  """Path of `whisper/assets/gpt2.tiktoken` in the installed openai-whisper wheel."""
  spec = importlib.util.find_spec("whisper")
  if spec is None or not spec.submodule_search_locations:
    raise ConfigError(
        "config.data.tokenizer='gpt2' needs the GPT-2 BPE file from the `openai-whisper` wheel, "
        "which is not installed; install it with `pip install --no-deps openai-whisper`, "
        f"or choose another tokenizer; allowed: {', '.join(ALLOWED)}"
    )
  for location in spec.submodule_search_locations:
    path = os.path.join(location, "assets", "gpt2.tiktoken")
    if os.path.exists(path):
      return path
  raise ConfigError(
      "config.data.tokenizer='gpt2': openai-whisper is installed but has no "
      f"assets/gpt2.tiktoken under {list(spec.submodule_search_locations)}; reinstall it"
  )


class GPT2Tokenizer:
  """GPT-2 BPE through tiktoken, built from the local merge table (no network)."""

  name = "gpt2"
  vocab_size = 50257
  eos_id = GPT2_EOS_ID

  def __init__(self):
    import tiktoken  # pylint: disable=g-import-not-at-top
    from tiktoken.load import load_tiktoken_bpe  # pylint: disable=g-import-not-at-top

    ranks = load_tiktoken_bpe(gpt2_bpe_path(), expected_hash=GPT2_BPE_SHA256)
    self._enc = tiktoken.Encoding(
        name="gpt2_local",
        pat_str=GPT2_SPLIT_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={GPT2_EOS: GPT2_EOS_ID},
        explicit_n_vocab=self.vocab_size,
    )

  def encode(self, text: str) -> list[int]:
    return self._enc.encode_ordinary(text)

  def encode_batch(self, texts: Sequence[str], num_threads: int = 8) -> list[list[int]]:
    return self._enc.encode_ordinary_batch(list(texts), num_threads=num_threads)

  def decode(self, ids: Sequence[int]) -> str:
    return self._enc.decode([int(i) for i in ids])


class ByteTokenizer:
  """UTF-8 bytes: id b for byte b in 0..255, eos = 256; decode renders eos as <|endoftext|>."""

  name = "byte"
  vocab_size = 257
  eos_id = 256

  def encode(self, text: str) -> list[int]:
    return list(text.encode("utf-8"))

  def encode_batch(self, texts: Sequence[str], num_threads: int = 8) -> list[list[int]]:
    del num_threads
    return [self.encode(t) for t in texts]

  def decode(self, ids: Sequence[int]) -> str:
    out, chunk = [], bytearray()
    for i in ids:
      i = int(i)
      if i == self.eos_id:
        out.append(chunk.decode("utf-8", errors="replace"))
        out.append(GPT2_EOS)
        chunk = bytearray()
      elif 0 <= i < 256:
        chunk.append(i)
      else:
        raise ValueError(f"byte tokenizer: id {i} outside 0..256")
    out.append(chunk.decode("utf-8", errors="replace"))
    return "".join(out)


def _tokenizer_class(name: str):
  classes = {"gpt2": GPT2Tokenizer, "byte": ByteTokenizer}
  if name not in classes:
    raise ConfigError(f"config.data.tokenizer={name!r} is unknown; allowed: {', '.join(ALLOWED)}")
  return classes[name]


def vocab_size_of(name: str) -> int:
  """The vocab size of the tokenizer called `name`, without building it: a config check needs
  no merge table (the device image, without openai-whisper, failed train_memory's)."""
  return _tokenizer_class(name).vocab_size


@functools.cache
def get_tokenizer(name: str):
  """Returns the tokenizer called `name` (config.data.tokenizer); one instance per name."""
  return _tokenizer_class(name)()
