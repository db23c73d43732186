import os
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from depthbench_jax.data import pipeline
from depthbench_jax.data import sources
from depthbench_jax.data import token_cache
from depthbench_jax.data import tokenizer as tokenizer_lib
from depthbench_jax.errors import ConfigError
from tests.helpers import fineweb_like


@pytest.fixture
def parquet_dir(tmp_path):
  d = tmp_path / "fineweb-edu" / "sample"
  d.mkdir(parents=True)
  pq.write_table(fineweb_like(150, 0), d / "000_00000.parquet", row_group_size=64)
  pq.write_table(fineweb_like(120, 150), d / "001_00000.parquet", row_group_size=64)
  return d


def test_parquet_reads_text_column_in_order(parquet_dir):
  docs = list(sources.parquet_documents(str(parquet_dir / "000_00000.parquet")))
  assert len(docs) == 150 and docs[0].startswith("Document 0:") and docs[149].startswith("Document 149:")
  # Directory, glob and single file all name the same sorted shards.
  files = sources.parquet_files(str(parquet_dir))
  assert [os.path.basename(f) for f in files] == ["000_00000.parquet", "001_00000.parquet"]
  assert sources.parquet_files(str(parquet_dir / "*.parquet")) == files


def test_parquet_pipeline_end_to_end(make_config, parquet_dir):
  config = make_config(source="parquet", path=str(parquet_dir), tokenizer="byte", seq_len=32,
                       global_batch_size=4, val_batches=1)
  tokens = next(pipeline.make_train_iterator(config, 0, 1))["tokens"]
  assert tokens.shape == (4, 33) and tokens.max() <= 256
  stream = pipeline.token_stream(config, "train")
  text = tokenizer_lib.get_tokenizer("byte").decode(stream[0:len(stream)])
  docs = text.split("<|endoftext|>")[:-1]
  assert len(docs) == 270 - 2  # held out: document 99 of each shard (every 100th)
  assert docs[0].startswith("Document 0:") and docs[-1].startswith("Document 269:")
  assert not any(d.startswith("Document 99:") for d in docs)
  val = pipeline.token_stream(config, "val")
  val_docs = tokenizer_lib.get_tokenizer("byte").decode(val[0:len(val)]).split("<|endoftext|>")
  assert [d.split(":")[0] for d in val_docs[:-1]] == ["Document 99", "Document 249"]
  assert pipeline.make_val_batches(config, 0, 1)[0]["tokens"].shape == (4, 33)


def test_parquet_cache_key_follows_content(parquet_dir):
  before = [s.key for s in sources.parquet_shards(str(parquet_dir))]
  pq.write_table(fineweb_like(151, 0), parquet_dir / "000_00000.parquet")
  after = [s.key for s in sources.parquet_shards(str(parquet_dir))]
  assert before[0] != after[0] and before[1] == after[1]
  # Other text of the same byte size (the rewrite above changed the size too: a key of the
  # size alone passed, and the cache would have served the old tokens).
  keys = []
  for text in ("x" * 500, "y" * 500):
    pq.write_table(pa.table({"text": [text]}), parquet_dir / "000_00000.parquet",
                   compression="none")
    keys.append((os.path.getsize(parquet_dir / "000_00000.parquet"),
                 sources.parquet_shards(str(parquet_dir))[0].key))
  assert keys[0][0] == keys[1][0] and keys[0][1] != keys[1][1]


def test_train_fingerprint_follows_the_shards_not_the_directory(make_config, parquet_dir,
                                                                tmp_path):
  """Every process computes the same one; the shards moved elsewhere keep it; a shard added or
  rewritten changes it (a resume on it would read another window permutation)."""
  config = make_config(source="parquet", path=str(parquet_dir), tokenizer="byte")
  first = pipeline.train_fingerprint(config)
  assert first["shards"] == 2
  assert first["train_tokens"] == len(pipeline.token_stream(config, "train"))
  assert pipeline.train_fingerprint(config, 1, 2) == first
  moved = tmp_path / "elsewhere"
  parquet_dir.rename(moved)
  assert pipeline.train_fingerprint(make_config(source="parquet", path=str(moved),
                                                tokenizer="byte")) == first
  pq.write_table(fineweb_like(10, 270), moved / "002_00000.parquet")
  config = make_config(source="parquet", path=str(moved), tokenizer="byte")
  added = pipeline.train_fingerprint(config)
  assert added["shards"] == 3 and added["train_tokens"] > first["train_tokens"]
  pq.write_table(fineweb_like(151, 0), moved / "000_00000.parquet")
  os.remove(moved / "002_00000.parquet")
  rewritten = pipeline.train_fingerprint(config)
  assert rewritten["shard_keys_sha1"] != first["shard_keys_sha1"]
  # The same shards in another order (subfolders renamed: the glob sorts by path) are another
  # stream: a hash of the sorted keys let such a resume through.
  metas = pipeline.shard_metas(config)
  assert (pipeline.train_fingerprint(config, metas=metas[::-1])["shard_keys_sha1"]
          != pipeline.train_fingerprint(config, metas=metas)["shard_keys_sha1"])


