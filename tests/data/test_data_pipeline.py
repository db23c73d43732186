import gc
import logging
import pickle

import numpy as np
import orbax.checkpoint as ocp
import pytest

from depthbench_jax.data import pipeline
from depthbench_jax.errors import ConfigError


def take(it, n):
  return [next(it)["tokens"] for _ in range(n)]


def test_batch_shape_dtype_and_windows(make_config):
  config = make_config(seq_len=64, global_batch_size=8)
  batch = next(pipeline.make_train_iterator(config, 0, 1))
  assert set(batch) == {"tokens"}
  tokens = batch["tokens"]
  assert tokens.shape == (8, 65) and tokens.dtype == np.int32
  assert tokens.min() >= 0 and tokens.max() < 50257
  # Every row is a window stream[i*T : i*T+T+1] of the train stream.
  stream = pipeline.token_stream(config, "train")
  windows = pipeline.WindowSource(stream, 64)
  assert len(windows) == (len(stream) - 1) // 64
  assert np.array_equal(windows[1], stream[64:129])
  assert windows[0][-1] == windows[1][0]  # stride T: consecutive windows share one token
  row = tokens[0]
  starts = [i for i in range(len(windows)) if windows[i][0] == row[0]]
  assert any(np.array_equal(windows[i], row) for i in starts)


def test_deterministic_from_seed(make_config):
  a = take(pipeline.make_train_iterator(make_config(seed=3), 0, 1), 4)
  b = take(pipeline.make_train_iterator(make_config(seed=3), 0, 1), 4)
  c = take(pipeline.make_train_iterator(make_config(seed=4), 0, 1), 4)
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def rows(batch):
  return {r.tobytes() for r in batch}


