"""The grain input pipeline: packed token windows, shuffled by seed, sharded per JAX process.

Packing. Documents are tokenized once into a flat stream (`token_cache`): doc_0 eos doc_1 eos ...
With T = config.data.seq_len, window i is

    window[i] = stream[i*T : i*T + T + 1]        int32 [T+1],   i < (len(stream) - 1) // T

so consecutive windows overlap by one token and every token of stream[1 : n*T + 1] (n windows:
all but the last (len - 1) mod T < T tokens) is a target exactly once per epoch (inputs =
window[:-1], targets = window[1:]). Windows cross document boundaries;
the eos between documents tells the model where one ends.

Order. Windows are permuted by grain's index shuffle with seed config.data.seed (a fresh
permutation each epoch, `seed + epoch`), repeated forever. Global step s takes permuted windows
[s*G, (s+1)*G) for G = config.data.global_batch_size, and process p of P gets every P-th of them
(positions p, p+P, ...): B = G // P rows, so the process batches are disjoint and together are
exactly the single-process global batch, whatever P is. The iterator's state is the index of its
next batch, so resume is exact; it is saved in each orbax checkpoint with `iterator_save_args`.
config.data.worker_count > 0 reads in grain worker processes: the same batches in the same order,
and the same state (`TrainIterator`), so a resume may change the worker count.

Batches are {'tokens': int32 [B, T+1]}.

Validation: the held-out documents (every 20th/100th, see `sources.py`) packed the same way, the
first config.data.val_batches * G windows in order (no shuffle), sharded the same way.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
import time
from typing import Any

from absl import flags
from absl import logging
import grain
import numpy as np

from depthbench_jax.data import sources
from depthbench_jax.data import token_cache
from depthbench_jax.data import tokenizer as tokenizer_lib
from depthbench_jax.data.checks import check_data_config
from depthbench_jax.errors import ConfigError

READ_THREADS = 4
PREFETCH_BATCHES = 8


def cache_dir(data) -> str:
  """config.data.cache_dir if set, else $DEPTHBENCH_CACHE_DIR, else ~/.cache/depthbench_jax; a
  leading ``~`` is the home dir, as in config.data.path (the shell leaves ``--cache_dir=~/c``
  alone: the cache went to ``./~/c`` and a run started elsewhere tokenized everything again)."""
  return os.path.expanduser(data.get("cache_dir") or token_cache.default_cache_dir())


def _process(process_index, process_count) -> tuple[int, int]:
  if process_index is None or process_count is None:
    import jax  # pylint: disable=g-import-not-at-top
    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} outside [0, {process_count})")
  return process_index, process_count


def token_stream(config, split: str, process_index: int = 0, process_count: int = 1,
                 metas: list[dict] | None = None) -> token_cache.TokenStream:
  """The flat token stream of `split` ('train' | 'val'), tokenizing into the cache if needed.

  metas: `shard_metas(config, ...)` when the caller already has them (they are looked up,
  and a tfds builder opened, otherwise).
  """
  if metas is None:
    metas = shard_metas(config, process_index, process_count)
  return token_cache.TokenStream.from_metas(metas, split)


def shard_metas(config, process_index: int = 0, process_count: int = 1) -> list[dict]:
  """The token cache's metas of config.data's shards in shard order, tokenizing any not there.

  The trainer looks them up once and passes them to `train_fingerprint`, `make_train_iterator`
  and `make_val_batches` (each looks them up itself without).
  """
  data = config.data
  tok = tokenizer_lib.get_tokenizer(data.tokenizer)
  shards = sources.shards_for(data)
  return token_cache.tokenize_shards(shards, tok, cache_dir(data), process_index, process_count)


def train_fingerprint(config, process_index: int = 0, process_count: int = 1,
                      metas: list[dict] | None = None) -> dict:
  """What the train windows are cut from, read off the token cache's metas (no token file read):

      {'shards': n, 'train_tokens': sum of their train tokens,
       'shard_keys_sha1': sha1 of the ordered shard keys, 12 hex digits}

  A shard's key changes with its content (`sources`), so adding, removing or rewriting a shard
  of config.data.path changes it: the stream, its window permutation and thus what a saved
  iterator position (the step) points at are another run's. The same on every process.
  seq_len, seed and tokenizer are config fields (`train/config_check.check_resume`).
  """
  if metas is None:
    metas = shard_metas(config, process_index, process_count)
  keys = "\n".join(m["key"] for m in metas)
  return {"shards": len(metas), "train_tokens": sum(int(m["n_tokens"]["train"]) for m in metas),
          "shard_keys_sha1": hashlib.sha1(keys.encode()).hexdigest()[:12]}


class WindowSource:
  """Random-access windows over a token stream: [i] -> int32 [seq_len + 1] (grain source)."""

  def __init__(self, stream: token_cache.TokenStream, seq_len: int):
    self.stream = stream
    self.seq_len = seq_len
    self._len = max(0, (len(stream) - 1) // seq_len)

  def __len__(self) -> int:
    return self._len

  def __getitem__(self, i: int) -> np.ndarray:
    if not 0 <= i < self._len:
      raise IndexError(f"window {i} outside [0, {self._len})")
    start = int(i) * self.seq_len
    return self.stream[start:start + self.seq_len + 1].astype(np.int32)

  def __repr__(self) -> str:
    return f"WindowSource(windows={self._len}, seq_len={self.seq_len})"


def _as_batch(tokens: np.ndarray) -> dict[str, np.ndarray]:
  return {"tokens": tokens}


def train_dataset(config, process_index: int | None = None, process_count: int | None = None,
                  steps: int | None = None, metas: list[dict] | None = None) -> grain.MapDataset:
  """This process's infinite MapDataset of batches {'tokens': int32 [B_local, T+1]}.

  With `steps`, warns when steps * G windows exceed one epoch (the data then repeats).
  """
  process_index, process_count = _process(process_index, process_count)
  data = config.data
  check_data_config(data, process_count)
  windows = WindowSource(token_stream(config, "train", process_index, process_count, metas),
                         data.seq_len)
  if len(windows) == 0:
    raise ConfigError(f"config.data.seq_len={data.seq_len}: the train split of "
                      f"config.data.source={data.source!r} has fewer than seq_len+1 tokens; "
                      "allowed: a shorter seq_len or more data")
  logging.info("train windows: %d of %d+1 tokens (%d tokens)", len(windows), data.seq_len,
               len(windows.stream))
  if steps is not None and steps * data.global_batch_size > len(windows):
    logging.warning("train data: %d steps x global_batch_size=%d = %d windows of %d tokens, but "
                    "the train split of config.data.source=%r (path %r) holds %d: the data "
                    "repeats, %.2f epochs (each reshuffled)", steps, data.global_batch_size,
                    steps * data.global_batch_size, data.seq_len, data.source, data.get("path"),
                    len(windows), steps * data.global_batch_size / len(windows))
  ds = grain.MapDataset.source(windows).shuffle(seed=int(data.seed)).repeat(None)
  ds = ds[process_index::process_count]
  return ds.batch(data.global_batch_size // process_count, drop_remainder=True).map(_as_batch)


def batches_read(state: dict) -> int:
  """The number of batches an iterator state says were read: ``TrainIterator``'s
  {'next_index': n}, or grain's mp_prefetch state (checkpoints written before `TrainIterator`
  with config.data.worker_count > 0): worker w of k read batches w, w + k, ..., so n is the sum
  of its workers' next_index."""
  if "next_index" in state:
    return int(state["next_index"])
  if "iterators_in_use_states" in state:
    return sum(int(s["next_index"]) for s in state["iterators_in_use_states"])
  raise ConfigError(f"data iterator state {sorted(state)} is not a depthbench_jax train "
                    "iterator's; allowed: a checkpoint written by python -m depthbench_jax.main")