def test_embedded_cache_key_follows_the_gensim_version_and_the_files(monkeypatch, tmp_path):
  """gensim's ``filter_wiki`` cleans the embedded dump: another gensim, another cache entry; so
  do files of another size under the same gensim version (nothing checked the sizes)."""
  import shutil
  from depthbench_jax.data import corpus
  (before,) = sources.embedded_shards()
  assert before.key == sources.embedded_shards()[0].key   # stable within one install
  copies = []
  for path in corpus.embedded_files():
    copies.append(str(tmp_path / os.path.basename(path)))
    shutil.copyfile(path, copies[-1])
  monkeypatch.setattr(corpus, "embedded_files", lambda: copies)
  assert sources.embedded_shards()[0].key == before.key   # the same bytes elsewhere
  with open(copies[0], "ab") as f:
    f.write(b" ")
  assert sources.embedded_shards()[0].key != before.key
  monkeypatch.undo()
  monkeypatch.setattr(corpus, "gensim_version", lambda: "0.0.1")
  assert sources.embedded_shards()[0].key != before.key


@pytest.mark.parametrize("path", ["", "/nonexistent/fineweb/*.parquet", "/nonexistent/dir"])
def test_parquet_missing_path_names_the_field(make_config, path):
  config = make_config(source="parquet", path=path, tokenizer="byte")
  with pytest.raises(ConfigError, match=r"config\.data\.path"):
    pipeline.make_train_iterator(config, 0, 1)


def test_a_parquet_directory_lists_its_files_only_and_is_no_pattern(tmp_path):
  """A folder named ``*.parquet`` (dask's and Spark's ``out.parquet/part.0.parquet``) was listed
  as a shard, an IsADirectoryError traceback; a directory such as ``fw[1]`` was read as a glob
  pattern (no files, or another folder's); a shard this host cannot read was an OSError
  traceback, which the hosts' agreed refusal does not catch."""
  written = tmp_path / "out.parquet"
  written.mkdir()
  pq.write_table(fineweb_like(5, 0), written / "part.0.parquet")
  assert sources.parquet_files(str(tmp_path)) == [str(written / "part.0.parquet")]
  bracketed, lookalike = tmp_path / "fw[1]", tmp_path / "fw1"
  for folder in (bracketed, lookalike):
    folder.mkdir()
    pq.write_table(fineweb_like(5, 0), folder / f"{folder.name}.parquet")
  assert sources.parquet_files(str(bracketed)) == [str(bracketed / "fw[1].parquet")]
  with pytest.raises(ConfigError, match=r"^config\.data\.path: parquet shard .*gone\.parquet "
                     r"cannot be read .*FileNotFoundError"):
    sources._file_fingerprint(str(tmp_path / "gone.parquet"))   # listed, then removed