@pytest.mark.parametrize("process_count", [2, 4])
def test_process_shards_disjoint_and_cover_global_batch(make_config, process_count):
  config = make_config(global_batch_size=8)
  steps = 3
  whole = take(pipeline.make_train_iterator(config, 0, 1), steps)
  parts = [take(pipeline.make_train_iterator(config, p, process_count), steps)
           for p in range(process_count)]
  for s in range(steps):
    local = [parts[p][s] for p in range(process_count)]
    assert all(x.shape == (8 // process_count, 65) for x in local)
    sets = [rows(x) for x in local]
    assert sum(map(len, sets)) == len(set().union(*sets))  # disjoint
    assert set().union(*sets) == rows(whole[s])  # together: the global batch of that step


def test_epochs_reshuffle_and_repeat_forever(make_config):
  config = make_config(seq_len=4096, global_batch_size=8)
  n_windows = len(pipeline.WindowSource(pipeline.token_stream(config, "train"), 4096))
  steps = 2 * n_windows // 8 + 2
  batches = take(pipeline.make_train_iterator(config, 0, 1), steps)
  flat = np.concatenate(batches)
  epoch0, epoch1 = flat[:n_windows], flat[n_windows:2 * n_windows]
  assert rows(epoch0) == rows(epoch1) and len(rows(epoch0)) == n_windows
  assert not np.array_equal(epoch0, epoch1)
  # Epoch e is permuted with data.seed + e (README): data.seed=1 reads seed 0's epoch 1 first.
  seed1 = np.concatenate(take(pipeline.make_train_iterator(
      make_config(seq_len=4096, global_batch_size=8, seed=1), 0, 1), -(-n_windows // 8)))
  assert np.array_equal(seed1[:n_windows], epoch1)



def test_a_run_longer_than_one_epoch_warns_with_the_epoch_count(make_config, caplog):
  """A budget of more tokens than the train split holds (the 1.6B suite's 20 tokens per
  parameter on FineWeb-Edu's sample/10BT) repeats the data, as documented; it did so silently."""
  config = make_config(seq_len=4096, global_batch_size=8)
  n_windows = len(pipeline.WindowSource(pipeline.token_stream(config, "train"), 4096))
  one_epoch = n_windows // 8
  with caplog.at_level(logging.WARNING):
    pipeline.make_train_iterator(config, 0, 1, steps=one_epoch)
  assert "repeats" not in caplog.text
  with caplog.at_level(logging.WARNING):
    pipeline.make_train_iterator(config, 0, 1, steps=3 * one_epoch)
  epochs = 3 * one_epoch * 8 / n_windows
  assert f"the data repeats, {epochs:.2f} epochs" in caplog.text, caplog.text

def test_resume_with_get_and_set_state(make_config):
  config = make_config()
  it = pipeline.make_train_iterator(config, 0, 1)
  take(it, 5)
  state = it.get_state()
  expected = take(it, 2)
  fresh = pipeline.make_train_iterator(config, 0, 1)
  fresh.set_state(state)
  assert all(np.array_equal(x, y) for x, y in zip(take(fresh, 2), expected))


def test_resume_with_orbax_checkpoint_manager(make_config, tmp_path):
  config = make_config()
  it = pipeline.make_train_iterator(config, 0, 1)
  take(it, 3)
  mngr = ocp.CheckpointManager(tmp_path / "checkpoints")
  mngr.save(3, args=ocp.args.Composite(
      state=ocp.args.StandardSave({"w": np.arange(4.0)}),
      data=pipeline.iterator_save_args(it)))
  mngr.wait_until_finished()
  expected = take(it, 2)
  mngr.close()

  fresh = pipeline.make_train_iterator(config, 0, 1)
  mngr = ocp.CheckpointManager(tmp_path / "checkpoints")
  restored = mngr.restore(mngr.latest_step(), args=ocp.args.Composite(
      state=ocp.args.StandardRestore({"w": np.zeros(4)}),
      data=pipeline.iterator_restore_args(fresh)))
  mngr.close()
  assert np.array_equal(restored["state"]["w"], np.arange(4.0))
  assert all(np.array_equal(x, y) for x, y in zip(take(fresh, 2), expected))


def test_worker_processes_give_the_same_batches_and_states(make_config):
  """config.data.worker_count = 2 (the suites read in workers) reads the batches of 0 in the same
  order and keeps the same state: resumed at batch 3 of a 0-worker iterator, the workers read
  batches 3, 4, and their state resumes a 0-worker iterator at batch 5. grain's own per-worker
  mp_prefetch state restored no iterator of another worker count (KeyError), so a run could not
  resume with another worker count. (One worker start: each costs seconds.)"""
  in_process = pipeline.make_train_iterator(make_config(worker_count=0), 0, 1)
  want = take(in_process, 6)
  it = pipeline.make_train_iterator(make_config(worker_count=2), 0, 1)
  it.set_state({"next_index": 3})
  assert all(np.array_equal(x, y) for x, y in zip(take(it, 2), want[3:5]))
  assert it.get_state() == {"next_index": 5}
  in_process.set_state(it.get_state())
  assert np.array_equal(take(in_process, 1)[0], want[5])
  it.close()
  del it
  gc.collect()


def test_grain_worker_state_of_older_checkpoints_resumes(make_config):
  """Checkpoints of worker_count = k > 0 from before `TrainIterator` hold grain's mp_prefetch
  state: worker w read batches w, w + k, ..., so 3 + 2 of them is batch 5 next."""
  legacy = {"next_index_in_cycle": 1, "next_index_in_datasets": 2,
            "iterators_in_use_indices": [0, 1],
            "iterators_in_use_states": [{"next_index": 3}, {"next_index": 2}],
            "exhausted": [0, 0], "future_states": {}}
  assert pipeline.batches_read(legacy) == 5
  want = take(pipeline.make_train_iterator(make_config(), 0, 1), 6)[5]
  it = pipeline.make_train_iterator(make_config(), 0, 1)
  it.set_state(legacy)
  assert np.array_equal(take(it, 1)[0], want)
  with pytest.raises(ConfigError, match="not a depthbench_jax train iterator"):
    pipeline.batches_read({"position": 5})


def test_val_batches_fixed_sharded_and_held_out(make_config):
  config = make_config(val_batches=3, global_batch_size=8)
  val = pipeline.make_val_batches(config, 0, 1)
  assert len(val) == 3 and val[0]["tokens"].shape == (8, 65)
  again = pipeline.make_val_batches(config, 0, 1)
  assert all(np.array_equal(x["tokens"], y["tokens"]) for x, y in zip(val, again))
  halves = [pipeline.make_val_batches(config, p, 2) for p in range(2)]
  for b in range(3):   # Each process holds half the rows, none of the other's.
    assert [h[b]["tokens"].shape for h in halves] == [(4, 65), (4, 65)]
    assert not rows(halves[0][b]["tokens"]) & rows(halves[1][b]["tokens"])
    assert rows(halves[0][b]["tokens"]) | rows(halves[1][b]["tokens"]) == rows(val[b]["tokens"])
  # Held-out windows come from the val stream, not the train stream.
  val_stream = pipeline.token_stream(config, "val")
  assert np.array_equal(val[0]["tokens"][0], val_stream[0:65])
  # All of them: the first 3 x 8 windows of 64 + 1 tokens in order, each once (only row 0 of
  # batch 0 was read: batches overlapping by 7 windows passed).
  n = (len(val_stream) - 1) // 64
  want = np.stack([val_stream[(i % n) * 64:(i % n) * 64 + 65] for i in range(3 * 8)])
  assert np.array_equal(np.concatenate([v["tokens"] for v in val]), want)
  assert pipeline.make_val_batches(make_config(val_batches=0), 0, 1) == []


def test_val_windows_repeat_in_order_when_the_held_out_split_is_short(make_config, caplog):
  """More rows than held-out windows: row i is window i mod n, with a warning. No test read
  past the split's end (n was ~600 windows, 24 read), so dropping the modulo, which raises an
  IndexError there, passed."""
  stream = pipeline.token_stream(make_config(seq_len=1024), "val")
  n = (len(stream) - 1) // 1024
  config = make_config(seq_len=1024, val_batches=n // 8 + 2)
  with caplog.at_level("WARNING"):
    val = pipeline.make_val_batches(config, 0, 1)
  rows_read = (n // 8 + 2) * 8
  assert rows_read > n
  want = np.stack([stream[(i % n) * 1024:(i % n) * 1024 + 1025] for i in range(rows_read)])
  assert np.array_equal(np.concatenate([v["tokens"] for v in val]), want)
  assert f"but the held-out split has {n}; windows repeat" in caplog.text


def test_metas_looked_up_once_serve_fingerprint_iterator_and_val(make_config, monkeypatch):
  """The trainer looks the shards up once (a tfds builder, a parquet footer hash per shard) and
  hands the metas on: given them, no entry point looks again, and the batches are the same."""
  config = make_config(val_batches=2, global_batch_size=8)
  want_train = take(pipeline.make_train_iterator(config, 0, 1), 2)
  want_val = pipeline.make_val_batches(config, 0, 1)
  want_fingerprint = pipeline.train_fingerprint(config)
  metas = pipeline.shard_metas(config)

  def looked_up_again(*args):
    raise AssertionError("shards looked up again")

  monkeypatch.setattr(pipeline.sources, "shards_for", looked_up_again)
  assert pipeline.train_fingerprint(config, metas=metas) == want_fingerprint
  got_train = take(pipeline.make_train_iterator(config, 0, 1, metas=metas), 2)
  got_val = pipeline.make_val_batches(config, 0, 1, metas=metas)
  assert all(np.array_equal(x, y) for x, y in zip(got_train, want_train))
  assert all(np.array_equal(x["tokens"], y["tokens"]) for x, y in zip(got_val, want_val))
  with pytest.raises(AssertionError, match="looked up again"):
    pipeline.make_val_batches(config, 0, 1)


def test_window_source_pickles_without_data(make_config):
  windows = pipeline.WindowSource(pipeline.token_stream(make_config(), "train"), 64)
  windows[0]  # opens the memmaps
  blob = pickle.dumps(windows)
  assert len(blob) < 10_000
  assert np.array_equal(pickle.loads(blob)[7], windows[7])


@pytest.mark.parametrize("field,value,pattern", [
    ("source", "hdf5", r"config\.data\.source='hdf5'.*allowed: embedded, parquet, tfds"),
    ("tokenizer", "t5", r"config\.data\.tokenizer='t5'.*allowed: gpt2, byte"),
    ("seq_len", 0, r"config\.data\.seq_len=0.*allowed"),
    ("global_batch_size", 6, r"config\.data\.global_batch_size=6.*multiple of 4"),
    ("seed", -1, r"config\.data\.seed=-1.*allowed"),
    ("worker_count", -2, r"config\.data\.worker_count=-2.*allowed"),
])
def test_bad_config_fields_named(make_config, field, value, pattern):
  with pytest.raises(ConfigError, match=pattern):
    pipeline.make_train_iterator(make_config(**{field: value}), 0, 4)


def test_seq_len_longer_than_val_split_is_a_config_error(make_config):
  with pytest.raises(ConfigError, match=r"config\.data\.seq_len"):
    pipeline.make_val_batches(make_config(seq_len=10**6), 0, 1)


def test_missing_field_is_named(make_config):
  config = make_config()
  del config.data["val_batches"]
  with pytest.raises(ConfigError, match=r"config\.data\.val_batches=None"):
    pipeline.make_val_batches(config, 0, 1)
