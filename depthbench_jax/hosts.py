"""How the processes of one run tell each other something: over JAX's own collectives, no side
channel. The host checks use it: ``main.check_same_run``, ``main.check_results_shared`` and
``train.config_check.check_same_data``."""

from __future__ import annotations


def gather_text(text: str) -> list[str]:
  """Every process's ``text``, in process order: two all-gathers over JAX's own collectives
  (``multihost_utils.process_allgather``), of the UTF-8 lengths, then of the bytes padded to
  the longest."""
  import numpy as np
  from jax.experimental import multihost_utils
  data = np.frombuffer(text.encode(), np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int32)))
  padded = np.zeros(int(sizes.max()), np.uint8)
  padded[:data.size] = data
  rows = np.asarray(multihost_utils.process_allgather(padded))
  return [bytes(row[:size]).decode() for row, size in zip(rows, sizes.reshape(-1))]
