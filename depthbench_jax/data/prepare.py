"""Tokenize a data source into the token cache ahead of a sweep, and print its token counts.

  python -m depthbench_jax.data.prepare --source=parquet \
      --path='/data/fineweb-edu/sample/10BT/*.parquet' --tokenizer=gpt2 [--cache_dir=DIR]

Runs started later with the same source, tokenizer and cache dir read the cached files.
Several copies may run at once with --process_index/--process_count to split the shards.
"""

from absl import app
from absl import flags
import ml_collections

from depthbench_jax.data import pipeline
from depthbench_jax.data import sources
from depthbench_jax.data import token_cache
from depthbench_jax.data import tokenizer as tokenizer_lib
from depthbench_jax.errors import ConfigError, absl_flags_parser, fail

_SOURCE = flags.DEFINE_enum("source", "embedded", list(sources.SOURCES), "config.data.source")
_PATH = flags.DEFINE_string("path", "", "config.data.path")
_TFDS_NAME = flags.DEFINE_string("tfds_name", "", "config.data.tfds_name")
_TOKENIZER = flags.DEFINE_enum("tokenizer", "gpt2", list(tokenizer_lib.ALLOWED),
                               "config.data.tokenizer")
_CACHE_DIR = flags.DEFINE_string("cache_dir", "", "config.data.cache_dir (default: "
                                 "$DEPTHBENCH_CACHE_DIR or ~/.cache/depthbench_jax)")
_PROCESS_INDEX = flags.DEFINE_integer("process_index", 0, "this copy's index", lower_bound=0)
_PROCESS_COUNT = flags.DEFINE_integer("process_count", 1, "copies running at once",
                                      lower_bound=1)

USAGE = ("python -m depthbench_jax.data.prepare --source=parquet|tfds|embedded --path=PATH "
         "[--tokenizer=gpt2|byte] [--cache_dir=DIR] [--process_index=I --process_count=N]")


def main(argv):
  del argv
  data = ml_collections.ConfigDict(dict(source=_SOURCE.value, path=_PATH.value,
                                        tfds_name=_TFDS_NAME.value, cache_dir=_CACHE_DIR.value))
  if _PROCESS_INDEX.value >= _PROCESS_COUNT.value:
    fail(f"--process_index={_PROCESS_INDEX.value}; allowed: 0 .. --process_count - 1 = "
         f"{_PROCESS_COUNT.value - 1}")
  try:
    tok = tokenizer_lib.get_tokenizer(_TOKENIZER.value)
    metas = token_cache.tokenize_shards(sources.shards_for(data), tok, pipeline.cache_dir(data),
                                        _PROCESS_INDEX.value, _PROCESS_COUNT.value)
  except ConfigError as err:
    fail(str(err))
  for split in token_cache.SPLITS:
    print(f"{split}: {sum(m['n_tokens'][split] for m in metas):,} tokens, "
          f"{sum(m['n_docs'][split] for m in metas):,} documents, {len(metas)} shards")


if __name__ == "__main__":
  app.run(main, flags_parser=absl_flags_parser(USAGE))