def test_truncated_parquet_names_the_file(make_config, parquet_dir):
  bad = parquet_dir / "001_00000.parquet"
  data = bad.read_bytes()
  bad.write_bytes(data[:len(data) // 2])
  with pytest.raises(ConfigError, match=r"001_00000\.parquet.*truncated or corrupt"):
    list(sources.parquet_documents(str(bad)))
  config = make_config(source="parquet", path=str(parquet_dir), tokenizer="byte")
  with pytest.raises(ConfigError, match=r"config\.data\.path.*001_00000\.parquet"):
    pipeline.make_train_iterator(config, 0, 1)
  # Nothing half-written is left in the cache: a fixed file is tokenized afresh.
  cache = os.path.join(config.data.cache_dir, "byte")
  assert not [f for f in os.listdir(cache) if ".tmp-" in f]


def test_corrupt_parquet_page_names_the_file(parquet_dir):
  bad = parquet_dir / "000_00000.parquet"
  data = bytearray(bad.read_bytes())
  data[4:len(data) // 2] = b"\xff" * (len(data) // 2 - 4)  # keep magic and footer, smash pages
  bad.write_bytes(bytes(data))
  with pytest.raises(ConfigError, match=r"000_00000\.parquet"):
    list(sources.parquet_documents(str(bad)))


def test_parquet_without_text_column(tmp_path):
  f = tmp_path / "x.parquet"
  pq.write_table(pa.table({"content": ["a", "b"]}), f)
  with pytest.raises(ConfigError, match=r"x\.parquet has no 'text' column"):
    list(sources.parquet_documents(str(f)))


def test_every_process_returns_the_shards_in_shard_order(parquet_dir, tmp_path):
  """Process p tokenizes from shard p * n / P on (to divide the work) but must return the metas
  in shard order: each process's stream, hence its windows, must be the same concatenation."""
  shards = sources.parquet_shards(str(parquet_dir))
  assert len(shards) == 2
  tok = tokenizer_lib.get_tokenizer("byte")
  for p in (0, 1):
    metas = token_cache.tokenize_shards(shards, tok, str(tmp_path / "cache"), p, 2)
    assert [m["key"] for m in metas] == [s.key for s in shards], p


def test_windows_fill_a_stream_whose_length_is_a_multiple_of_seq_len(tmp_path):
  # 64 tokens, T = 16: windows need T + 1 tokens at stride T, so 3 fit (the 4th would be short).
  path = tmp_path / "t.bin"
  np.arange(64, dtype=np.uint16).tofile(path)
  windows = pipeline.WindowSource(token_cache.TokenStream([str(path)], [64], "uint16"), 16)
  assert len(windows) == 3
  assert all(len(windows[i]) == 17 for i in range(3))
  np.testing.assert_array_equal(windows[2], np.arange(32, 49))


def test_token_stream_slices_across_files(tmp_path):
  paths = []
  for i, n in enumerate([5, 0, 3, 7]):
    p = tmp_path / f"{i}.bin"
    np.arange(100 * i, 100 * i + n, dtype=np.uint16).tofile(p)
    paths.append(str(p))
  stream = token_cache.TokenStream(paths, [5, 0, 3, 7], "uint16")
  full = np.concatenate([np.arange(0, 5), np.arange(200, 203), np.arange(300, 307)])
  assert len(stream) == 15
  for a, b in [(0, 15), (3, 9), (5, 8), (7, 14), (14, 15), (4, 4)]:
    assert np.array_equal(stream[a:b], full[a:b]), (a, b)



def _counting_shard(docs, val_every, key="synthetic"):
  """A Shard over ``docs`` that counts how often it is read."""
  reads = []
  def read():
    reads.append(1)
    return iter(docs)
  return token_cache.Shard(key=key, description=key, read=read, val_every=val_every), reads


def test_held_out_documents_follow_the_shard_index_across_chunks(tmp_path, monkeypatch):
  """Document d goes to val iff d % val_every == val_every - 1, counted over the whole shard,
  not restarted in each chunk of DOCS_PER_CHUNK documents."""
  monkeypatch.setattr(token_cache, "DOCS_PER_CHUNK", 4)
  docs = [f"d{i}" for i in range(10)]
  shard, _ = _counting_shard(docs, val_every=3)
  tok = tokenizer_lib.get_tokenizer("byte")
  meta = token_cache.tokenize_shard(shard, tok, str(tmp_path))
  assert meta["n_docs"] == {"train": 7, "val": 3}
  assert meta["n_tokens"] == {"train": 7 * 3, "val": 3 * 3}   # "dK" + eos
  val = token_cache.TokenStream.from_metas([meta], "val")
  assert tok.decode(val[0:len(val)]).split("<|endoftext|>")[:-1] == ["d2", "d5", "d8"]


def test_a_cached_shard_is_not_read_again(tmp_path):
  """The second tokenize_shard of the same key finds the meta file and returns it unread."""
  shard, reads = _counting_shard(["alpha", "beta"], val_every=100)
  tok = tokenizer_lib.get_tokenizer("byte")
  first = token_cache.tokenize_shard(shard, tok, str(tmp_path))
  second = token_cache.tokenize_shard(shard, tok, str(tmp_path))
  assert len(reads) == 1 and second == first
  assert first["paths"]["train"] == str(tmp_path / "byte" / "synthetic.train.bin")


def test_a_cached_shard_split_by_another_rule_is_tokenized_again(tmp_path):
  """The key names the content, not the held-out rule: a shard cached with every 2nd document
  held out, read with every 3rd, would have put documents of one split in the other."""
  docs = [f"d{i}" for i in range(6)]
  tok = tokenizer_lib.get_tokenizer("byte")
  halves, _ = _counting_shard(docs, val_every=2)
  thirds, reads = _counting_shard(docs, val_every=3)
  assert token_cache.tokenize_shard(halves, tok, str(tmp_path))["n_docs"]["val"] == 3
  meta = token_cache.tokenize_shard(thirds, tok, str(tmp_path))
  assert len(reads) == 1 and meta["n_docs"] == {"train": 4, "val": 2}
  assert meta["val_every"] == 3


@pytest.mark.parametrize("split", ["train", "val"])
@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_a_cached_shard_whose_token_file_is_cut_short_is_tokenized_again(tmp_path, damage,
                                                                        split):
  """A meta file whose token file (train's or val's) is shorter than it says (a `cp -r` of the
  cache cut short copies the .json before the .bin) or gone is not a cache hit: the shard is
  read again and the run gets every token, where it once died in np.memmap ('mmap length is
  greater than file size') at its first batch."""
  shard, reads = _counting_shard(["alpha", "beta", "gamma"], val_every=3)
  tok = tokenizer_lib.get_tokenizer("byte")
  first = token_cache.tokenize_shard(shard, tok, str(tmp_path))
  assert first["n_docs"] == {"train": 2, "val": 1}
  damaged = first["paths"][split]
  if damage == "truncate":
    os.truncate(damaged, 4)
  else:
    os.remove(damaged)
  again = token_cache.tokenize_shard(shard, tok, str(tmp_path))
  assert len(reads) == 2 and again == first
  for name, want in (("train", "alpha<|endoftext|>beta<|endoftext|>"),
                     ("val", "gamma<|endoftext|>")):
    stream = token_cache.TokenStream.from_metas([again], name)
    assert tok.decode(stream[0:len(stream)]) == want


def test_a_killed_writers_temporary_files_are_removed_and_live_or_remote_ones_kept(tmp_path):
  """A kill -9 mid-shard (a `prepare` or a run's first start) left its `.tmp-*` token files in
  the cache for good. The next writer of the shard removes those of a writer on this host that
  is gone and that nobody touched for ``STALE_TEMP_S``; a running writer's, another host's (its
  PID means nothing here), an older-format name, and a fresh one (a live writer in another PID
  namespace under the node's hostname: its PID reads as gone here) are kept."""
  import socket
  import subprocess
  import sys
  shard, _ = _counting_shard(["alpha"], val_every=100)
  tok = tokenizer_lib.get_tokenizer("byte")
  root = tmp_path / "byte"
  root.mkdir()
  gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  host = socket.gethostname()
  names = {"dead": f"synthetic.train.bin.tmp-{host}-{gone.stdout.strip()}-0123abcd",
           "fresh": f"synthetic.val.bin.tmp-{host}-{gone.stdout.strip()}-4567cdef",
           "dead_meta": f"synthetic.json.tmp-{host}-{gone.stdout.strip()}-0123abcd",
           "live": f"synthetic.val.bin.tmp-{host}-{os.getpid()}-0123abcd",
           "remote": f"synthetic.train.bin.tmp-{host}x-{gone.stdout.strip()}-0123abcd",
           "old_format": f"synthetic.train.bin.tmp-{gone.stdout.strip()}-0123abcd",
           "other_shard": f"other.train.bin.tmp-{host}-{gone.stdout.strip()}-0123abcd"}
  old = time.time() - token_cache.STALE_TEMP_S - 60
  for key, name in names.items():
    (root / name).write_bytes(b"x" * 8)
    if key != "fresh":
      os.utime(root / name, (old, old))
  token_cache.tokenize_shard(shard, tok, str(tmp_path))
  left = set(os.listdir(root))
  assert names["dead"] not in left and names["dead_meta"] not in left
  assert {names[k] for k in ("fresh", "live", "remote", "old_format", "other_shard")} <= left
  assert not [n for n in left if ".tmp-" in n and n not in names.values()]  # its own: renamed


def test_a_cache_dir_that_cannot_be_written_names_the_field(tmp_path):
  """A token cache under a regular file (or on a read-only mount) is one ConfigError naming
  the dir and where it comes from (config.data.cache_dir, else the variable, else the default:
  the path is the resolved one, which the field may not hold), not an OSError traceback."""
  (tmp_path / "a_file").write_text("")
  shard, _ = _counting_shard(["alpha"], val_every=100)
  tok = tokenizer_lib.get_tokenizer("byte")
  with pytest.raises(ConfigError, match=r"the token cache dir '.*a_file/cache' \(config.data."
                     r"cache_dir, else \$DEPTHBENCH_CACHE_DIR, else .*allowed: a writable "
                     r"directory"):
    token_cache.tokenize_shard(shard, tok, str(tmp_path / "a_file" / "cache"))


def test_token_dtype_fits_the_vocabulary():
  """uint16 holds ids up to 65535, so a vocabulary of exactly 2**16 still fits it."""
  assert token_cache.token_dtype(257) == np.uint16
  assert token_cache.token_dtype(2**16) == np.uint16
  assert token_cache.token_dtype(2**16 + 1) == np.uint32


def test_token_stream_refuses_strides_and_mixed_dtypes(tmp_path):
  path = tmp_path / "t.bin"
  np.arange(10, dtype=np.uint16).tofile(path)
  stream = token_cache.TokenStream([str(path)], [10], "uint16")
  with pytest.raises(ValueError, match="contiguous"):
    stream[0:10:2]
  meta = lambda dtype: {"dtype": dtype, "paths": {"train": str(path)}, "n_tokens": {"train": 10}}
  with pytest.raises(ValueError, match="mixed dtypes"):
    token_cache.TokenStream.from_metas([meta("uint16"), meta("uint32")], "train")


# ------------------------------------------------------------------------------------ TFDS


TFDS_TEXT = "tfds document {i:03d} says hello."   # what the tiny builder writes (a format)


@pytest.fixture(scope="module")
def tfds_builder():
  """A tiny ArrayRecord TFDS dataset `depthbench_tiny_text` (250 documents of ``TFDS_TEXT``);
  returns its builder class (registered once)."""
  import tensorflow_datasets as tfds

  class DepthbenchTinyText(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(
          builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
      del dl_manager
      return {"train": self._generate_examples(250)}

    def _generate_examples(self, n):
      for i in range(n):
        yield i, {"text": TFDS_TEXT.format(i=i)}

  return DepthbenchTinyText


@pytest.fixture(scope="module")
def tfds_data_dir(tfds_builder, tmp_path_factory):
  data_dir = str(tmp_path_factory.mktemp("tfds"))
  tfds_builder(data_dir=data_dir, file_format="array_record").download_and_prepare()
  return data_dir


def test_tfds_cache_key_follows_content(tfds_builder, tfds_data_dir, tmp_path, monkeypatch):
  """The same dataset name, version and count prepared again with other text (its cleaning
  fixed) kept its shards' keys, so the token cache served the old tokens, and a resume's data
  fingerprint (its shard keys) could not notice."""
  monkeypatch.setattr(sys.modules[__name__], "TFDS_TEXT", "tfds document {i:03d} says hi!")
  tfds_builder(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
  old = [s.key for s in sources.tfds_shards("depthbench_tiny_text", tfds_data_dir)]
  new = [s.key for s in sources.tfds_shards("depthbench_tiny_text", str(tmp_path))]
  assert len(old) == len(new) == 1 and old != new
  assert old == [s.key for s in sources.tfds_shards("depthbench_tiny_text", tfds_data_dir)]


def test_tfds_reader_on_local_dataset(tfds_data_dir):
  docs = list(sources.tfds_documents("depthbench_tiny_text", tfds_data_dir))
  assert len(docs) == 250
  assert sorted(docs) == [f"tfds document {i:03d} says hello." for i in range(250)]
  again = list(sources.tfds_documents("depthbench_tiny_text", tfds_data_dir))
  assert docs == again  # fixed order


def test_tfds_pipeline_end_to_end(make_config, tfds_data_dir, monkeypatch):
  monkeypatch.setattr(sources, "TFDS_DOCS_PER_SHARD", 100)  # 3 shards: 100 + 100 + 50
  config = make_config(source="tfds", tfds_name="depthbench_tiny_text", path=tfds_data_dir,
                       tokenizer="byte", seq_len=16, global_batch_size=4, val_batches=1)
  assert len(sources.shards_for(config.data)) == 3
  tokens = next(pipeline.make_train_iterator(config, 0, 1))["tokens"]
  assert tokens.shape == (4, 17)
  val = pipeline.token_stream(config, "val")
  assert val[0:len(val)].tolist().count(256) == 2  # documents 99 and 199 held out
  # Every document once, in train or held out: shards overlapping by a document kept the
  # held-out count and tokenized documents 100 and 200 twice.
  byte = tokenizer_lib.get_tokenizer("byte")
  train = pipeline.token_stream(config, "train")
  docs = (byte.decode(train[0:len(train)]) + byte.decode(val[0:len(val)])).split(
      "<|endoftext|>")[:-1]
  assert sorted(docs) == [f"tfds document {i:03d} says hello." for i in range(250)]


def test_tfds_unknown_dataset_names_the_field(make_config, tmp_path):
  config = make_config(source="tfds", tfds_name="no_such_dataset_xyz", path=str(tmp_path),
                       tokenizer="byte")
  with pytest.raises(ConfigError, match=r"config\.data\.tfds_name='no_such_dataset_xyz'"):
    pipeline.make_train_iterator(config, 0, 1)
