"""How the processes of one run tell each other something: over JAX's own collectives, no side
channel. The host checks use it: ``main.check_same_run``, ``main.check_results_shared`` and
``train.config_check.check_same_data``; ``refusals_agreed`` around a check makes one host's
refusal every host's."""

from __future__ import annotations

import contextlib


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


@contextlib.contextmanager
def refusals_agreed(process_count: int):
  """``with refusals_agreed(n): check()``: a ``ConfigError`` the block raises on any process is
  raised on every process, after the block, which every process must enter (one all-gather).

  A refusal one host alone met (its copy of the data missing or torn) sent that host to its
  exit while the others waited for it in their next all-gather until the heartbeat timeout.
  Refused on every process: the first refusal in process order, as a ``ConfigError`` (bad input,
  exit 2). On some processes only: a ``HostsDiffer`` naming the first of them (the hosts see
  different things; the sweep stops)."""
  from depthbench_jax.errors import ConfigError, HostsDiffer
  error = None
  try:
    yield
  except ConfigError as err:
    if process_count == 1:
      raise
    error = err
  if process_count == 1:
    return
  said = gather_text("" if error is None else str(error))
  refused = [i for i, text in enumerate(said) if text]
  if not refused:
    return
  first = said[refused[0]]
  if len(refused) == len(said):
    raise ConfigError(first)
  who = (f"process {refused[0]}" if len(refused) == 1 else
         f"processes {', '.join(map(str, refused))}")
  raise HostsDiffer(f"{who} of {len(said)} only: {first} (the other processes read theirs; "
                    f"allowed: the same files on every host)")
