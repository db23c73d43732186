"""Tokenize each shard of documents once, to flat memmapped token files in a cache dir.

Why this shape. The pipeline needs random access (grain shuffles windows by index, and resuming
is then one integer) and FineWeb-Edu needs streaming (10B tokens do not fit a list of str). So
each *shard* (a parquet file, a range of TFDS records, the embedded corpus) is streamed through
the tokenizer once, in chunks of `DOCS_PER_CHUNK` documents, and appended to two raw token files:

    CACHE/<tokenizer>/<shard.key>.train.bin   uint16 (vocab <= 65536) or uint32
    CACHE/<tokenizer>/<shard.key>.val.bin     each document's ids followed by eos
    CACHE/<tokenizer>/<shard.key>.json        {n_tokens, n_docs, dtype}; written last = done

Document d of a shard goes to val iff `d % shard.val_every == shard.val_every - 1`. Files are
written under a temporary name and renamed, so concurrent processes (several hosts on one shared
filesystem, or a sweep launching runs together) may tokenize a shard more than once (each
process that reaches it unfinished) and never read a partial file. Each JAX process starts at
a different shard (rotated by process index), so on a shared filesystem the processes split
the work; on separate disks each does all of it. The cache
is shared by every run with the same tokenizer, so a sweep pays for tokenization once (or run
`python -m depthbench_jax.data.prepare` before it).

`TokenStream` is the read side: the virtual concatenation of many token files, opened lazily as
read-only memmaps (so it pickles cheaply into grain worker processes), sliced by global offset.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
import uuid
from typing import Callable, Iterator, Sequence

from absl import logging
import numpy as np

from depthbench_jax.data import corpus
from depthbench_jax.errors import ConfigError

DOCS_PER_CHUNK = 1024
SPLITS = ("train", "val")


@dataclasses.dataclass(frozen=True)
class Shard:
  """A unit of tokenization and caching.

  key: filesystem-safe, unique, and changes when the content changes (it names the cache files).
  description: what a person reads in logs and errors (a path, a TFDS split slice).
  read: () -> iterator of documents (str) in a fixed order.
  val_every: every `val_every`-th document of the shard is held out for validation.
  """
  key: str
  description: str
  read: Callable[[], Iterator[str]]
  val_every: int


def default_cache_dir() -> str:
  """$DEPTHBENCH_CACHE_DIR, else ~/.cache/depthbench_jax (a variable set empty, as a launch
  script's ``DEPTHBENCH_CACHE_DIR=`` leaves it, is unset: '' put the cache in the cwd)."""
  return (os.environ.get("DEPTHBENCH_CACHE_DIR")
          or os.path.join(os.path.expanduser("~"), ".cache", "depthbench_jax"))


def token_dtype(vocab_size: int) -> np.dtype:
  return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def _paths(cache_dir: str, tokenizer_name: str, key: str) -> dict[str, str]:
  root = os.path.join(cache_dir, tokenizer_name)
  return {
      "meta": os.path.join(root, f"{key}.json"),
      "train": os.path.join(root, f"{key}.train.bin"),
      "val": os.path.join(root, f"{key}.val.bin"),
  }


def _read_meta(path: str) -> dict | None:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, json.JSONDecodeError):  # absent, or a cache dir that is not a directory
    return None


def _temp_suffix() -> str:
  """This writer's temporary-file suffix, `.tmp-<host>-<pid>-<random>`: host and PID let a later
  writer tell a dead writer's leftovers from a live one's (`_remove_dead_writers_files`)."""
  return f".tmp-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _is_running(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # Another user's process.
    return True
  return True


# A temporary file untouched this long has no live writer (one appends a chunk every few
# seconds): the PID test alone deleted a live writer's files from a container that shares the
# node's hostname (Kubernetes hostNetwork) but not its PID namespace.
STALE_TEMP_S = 600.0


