"""One trainer per run folder: an exclusive ``flock`` on ``WORKDIR/.trainer-<process>.lock``.

Two trainers in one workdir (a rerun while a ``nohup`` job goes on; a sweep orphaned by a killed
``run_sweep.sh`` beside its rerun) deleted each other's checkpoints and interleaved their
``metrics.jsonl``. The lock is per process index, so the processes of one multi-host run each
hold their own; it is released when the trainer returns or raises (the kernel drops it when the
process dies), and the file stays (removing a lock file races). Where the filesystem has no
``flock`` (some network mounts), training goes on unlocked with one warning.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import sys

from depthbench_jax.errors import ConfigError


def is_lock_file(name: str) -> bool:
  """A trainer's lock file's name (``.trainer-<process>.lock``): no sign that a run trained."""
  return re.fullmatch(r"\.trainer-\d+\.lock", name) is not None


class TrainerLock:
  """Held from ``acquire`` (after the workdir exists) until ``release``."""

  def __init__(self, workdir: str, process_index: int):
    self.path = os.path.join(workdir, f".trainer-{process_index}.lock")
    self.workdir, self.process_index = workdir, process_index
    self._file = None

  @property
  def held(self) -> bool:
    return self._file is not None

  def acquire(self, create: bool = True) -> None:
    """ConfigError naming ``--workdir`` when another trainer holds it. Held already: nothing.
    ``create=False``: only a lock file that exists is locked (a run refused for its input then
    leaves its folder as it was)."""
    if self.held or not (create or os.path.exists(self.path)):
      return
    if create:   # here, so that a folder one host cannot make is refused on every process too
      os.makedirs(self.workdir, exist_ok=True)
    f = open(self.path, "a")
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      f.close()
      raise ConfigError(
          f"--workdir={self.workdir}: another trainer (process {self.process_index}) is "
          f"training in it ({self.path} is locked); allowed: one trainer per run folder: wait "
          f"for it or stop it, then rerun to resume, or use a new --workdir") from None
    except OSError as err:
      if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        f.close()
        raise
      print(f"warning: {self.path}: this filesystem has no flock ({err.strerror}); nothing "
            f"stops a second trainer in {self.workdir}", file=sys.stderr, flush=True)
    self._file = f

  def acquire_agreed(self, process_count: int, create: bool = True) -> None:
    """``acquire`` on every process of a run, agreed over JAX's collectives: one refused refuses
    all, each with the same line. A 2-process rerun over a 1-process job got process 1's lock
    (nobody held it) and waited on process 0, which had exited, in orbax's first barrier: 5
    minutes, then an abort. Every process calls it (a collective), held or not."""
    try:
      self.acquire(create)
      refused = ""
    except ConfigError as err:
      refused = str(err)
    except OSError as err:   # a read-only or unreachable workdir: refused on every process too
      refused = (f"--workdir={self.workdir}: cannot lock {self.path} ({err.strerror}: "
                 f"{err.filename}); allowed: a folder this process can write")
    if process_count > 1:
      from depthbench_jax.hosts import gather_text  # pylint: disable=g-import-not-at-top
      refused = next((line for line in gather_text(refused) if line), "")
    if refused:
      self.release()
      raise ConfigError(refused)

  def release(self) -> None:
    if self._file is not None:
      self._file.close()   # closing the descriptor drops the flock
      self._file = None