PARENT_POLL_S = 1.0


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass
  return True


def exit_with_parent(trainer_pid: int, worker_index: int = 0, worker_count: int = 1) -> None:
  """grain worker init: a daemon thread ends this worker (``os._exit``) within PARENT_POLL_S of
  its parent process changing (the trainer, which grain's spawn starts it from, ended: it is
  reparented) or of ``trainer_pid`` ending. A trainer killed with SIGKILL (the OOM killer) left
  its workers blocked on the batch queue forever, holding their memory."""
  del worker_index, worker_count
  parent = os.getppid()

  def watch():
    while os.getppid() == parent and _alive(trainer_pid):
      time.sleep(PARENT_POLL_S)
    os._exit(1)  # pylint: disable=protected-access
  threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


class TrainIterator(grain.DatasetIterator):
  """Batches of ``ds`` (a `train_dataset`) in order, read in ``worker_count`` worker processes
  (grain mp_prefetch; 0: in this one); checkpointable.

  Its state is {'next_index': n}, n batches read, whatever the worker count: grain's own
  mp_prefetch state is per worker, which no iterator of another worker count can restore, so
  a run could not resume with another config.data.worker_count. Restored, it reads ds[n:].
  """

  def __init__(self, ds: grain.MapDataset, worker_count: int):
    super().__init__()
    self._ds, self._worker_count = ds, worker_count
    self._next, self._inner = 0, None

  def _start(self) -> None:
    ds = self._ds[self._next:] if self._next else self._ds
    it_ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=READ_THREADS,
                                                 prefetch_buffer_size=PREFETCH_BATCHES))
    if self._worker_count > 0:
      if not flags.FLAGS.is_parsed():  # grain's workers read absl flags; outside absl.app.run
        flags.FLAGS.mark_as_parsed()   # (tests, notebooks) use their defaults
      it_ds = it_ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=self._worker_count),
                                worker_init_fn=functools.partial(exit_with_parent, os.getpid()))
    self._inner = iter(it_ds)

  def __next__(self) -> dict[str, np.ndarray]:
    if self._inner is None:
      self._start()
    batch = next(self._inner)
    self._next += 1
    return batch

  def get_state(self) -> dict[str, int]:
    return {"next_index": self._next}

  def set_state(self, state: dict) -> None:
    self.close()
    self._next = batches_read(state)

  def start_prefetch(self) -> None:
    if self._inner is None:
      self._start()
    self._inner.start_prefetch()

  def close(self) -> None:
    if self._inner is not None:
      self._inner.close()
      self._inner = None