def _remove_dead_writers_files(paths: dict[str, str]) -> None:
  """Deletes this shard's temporary files whose writer ran on this host and is gone (a kill -9
  mid-shard left them; a FineWeb-Edu shard's are GBs), once untouched for ``STALE_TEMP_S``.
  Another host's are left alone: its PID means nothing here, and on a shared filesystem it may
  still be writing."""
  root = os.path.dirname(paths["meta"])
  prefix_of = {os.path.basename(p) + ".tmp-": p for p in paths.values()}
  host = socket.gethostname()
  for name in os.listdir(root):
    for prefix in prefix_of:
      if not name.startswith(prefix):
        continue
      writer, _, _ = name[len(prefix):].rpartition("-")
      writer_host, _, pid = writer.rpartition("-")
      if writer_host == host and pid.isdigit() and not _is_running(int(pid)) and _stale(
          os.path.join(root, name)):
        try:
          os.remove(os.path.join(root, name))
          logging.warning("token cache: removed %s, left by a writer no longer running", name)
        except FileNotFoundError:  # Another process removed it first.
          pass


def _stale(path: str) -> bool:
  try:
    return time.time() - os.path.getmtime(path) > STALE_TEMP_S
  except FileNotFoundError:  # renamed or removed meanwhile
    return False


def _files_match(meta: dict, paths: dict[str, str]) -> bool:
  """Whether each split's token file holds exactly the meta's n_tokens ids (a copy of the cache
  cut short leaves the .json, copied first, with a short or missing .bin)."""
  try:
    itemsize = np.dtype(meta["dtype"]).itemsize
    return all(os.path.getsize(paths[s]) == meta["n_tokens"][s] * itemsize for s in SPLITS)
  except (OSError, KeyError, TypeError):
    return False


def tokenize_shard(shard: Shard, tokenizer, cache_dir: str) -> dict:
  """Tokenizes `shard` into the cache unless it is there already; returns its meta dict.

  meta = {'key', 'description', 'dtype', 'val_every', 'n_docs': {split: int},
          'n_tokens': {split: int}, 'paths': {split: str}}. A meta whose token files are not
  n_tokens long, or whose documents were held out by another ``val_every``, is tokenized again
  (the key does not name the split rule: a changed one would otherwise mix train and val).
  """
  paths = _paths(cache_dir, tokenizer.name, shard.key)
  meta = _read_meta(paths["meta"])
  # A meta without val_every predates the field; the rule then was the one the key names.
  same_split = meta is not None and meta.get("val_every", shard.val_every) == shard.val_every
  if meta is not None and same_split and _files_match(meta, paths):
    return meta | {"paths": {s: paths[s] for s in SPLITS}}
  if meta is not None:
    logging.warning("token cache of %s is %s (%s): tokenizing it again", shard.description,
                    "incomplete" if same_split else
                    f"held out every {meta['val_every']}th document, now every "
                    f"{shard.val_every}th", paths["meta"])
  dtype = token_dtype(tokenizer.vocab_size)
  tag = _temp_suffix()
  try:
    os.makedirs(os.path.dirname(paths["meta"]), exist_ok=True)
    _remove_dead_writers_files(paths)
    files = {s: open(paths[s] + tag, "wb") for s in SPLITS}
  except OSError as e:
    # The dir as resolved (pipeline.cache_dir): the field, the variable or the default.
    raise ConfigError(f"the token cache dir {cache_dir!r} (config.data.cache_dir, else "
                      f"$DEPTHBENCH_CACHE_DIR, else ~/.cache/depthbench_jax) cannot be written "
                      f"({e}); allowed: a writable directory") from e
  n_docs = {s: 0 for s in SPLITS}
  n_tokens = {s: 0 for s in SPLITS}
  start = time.time()
  doc_index = 0
  try:
    chunk: list[str] = []

    def flush():
      nonlocal doc_index
      for ids in tokenizer.encode_batch(chunk, num_threads=os.cpu_count() or 1):
        split = "val" if corpus.is_val_document(doc_index, shard.val_every) else "train"
        arr = np.asarray(ids + [tokenizer.eos_id], dtype=dtype)
        files[split].write(arr.tobytes())
        n_docs[split] += 1
        n_tokens[split] += arr.size
        doc_index += 1
      chunk.clear()

    for doc in shard.read():
      chunk.append(doc)
      if len(chunk) >= DOCS_PER_CHUNK:
        flush()
    flush()
  except BaseException:
    for s in SPLITS:
      files[s].close()
      os.remove(paths[s] + tag)
    raise
  for s in SPLITS:
    files[s].close()
    os.replace(paths[s] + tag, paths[s])
  meta = {"key": shard.key, "description": shard.description, "dtype": dtype.name,
          "tokenizer": tokenizer.name, "val_every": shard.val_every, "n_docs": n_docs,
          "n_tokens": n_tokens}
  with open(paths["meta"] + tag, "w") as f:
    json.dump(meta, f, indent=1)
  os.replace(paths["meta"] + tag, paths["meta"])
  logging.info("tokenized %s: %s tokens, %s docs in %.1fs", shard.description, n_tokens,
               n_docs, time.time() - start)
  return meta | {"paths": {s: paths[s] for s in SPLITS}}


