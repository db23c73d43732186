"""Host memory: keep the process's heap, in transparent huge pages, from one step to the next.

XLA:CPU allocates each step's temporaries afresh (at 8x512, vocab 50257: an 850 MB buffer and
a few of 130-155 MB per step), and glibc serves every allocation over its mmap threshold (at
most 32 MiB) with a new mapping, unmapped again on free. So every step the kernel zeroes and
maps that memory anew and then takes it back: with 4 KiB pages ~233,000 faults and 0.6 s of
system time per step; with ``glibc.malloc.hugetlb=1`` (2 MiB pages) ~450 huge-page faults,
~0.9 GB zeroed, 0.1-0.2 s. On a VM whose host reclaims freed guest memory, some steps also
get pages back slowly: 0.4-0.8 s more system time in one step of three to eight, which made
step times bimodal (Pre-LN 1.38 or 1.80 s) and the bench's ratios drift by +-0.1.

``TUNABLES`` keeps the memory instead: ``mmap_max=0`` serves large blocks from the heap,
``arena_max=1`` keeps XLA's worker threads on that one heap (their own arenas would ``mmap``
anything over 64 MiB), a 64 GiB ``trim_threshold`` never hands the freed top back, and
``hugetlb=1`` backs the heap with huge pages. After the first step a step takes no page faults
and ~0.01 s of system time: Pre-LN 1.39-1.43 -> 1.34 s, steps within +-2% instead of +-30%
(benchmarks/README.md). The cost: the process's resident memory stays at its high-water
mark. It needs glibc >= 2.35 and the kernel's THP mode ``always`` or ``madvise``
(``/sys/kernel/mm/transparent_hugepage/enabled``), and changes no result, only where memory
comes from.

glibc reads tunables once, at process start, so they have to be in the environment before
Python starts: ``launch/run_sweep.sh`` exports them, and ``reexec_with_malloc_tunables``
restarts a ``python -m`` entry point with them. ``DEPTHBENCH_DEFAULT_MALLOC=1`` keeps glibc's
default.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping

TUNABLES = ("glibc.malloc.hugetlb=1", "glibc.malloc.mmap_max=0", "glibc.malloc.arena_max=1",
            "glibc.malloc.trim_threshold=68719476736")
OPT_OUT = "DEPTHBENCH_DEFAULT_MALLOC"
_THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"


def _name(tunable: str) -> str:
  return tunable.split("=")[0]


def with_malloc_tunables(env: Mapping[str, str]) -> dict[str, str]:
  """``env`` with ``TUNABLES`` appended to ``GLIBC_TUNABLES`` (a ':' list).

  Other tunables are kept, and so is any of ours that ``env`` already sets (to any value); the
  opt-out variable leaves ``env`` as it is.
  """
  out = dict(env)
  if out.get(OPT_OUT) == "1":
    return out
  given = [t for t in out.get("GLIBC_TUNABLES", "").split(":") if t]
  named = {_name(t) for t in given}
  added = [t for t in TUNABLES if _name(t) not in named]
  if added:
    out["GLIBC_TUNABLES"] = ":".join(given + added)
  return out


def thp_available() -> bool:
  """Whether the kernel's transparent-huge-page mode (``always``/``madvise``/``never``) lets
  malloc ask for huge pages: Linux with mode ``always`` or ``madvise``."""
  if sys.platform != "linux":
    return False
  try:
    with open(_THP_MODE) as f:
      text = f.read()
  except OSError:
    return False
  return "[always]" in text or "[madvise]" in text


def active() -> bool:
  """Whether this process started with all of ``TUNABLES`` (and THP available)."""
  given = os.environ.get("GLIBC_TUNABLES", "").split(":")
  return all(t in given for t in TUNABLES) and thp_available()


def describe() -> str:
  """What the bench records as its host allocator: ours in full, else the malloc tunables the
  process did start with (``hugetlb=0`` beside our other three once read 'default', though the
  kept heap applied), else 'default'."""
  if active():
    return "glibc heap kept, THP (" + ":".join(TUNABLES) + ")"
  given = [t for t in os.environ.get("GLIBC_TUNABLES", "").split(":")
           if t.startswith("glibc.malloc.")]
  if not given:
    return "default"
  return f"glibc malloc tunables {':'.join(given)}" + ("" if thp_available() else ", no THP")


def memory_maps() -> tuple[int, int] | None:
  """(memory mappings this process holds, the kernel's ``vm.max_map_count``), or None where
  ``/proc`` does not say. XLA:CPU's compiled code lives in mappings of its own (8,000-9,000 for
  one 64-layer unrolled decode program and its prefill), and a compile that cannot map more
  aborts the whole process in LLVM ("Unable to allocate section memory")."""
  try:
    with open("/proc/self/maps") as f:
      held = sum(1 for _ in f)
    with open("/proc/sys/vm/max_map_count") as f:
      return held, int(f.read())
  except (OSError, ValueError):
    return None


def reexec_with_malloc_tunables(module: str) -> None:
  """Restarts ``python -m module <same args>`` with ``TUNABLES``, once; returns otherwise.

  Does nothing when they are already in the environment, when the user opted out, or off
  Linux/glibc or without THP, so a second start never happens.
  """
  if not thp_available():
    return
  env = with_malloc_tunables(os.environ)
  if env == dict(os.environ):
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]], env)


if __name__ == "__main__":
  # ``export GLIBC_TUNABLES="$(python -m depthbench_jax.hostmem)"`` (launch/run_sweep.sh).
  print(with_malloc_tunables(os.environ).get("GLIBC_TUNABLES", ""))
