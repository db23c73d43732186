"""``python -m depthbench_jax.data.prepare`` fills the cache a run reads and prints its counts."""

import os
import subprocess
import sys

from absl.testing import flagsaver
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from depthbench_jax.data import pipeline, prepare, sources
from tests import helpers


def test_prepare_fills_the_runs_cache_and_prints_its_counts(tmp_path, make_config, capsys,
                                                            monkeypatch):
  """Two parquet files, of 100 documents and of 2, byte tokenizer: tokens are UTF-8 bytes plus
  one eos per document and document 99 of each file is held out, so the printed counts are
  computable by hand."""
  data = tmp_path / "parquet"
  data.mkdir()
  texts = [[f"doc {i}" for i in range(100)], ["four", "héllo"]]
  for i, t in enumerate(texts):
    pq.write_table(pa.table({"text": t}), data / f"{i:03d}.parquet")
  cache = tmp_path / "cache"
  monkeypatch.chdir(tmp_path)
  with flagsaver.as_parsed(source="parquet", path=str(data), tfds_name="", tokenizer="byte",
                           cache_dir=str(cache), process_index="1", process_count="2"):
    prepare.main([])
  out = capsys.readouterr().out
  n_train = sum(len(t.encode("utf-8")) + 1 for f in texts for t in f) - len("doc 99 ")
  assert f"train: {n_train:,} tokens, 101 documents, 2 shards" in out, out
  assert "val: 7 tokens, 1 documents, 2 shards" in out, out   # "doc 99" + eos
  # A run with the same source, tokenizer and cache dir finds every shard already there.
  config = make_config(source="parquet", path=str(data), tokenizer="byte", cache_dir=str(cache))
  for shard in sources.shards_for(config.data):
    assert os.path.exists(cache / "byte" / f"{shard.key}.json"), shard.key
  assert len(pipeline.token_stream(config, "train")) == n_train
  # Without --cache_dir, $DEPTHBENCH_CACHE_DIR, as a run without config.data.cache_dir.
  monkeypatch.setenv("DEPTHBENCH_CACHE_DIR", str(tmp_path / "env_cache"))
  with flagsaver.as_parsed(source="parquet", path=str(data), tfds_name="", tokenizer="byte",
                           cache_dir="", process_index="0", process_count="1"):
    prepare.main([])
  assert len(os.listdir(tmp_path / "env_cache" / "byte")) == 2 * 3   # .json, .train/.val.bin
  assert sorted(os.listdir(tmp_path)) == ["cache", "env_cache", "parquet"]   # nothing elsewhere
  # The variable set empty is unset (the default under $HOME), and a --cache_dir of '~/c', as
  # the shell passes it, is under $HOME: neither puts a cache in the cwd.
  monkeypatch.setenv("DEPTHBENCH_CACHE_DIR", "")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  for cache_dir, under in (("", "home/.cache/depthbench_jax/byte"), ("~/c", "home/c/byte")):
    with flagsaver.as_parsed(source="parquet", path=str(data), tfds_name="", tokenizer="byte",
                             cache_dir=cache_dir, process_index="0", process_count="1"):
      prepare.main([])
    assert len(os.listdir(tmp_path / under)) == 2 * 3, cache_dir
  assert sorted(os.listdir(tmp_path)) == ["cache", "env_cache", "home", "parquet"]


@pytest.mark.parametrize("flags, named", [
    (["--path=/nonexistent/shards"], "config.data.path='/nonexistent/shards' matches no parquet"),
    (["--path={data}/*.pqt"], "config.data.path="),
    (["--path={data}/no_text.parquet"], "config.data.path: parquet shard"),
    (["--path={data}/int_text.parquet"], "config.data.path: parquet shard"),   # a traceback once
    (["--path={data}", "--tokenizer=sentencepiece"], "flag --tokenizer=sentencepiece"),
    (["--path={data}", "--cache_dir={data}/no_text.parquet/cache"],
     "the token cache dir '{data}/no_text.parquet/cache' (config.data.cache_dir, else"),
    (["--path={data}", "--process_index=2", "--process_count=2"], "--process_index=2"),
    (["--path={data}", "--process_count=0"], "flag --process_count=0"),
    # An unquoted glob after --path: the first file alone was tokenized, exit 0.
    (["--path", "{data}/no_text.parquet", "{data}/b.parquet"], "unexpected argument '"),
])
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, flags, named):
  """Each bad flag of ``prepare`` is one ``error:`` line naming it and what is allowed, exit 2
  (a ConfigError traceback and exit 1 once; absl's FATAL line for a bad enum), no cache made."""
  data = tmp_path / "data"
  data.mkdir()
  pq.write_table(pa.table({"content": ["a document"]}), data / "no_text.parquet")
  pq.write_table(pa.table({"text": [1, 2]}), data / "int_text.parquet")
  cache = tmp_path / "cache"
  args = [f.format(data=data) for f in flags]
  proc = subprocess.run(
      [sys.executable, "-m", "depthbench_jax.data.prepare", "--source=parquet",
       f"--cache_dir={cache}", "--tokenizer=byte", *args],
      cwd=helpers.ROOT, env=helpers.subprocess_env(), capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  named = named.format(data=data)
  assert len(lines) == 1 and lines[0].startswith(f"error: {named}"), proc.stderr[-2000:]
  assert "allowed" in lines[0], lines[0]
  assert not [f for _, _, files in os.walk(cache) for f in files]   # no cache, no temporaries