def tokenize_shards(shards: Sequence[Shard], tokenizer, cache_dir: str,
                    process_index: int = 0, process_count: int = 1) -> list[dict]:
  """Makes sure every shard is in the cache; returns the metas in shard order.

  Process p starts at shard p * len(shards) // process_count and wraps around, re-checking
  the cache before each shard, so processes sharing a filesystem divide the work.
  """
  n = len(shards)
  first = (process_index * n) // max(process_count, 1)
  metas: dict[int, dict] = {}
  for j in range(n):
    i = (first + j) % n
    metas[i] = tokenize_shard(shards[i], tokenizer, cache_dir)
  return [metas[i] for i in range(n)]


class TokenStream:
  """Virtual concatenation of token files: `stream[a:b]` -> np.ndarray of token ids.

  Files open lazily as read-only memmaps; pickling keeps only paths and lengths.
  """

  def __init__(self, paths: Sequence[str], lengths: Sequence[int], dtype: str):
    keep = [(p, int(n)) for p, n in zip(paths, lengths) if n > 0]
    self.paths = [p for p, _ in keep]
    self.lengths = np.asarray([n for _, n in keep], dtype=np.int64)
    self.offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
    self.dtype = np.dtype(dtype)
    self._maps: list[np.memmap] | None = None

  @classmethod
  def from_metas(cls, metas: Sequence[dict], split: str) -> "TokenStream":
    dtypes = {m["dtype"] for m in metas}
    if len(dtypes) > 1:
      raise ValueError(f"token files with mixed dtypes {dtypes}")
    return cls([m["paths"][split] for m in metas], [m["n_tokens"][split] for m in metas],
               dtypes.pop() if dtypes else "uint16")

  def __getstate__(self):
    return {k: v for k, v in self.__dict__.items() if k != "_maps"} | {"_maps": None}

  def _open(self) -> list[np.memmap]:
    if self._maps is None:
      self._maps = [np.memmap(p, dtype=self.dtype, mode="r", shape=(int(n),))
                    for p, n in zip(self.paths, self.lengths)]
    return self._maps

  def __len__(self) -> int:
    return int(self.offsets[-1])

  def __getitem__(self, s: slice) -> np.ndarray:
    start, stop, step = s.indices(len(self))
    if step != 1:
      raise ValueError("TokenStream supports contiguous slices only")
    maps = self._open()
    parts = []
    f = int(np.searchsorted(self.offsets, start, side="right")) - 1
    while start < stop:
      lo = start - int(self.offsets[f])
      hi = min(stop, int(self.offsets[f + 1])) - int(self.offsets[f])
      parts.append(maps[f][lo:hi])
      start += hi - lo
      f += 1
    if not parts:
      return np.zeros((0,), self.dtype)
    return parts[0].copy() if len(parts) == 1 else np.concatenate(parts)
