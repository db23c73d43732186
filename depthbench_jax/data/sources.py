"""Document sources: each yields plain-text documents (str) in a fixed order, in shards.

config.data.source selects one:
  'embedded'  the corpus shipped in the gensim wheel (`corpus.py`); one shard.
  'parquet'   FineWeb-Edu style parquet files with a `text` column; config.data.path is a file,
              a directory (its `*.parquet`, recursively, sorted) or a glob; one shard per file.
  'tfds'      a prepared TFDS dataset config.data.tfds_name (e.g. 'lm1b' or 'name:1.0.0') under
              config.data.path (its data_dir; None = TFDS's default), split 'train', feature
              `text`; one shard per `TFDS_DOCS_PER_SHARD` records. Never downloads.

Validation is held out by document within each shard (`token_cache`): every 20th document of the
embedded corpus, every 100th of parquet/TFDS (FineWeb-Edu has only a train split).
"""

from __future__ import annotations

import glob
import hashlib
import os
from typing import Iterator

from depthbench_jax.data import corpus
from depthbench_jax.data.token_cache import Shard
from depthbench_jax.errors import ConfigError

SOURCES = ("embedded", "parquet", "tfds")
VAL_EVERY = {"embedded": corpus.VAL_EVERY, "parquet": 100, "tfds": 100}
TEXT_COLUMN = "text"
PARQUET_BATCH_ROWS = 1024
TFDS_DOCS_PER_SHARD = 100 * 2**12  # a multiple of VAL_EVERY, so the held-out rule is global


# ---------------------------------------------------------------------------------- parquet


def parquet_files(path: str) -> list[str]:
  """The sorted parquet files named by config.data.path (file, directory or glob)."""
  if not path:
    raise ConfigError("config.data.path is empty; allowed: a parquet file, a directory of "
                      "*.parquet files, or a glob such as /data/fineweb-edu/sample/10BT/*.parquet")
  path = os.path.expanduser(path)
  if os.path.isdir(path):   # escaped: a folder like fw[10BT] is no pattern; files only:
    files = [f for f in glob.glob(os.path.join(glob.escape(path), "**", "*.parquet"),
                                  recursive=True) if os.path.isfile(f)]   # dask's out.parquet/
  elif os.path.isfile(path):
    files = [path]
  else:
    files = [f for f in glob.glob(path, recursive=True) if os.path.isfile(f)]
  if not files:
    raise ConfigError(f"config.data.path={path!r} matches no parquet files; allowed: a parquet "
                      "file, a directory of *.parquet files, or a glob")
  return sorted(files)


def _bad_parquet(file: str, err: Exception) -> ConfigError:
  return ConfigError(
      f"config.data.path: parquet shard {file} cannot be read (truncated or corrupt?): "
      f"{type(err).__name__}: {err}; allowed: complete parquet files with a "
      f"{TEXT_COLUMN!r} string column")


