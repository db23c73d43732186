"""Shared fixtures for the data tests: a per-session token cache and a small config builder."""

import ml_collections
import pytest


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
  """One token cache for the session, so the embedded corpus is tokenized once per tokenizer."""
  return str(tmp_path_factory.mktemp("token_cache"))


@pytest.fixture
def make_config(cache_dir):
  """make_config(**data_overrides) -> ConfigDict with a config.data like configs/base.py's."""

  def make(**overrides):
    data = dict(source="embedded", path="", tfds_name="", tokenizer="gpt2", seq_len=64,
                global_batch_size=8, seed=0, val_batches=2, worker_count=0, cache_dir=cache_dir)
    data.update(overrides)
    return ml_collections.ConfigDict({"data": data})

  return make
