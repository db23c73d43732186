"""The checks of config.data's own fields, apart from the pipeline so that they import no grain:
the config check before a run (``train/config_check.py``, also on a device image without
grain) and the pipeline itself both run them."""

from __future__ import annotations

import numpy as np

from depthbench_jax.data import sources
from depthbench_jax.data import tokenizer as tokenizer_lib
from depthbench_jax.errors import ConfigError


def _is_int(x) -> bool:
  return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def check_data_config(data, process_count: int = 1) -> None:
  """Raises ConfigError naming the first bad field of config.data."""
  if data.get("source") not in sources.SOURCES:
    raise ConfigError(f"config.data.source={data.get('source')!r} is unknown; allowed: "
                      f"{', '.join(sources.SOURCES)}")
  if data.source == "parquet" and not data.get("path"):
    raise ConfigError("config.data.path is empty but config.data.source='parquet'; allowed: a "
                      "parquet file, a directory of *.parquet files, or a glob")
  if data.source == "tfds" and not data.get("tfds_name"):
    raise ConfigError("config.data.tfds_name is empty but config.data.source='tfds'; allowed: "
                      "the name of a prepared TFDS dataset with a 'text' feature")
  if data.get("tokenizer") not in tokenizer_lib.ALLOWED:
    raise ConfigError(f"config.data.tokenizer={data.get('tokenizer')!r} is unknown; allowed: "
                      f"{', '.join(tokenizer_lib.ALLOWED)}")
  for field in ("seq_len", "global_batch_size"):
    v = data.get(field)
    if not _is_int(v) or v < 1:
      raise ConfigError(f"config.data.{field}={v!r}; allowed: an integer >= 1")
  if data.global_batch_size % process_count:
    raise ConfigError(f"config.data.global_batch_size={data.global_batch_size} is not divisible "
                      f"by the {process_count} JAX processes; allowed: a multiple of "
                      f"{process_count}")
  seed = data.get("seed")
  if not _is_int(seed) or not 0 <= seed < 2**32:
    raise ConfigError(f"config.data.seed={seed!r}; allowed: an integer in [0, 2**32)")
  for field in ("val_batches", "worker_count"):
    v = data.get(field)
    if not _is_int(v) or v < 0:
      raise ConfigError(f"config.data.{field}={v!r}; allowed: an integer >= 0")