def parquet_documents(file: str, column: str = TEXT_COLUMN) -> Iterator[str]:
  """Yields the `column` of one parquet file, row by row, reading one batch at a time."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top

  try:
    pf = pq.ParquetFile(file)
  except (pa.ArrowException, OSError) as e:
    raise _bad_parquet(file, e) from e
  if column not in pf.schema_arrow.names:
    raise ConfigError(f"config.data.path: parquet shard {file} has no {column!r} column "
                      f"(columns: {pf.schema_arrow.names}); allowed: files with a {column!r} "
                      "string column, as FineWeb-Edu has")
  kind = pf.schema_arrow.field(column).type   # ints were an AttributeError in the tokenizer
  if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
    raise ConfigError(f"config.data.path: parquet shard {file} has a {column!r} column of "
                      f"{kind}; allowed: files with a {column!r} string column, as FineWeb-Edu "
                      "has")
  try:
    for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[column]):
      for text in batch.column(0).to_pylist():
        if text:
          yield text
  except (pa.ArrowException, OSError) as e:
    raise _bad_parquet(file, e) from e


def _file_fingerprint(file: str) -> str:
  """Content key of a parquet file: its size and the sha1 of its last 64 KiB (the footer).
  A file this host cannot read is the ConfigError every host agrees on, not an OSError."""
  try:
    size = os.path.getsize(file)
    with open(file, "rb") as f:
      f.seek(max(0, size - 2**16))
      tail = f.read()
  except OSError as e:
    raise _bad_parquet(file, e) from e
  return hashlib.sha1(str(size).encode() + tail).hexdigest()[:16]


def parquet_shards(path: str) -> list[Shard]:
  shards = []
  for file in parquet_files(path):
    stem = os.path.splitext(os.path.basename(file))[0]
    shards.append(Shard(
        key=f"parquet-{stem}-{_file_fingerprint(file)}",
        description=file,
        read=lambda file=file: parquet_documents(file),
        val_every=VAL_EVERY["parquet"]))
  return shards


# ------------------------------------------------------------------------------------- tfds


def _tfds_builder(name: str, data_dir: str | None):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  if not name:
    raise ConfigError("config.data.tfds_name is empty; allowed: the name of a prepared TFDS "
                      "dataset with a 'text' feature, e.g. 'lm1b'")
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except Exception as e:  # DatasetNotFoundError and friends; tfds raises several types
    raise ConfigError(f"config.data.tfds_name={name!r} not found under config.data.path="
                      f"{data_dir!r} ({type(e).__name__}: {e}); allowed: a dataset prepared "
                      "there (this code never downloads)") from e
  if "train" not in builder.info.splits:
    raise ConfigError(f"config.data.tfds_name={name!r} is not prepared under "
                      f"config.data.path={data_dir!r} (no 'train' split); allowed: a prepared "
                      "dataset with a train split")
  return builder


def tfds_documents(name: str, data_dir: str | None, split: str = "train",
                   column: str = TEXT_COLUMN) -> Iterator[str]:
  """Yields feature `column` of TFDS split `split` (slices like 'train[0:100]' allowed).

  ArrayRecord datasets are read with `tfds.data_source` (no TensorFlow); TFRecord ones with
  `as_dataset` (TensorFlow).
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  builder = _tfds_builder(name, data_dir)
  features = builder.info.features
  if column not in features:
    raise ConfigError(f"config.data.tfds_name={name!r} has no {column!r} feature (features: "
                      f"{list(features)}); allowed: datasets with a {column!r} text feature")
  if builder.info.file_format == tfds.core.FileFormat.ARRAY_RECORD:
    records = builder.as_data_source(split=split)
    for i in range(len(records)):
      yield _as_str(records[i][column])
  else:
    for ex in tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False)):
      yield _as_str(ex[column])


def _as_str(x) -> str:
  return x.decode("utf-8") if isinstance(x, bytes) else str(x)


def tfds_shards(name: str, data_dir: str | None) -> list[Shard]:
  builder = _tfds_builder(name, data_dir)
  n = builder.info.splits["train"].num_examples
  # The split's bytes stand for its content: the same name, version and count prepared again
  # with other text kept every key, and the token cache served the old tokens (a rewrite to
  # exactly as many bytes is still not seen: TFDS records no content hash to read cheaply).
  size = builder.info.splits["train"].num_bytes
  version = str(builder.info.version)
  safe = f"{builder.name}-{builder.builder_config.name if builder.builder_config else ''}"
  shards = []
  for start in range(0, n, TFDS_DOCS_PER_SHARD):
    stop = min(n, start + TFDS_DOCS_PER_SHARD)
    split = f"train[{start}:{stop}]"
    shards.append(Shard(
        key=f"tfds-{safe}-{version}-n{n}-b{size}-{start}-{stop}",
        description=f"tfds {name} {split} (data_dir={data_dir})",
        read=lambda split=split: tfds_documents(name, data_dir, split),
        val_every=VAL_EVERY["tfds"]))
  return shards


# --------------------------------------------------------------------------------- embedded


def embedded_shards() -> list[Shard]:
  """One shard; its cache key names the extraction (``CORPUS_VERSION``), the two files' sizes
  and the gensim version, whose ``filter_wiki`` does the markup removal."""
  sizes = [os.path.getsize(p) if os.path.exists(p) else 0 for p in corpus.embedded_files()]
  fingerprint = f"{sizes} gensim {corpus.gensim_version()}"
  key = (f"embedded-{corpus.CORPUS_VERSION}-"
         f"{hashlib.sha1(fingerprint.encode()).hexdigest()[:8]}")
  return [Shard(key=key, description="embedded corpus (gensim)",
                read=lambda: iter(corpus.embedded_documents()), val_every=VAL_EVERY["embedded"])]


def shards_for(data_config) -> list[Shard]:
  """The shards of config.data (fields source, path, tfds_name)."""
  source = data_config.source
  if source == "embedded":
    return embedded_shards()
  if source == "parquet":
    return parquet_shards(data_config.path)
  if source == "tfds":
    return tfds_shards(data_config.tfds_name, data_config.get("path") or None)
  raise ConfigError(f"config.data.source={source!r} is unknown; allowed: {', '.join(SOURCES)}")


def iter_documents(data_config) -> Iterator[str]:
  """All documents of config.data, both splits, in shard order (for inspection and tests)."""
  for shard in shards_for(data_config):
    yield from shard.read()
