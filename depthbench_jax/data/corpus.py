"""The embedded default corpus: real English text that ships inside an installed wheel.

Two files from the `gensim` wheel (`gensim/test/test_data/`), read in this fixed order:
  1. `enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2`: a shortened
     English Wikipedia dump; main-namespace articles (redirects and stubs under
     `MIN_ARTICLE_CHARS` dropped) in dump order, markup removed with gensim's `filter_wiki`,
     each document = "Title\\n\\nbody".
  2. `lee_background.cor`: the Lee news corpus (Australian news articles), one per line.
About 3.4M characters, ~0.8M GPT-2 tokens (see `tests/data/test_data_corpus.py`): enough for smoke
runs and small models; real runs point `config.data.source` at FineWeb-Edu parquet shards.

Held-out split by document: document i (in the order above) is validation iff
`i % VAL_EVERY == VAL_EVERY - 1` (5%), so both sources appear in both splits.

The files are located with `importlib.util.find_spec`; gensim itself is imported only to parse
the dump. Tokenized results are cached by `token_cache`, keyed by `CORPUS_VERSION`, the files'
sizes, the gensim version and the tokenizer.
"""

from __future__ import annotations

import bz2
import functools
import importlib.metadata
import importlib.util
import os
import re

from depthbench_jax.errors import ConfigError

CORPUS_VERSION = "gensim-enwiki+lee-v1"  # bump when the extraction below changes
WIKI_FILE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
LEE_FILE = "lee_background.cor"
MIN_ARTICLE_CHARS = 200
VAL_EVERY = 20


def gensim_test_data_dir() -> str:
  spec = importlib.util.find_spec("gensim")
  if spec is None or not spec.submodule_search_locations:
    raise ConfigError(
        "config.data.source='embedded' reads text shipped in the `gensim` wheel, which is not "
        "installed; install gensim or choose another source; allowed: embedded, parquet, tfds"
    )
  return os.path.join(list(spec.submodule_search_locations)[0], "test", "test_data")


def gensim_version() -> str:
  """The installed gensim's version (its ``filter_wiki`` shapes the text), without importing it."""
  gensim_test_data_dir()  # One clear error when gensim is missing.
  return importlib.metadata.version("gensim")


def _clean(text: str) -> str:
  """Strips line ends and collapses runs of blank lines left by the markup filter."""
  lines = [line.strip() for line in text.splitlines()]
  text = "\n".join(lines)
  return re.sub(r"\n{3,}", "\n\n", text).strip()


def wiki_articles(path: str) -> list[str]:
  """Main-namespace, non-redirect articles of a MediaWiki XML dump, as 'Title\\n\\nbody'."""
  from gensim.corpora import wikicorpus  # pylint: disable=g-import-not-at-top

  docs = []
  with bz2.open(path, "rb") as f:
    for title, markup, _ in wikicorpus.extract_pages(f, filter_namespaces=("0",)):
      if markup.lstrip()[:9].upper() == "#REDIRECT":
        continue
      body = wikicorpus.filter_wiki(markup)
      body = _clean(re.sub(r"'{2,}", "", body))  # ''italic'' and '''bold''' quote marks
      if len(body) >= MIN_ARTICLE_CHARS:
        docs.append(f"{title}\n\n{body}")
  return docs


def lee_articles(path: str) -> list[str]:
  with open(path, encoding="utf-8") as f:
    return [line.strip() for line in f if line.strip()]


def embedded_files() -> list[str]:
  root = gensim_test_data_dir()
  return [os.path.join(root, WIKI_FILE), os.path.join(root, LEE_FILE)]


@functools.cache
def embedded_documents() -> tuple[str, ...]:
  """All documents of the embedded corpus in their fixed order."""
  paths = embedded_files()
  for p in paths:
    if not os.path.exists(p):
      raise ConfigError(
          f"config.data.source='embedded': {p} is missing from the installed gensim wheel; "
          "reinstall gensim or choose another source; allowed: embedded, parquet, tfds"
      )
  return tuple(wiki_articles(paths[0]) + lee_articles(paths[1]))


def is_val_document(index: int, val_every: int = VAL_EVERY) -> bool:
  """The held-out rule, shared by all sources: every `val_every`-th document."""
  return index % val_every == val_every - 1


def embedded_split(split: str) -> list[str]:
  """Documents of split 'train' or 'val'."""
  if split not in ("train", "val"):
    raise ValueError(f"split={split!r}; allowed: train, val")
  want_val = split == "val"
  return [d for i, d in enumerate(embedded_documents()) if is_val_document(i) == want_val]
