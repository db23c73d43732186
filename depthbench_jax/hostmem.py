"""Host memory: back the process's large allocations with transparent huge pages.

XLA:CPU allocates each step's temporaries (logits [B*T, V], the embedding gradient [V, d], the
saved activations) afresh, and glibc serves every allocation over its mmap threshold (at most
32 MiB) with a new mapping that the kernel fills one 4 KiB page fault at a time. On the 8x512
bench step (2 CPU cores, vocab 50257) that is ~233,000 minor faults and 0.6 s of system time
per step. ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` (glibc >= 2.35) makes malloc
``madvise(MADV_HUGEPAGE)`` those mappings, so a fault maps 2 MiB: ~1,300 faults, 0.25 s
system time, Pre-LN step 3.2 -> 2.9 s; torch's step in the same process 3.0 -> 2.8 s
(benchmarks/README.md). It needs the kernel's THP mode ``always`` or ``madvise``
(``/sys/kernel/mm/transparent_hugepage/enabled``) and changes no result, only where pages
come from.

glibc reads tunables once, at process start, so the variable has to be in the environment
before Python starts: ``launch/run_sweep.sh`` exports it, and ``reexec_with_huge_pages``
restarts a ``python -m`` entry point with it set. ``DEPTHBENCH_DEFAULT_MALLOC=1`` keeps glibc's
default.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping

TUNABLE = "glibc.malloc.hugetlb"
SETTING = f"{TUNABLE}=1"
OPT_OUT = "DEPTHBENCH_DEFAULT_MALLOC"
_THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"


def with_huge_pages(env: Mapping[str, str]) -> dict[str, str]:
  """``env`` with ``glibc.malloc.hugetlb=1`` appended to ``GLIBC_TUNABLES`` (a ':' list).

  Other tunables are kept; an explicit ``glibc.malloc.hugetlb`` setting (any value) or the
  opt-out variable leaves ``env`` as it is.
  """
  out = dict(env)
  tunables = [t for t in out.get("GLIBC_TUNABLES", "").split(":") if t]
  if out.get(OPT_OUT) == "1" or any(t.split("=")[0] == TUNABLE for t in tunables):
    return out
  out["GLIBC_TUNABLES"] = ":".join(tunables + [SETTING])
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
  """Whether this process started with huge-page malloc (the tunable set, THP available)."""
  return SETTING in os.environ.get("GLIBC_TUNABLES", "").split(":") and thp_available()


def reexec_with_huge_pages(module: str) -> None:
  """Restarts ``python -m module <same args>`` with huge-page malloc, once; returns otherwise.

  Does nothing when the setting is already in the environment, when the user opted out, or
  off Linux/glibc or without THP, so a second start never happens.
  """
  if not thp_available():
    return
  env = with_huge_pages(os.environ)
  if env == dict(os.environ):
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]], env)


if __name__ == "__main__":
  # ``export GLIBC_TUNABLES="$(python -m depthbench_jax.hostmem)"`` (launch/run_sweep.sh).
  print(with_huge_pages(os.environ).get("GLIBC_TUNABLES", ""))
