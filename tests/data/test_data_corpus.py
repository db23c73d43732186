import os

import numpy as np
import pytest

from depthbench_jax.data import corpus
from depthbench_jax.data import pipeline


def test_embedded_corpus_is_real_english_and_deterministic():
  docs = corpus.embedded_documents()
  assert len(docs) > 300
  assert sum(map(len, docs)) > 3_000_000
  assert " the " in docs[0] and "#REDIRECT" not in "".join(docs)
  assert "''" not in docs[0]  # wiki italics/bold quote marks removed
  # Fixed order: the dump's articles first (dump order), then the Lee news corpus.
  assert [d.split("\n")[0] for d in docs[:3]] == ["Anarchism", "Autism", "Albedo"]
  assert docs[-1].startswith("Australia will take on France in the doubles rubber")


def test_val_split_is_disjoint_held_out_documents():
  train, val = corpus.embedded_split("train"), corpus.embedded_split("val")
  assert val and train
  assert not set(train) & set(val)
  assert len(train) + len(val) == len(corpus.embedded_documents())
  assert 0.03 < len(val) / (len(train) + len(val)) < 0.07


def test_embedded_token_counts_and_cache(make_config):
  config = make_config()
  train = pipeline.token_stream(config, "train")
  val = pipeline.token_stream(config, "val")
  assert len(train) > 600_000 and 20_000 < len(val) < 100_000
  tok_eos = 50256
  # Documents are eos-terminated: the stream ends in eos and holds one eos per document.
  assert train[len(train) - 1:len(train)][0] == tok_eos
  n_docs = len(corpus.embedded_split("train"))
  assert int(np.sum(train[0:len(train)] == tok_eos)) == n_docs
  # Second call reads the cache: the same files, not rewritten (a re-tokenization writes new
  # ones by rename; equal paths and tokens alone held either way).
  stamp = lambda paths: [(os.stat(p).st_ino, os.stat(p).st_mtime_ns) for p in paths]
  before = stamp(train.paths)
  again = pipeline.token_stream(config, "train")
  assert again.paths == train.paths and np.array_equal(again[0:1000], train[0:1000])
  assert stamp(again.paths) == before


def test_held_out_rule_and_split_names_by_hand():
  """Document i is held out iff i % 20 == 19 (the last of every 20); a split other than train or
  val is one error naming both; runs of blank lines collapse to one and line ends are stripped."""
  assert [i for i in range(45) if corpus.is_val_document(i)] == [19, 39]
  assert [i for i in range(9) if corpus.is_val_document(i, val_every=4)] == [3, 7]
  with pytest.raises(ValueError, match="split='validation'; allowed: train, val"):
    corpus.embedded_split("validation")
  assert corpus._clean("  Title \n\n\n\n body  \n\n\n") == "Title\n\nbody"