def make_train_iterator(config, process_index: int | None = None,
                        process_count: int | None = None,
                        steps: int | None = None,
                        metas: list[dict] | None = None) -> TrainIterator:
  """Iterator over this process's train batches; checkpointable (`get_state`/`set_state`).

  process_index/process_count default to jax.process_index()/jax.process_count().
  config.data.worker_count > 0 reads in that many worker processes (grain mp_prefetch).
  steps: the run's length, to warn when it takes more than one epoch of the data.
  metas: `shard_metas`, if the caller has them.
  """
  ds = train_dataset(config, process_index, process_count, steps, metas)
  return TrainIterator(ds, config.data.worker_count)


def make_val_batches(config, process_index: int | None = None,
                     process_count: int | None = None,
                     metas: list[dict] | None = None) -> list[dict[str, np.ndarray]]:
  """config.data.val_batches batches {'tokens': int32 [B_local, T+1]} of held-out text.

  The same for every call (no shuffle). If the held-out split has fewer than
  val_batches * global_batch_size windows, windows repeat (with a warning).
  """
  process_index, process_count = _process(process_index, process_count)
  data = config.data
  check_data_config(data, process_count)
  if data.val_batches == 0:
    return []
  windows = WindowSource(token_stream(config, "val", process_index, process_count, metas),
                         data.seq_len)
  if len(windows) == 0:
    raise ConfigError(f"config.data.seq_len={data.seq_len}: the held-out split of "
                      f"config.data.source={data.source!r} has fewer than seq_len+1 tokens; "
                      "allowed: a shorter seq_len, config.data.val_batches=0, or more data")
  g = data.global_batch_size
  needed = data.val_batches * g
  if needed > len(windows):
    logging.warning("validation: %d windows requested (val_batches=%d x global_batch_size=%d) "
                    "but the held-out split has %d; windows repeat", needed, data.val_batches, g,
                    len(windows))
  batches = []
  for b in range(data.val_batches):
    rows = np.arange(b * g, (b + 1) * g)[process_index::process_count] % len(windows)
    batches.append(_as_batch(np.stack([windows[int(i)] for i in rows])))
  return batches


def iterator_save_args(iterator) -> Any:
  """orbax args saving the iterator's state: `ocp.args.Composite(..., data=this)`."""
  return grain.checkpoint.CheckpointSave(iterator)


def iterator_restore_args(iterator) -> Any:
  """orbax args restoring state into `iterator` (a fresh `make_train_iterator`) in place."""
  return grain.checkpoint.CheckpointRestore(iterator)
