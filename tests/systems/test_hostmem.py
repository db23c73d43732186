"""Host malloc tunables (depthbench_jax/hostmem.py): the environment they build, their effect."""

from __future__ import annotations

import subprocess
import sys

import pytest

from depthbench_jax import hostmem
from tests.helpers import ROOT

needs_thp = pytest.mark.skipif(not hostmem.thp_available(),
                               reason="needs Linux with transparent huge pages")
OURS = ":".join(hostmem.TUNABLES)


def _clean_env(**extra):
  env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ROOT}
  env.update(extra)
  return env


def test_appends_the_tunables_and_keeps_the_others():
  assert hostmem.with_malloc_tunables({})["GLIBC_TUNABLES"] == OURS
  env = hostmem.with_malloc_tunables({"GLIBC_TUNABLES": "glibc.mem.tagging=0", "HOME": "/h"})
  assert env == {"GLIBC_TUNABLES": "glibc.mem.tagging=0:" + OURS, "HOME": "/h"}
  assert hostmem.with_malloc_tunables(env) == env  # idempotent


def test_an_explicit_choice_is_kept_and_the_opt_out_left_alone():
  env = hostmem.with_malloc_tunables({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})
  tunables = env["GLIBC_TUNABLES"].split(":")
  assert tunables[0] == "glibc.malloc.hugetlb=0" and "glibc.malloc.hugetlb=1" not in tunables
  assert tunables[1:] == list(hostmem.TUNABLES[1:])
  opted_out = {hostmem.OPT_OUT: "1", "GLIBC_TUNABLES": "glibc.mem.tagging=0"}
  assert hostmem.with_malloc_tunables(opted_out) == opted_out


# Touches a 256 MiB malloc, frees it, and touches a second one: the page faults of each.
_FAULTS = """
import ctypes, resource
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 256 << 20
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
counts = []
for _ in range(2):
  before = faults()
  ptr = libc.malloc(size)
  ctypes.memset(ptr, 1, size)
  counts.append(faults() - before)
  libc.free(ptr)
print(*counts)
"""


def _faults(env) -> tuple[int, int]:
  out = subprocess.run([sys.executable, "-c", _FAULTS], env=env, capture_output=True, text=True,
                       check=True)
  first, second = out.stdout.split()
  return int(first), int(second)


@needs_thp
def test_huge_pages_and_a_kept_heap_cut_the_page_faults_of_a_large_malloc():
  """By default each fresh 256 MiB block is a new mapping: 65,536 faults of 4 KiB, every time.
  With the tunables the first takes ~128 faults of 2 MiB and the second reuses it: none."""
  default = _faults(_clean_env())
  tuned = _faults(hostmem.with_malloc_tunables(_clean_env()))
  assert min(default) > 30_000, default
  assert tuned[0] < default[0] / 10, (tuned, default)
  assert tuned[1] < 50, (tuned, default)


_REEXEC = ("from depthbench_jax import hostmem; "
           "hostmem.reexec_with_malloc_tunables('depthbench_jax.hostmem')")


@needs_thp
def test_reexec_restarts_the_module_once_with_the_tunables():
  """The restarted ``python -m depthbench_jax.hostmem`` prints the tunables it started with;
  without a restart the ``-c`` program prints nothing."""
  run = lambda env: subprocess.run([sys.executable, "-c", _REEXEC], env=env, capture_output=True,
                                   text=True, check=True).stdout.strip()
  assert run(_clean_env()) == OURS
  assert run(_clean_env(GLIBC_TUNABLES=OURS)) == ""
  assert run(_clean_env(**{hostmem.OPT_OUT: "1"})) == ""


def test_thp_is_available_in_mode_always_or_madvise_on_linux_only(tmp_path, monkeypatch):
  """The kernel brackets the active THP mode: ``always`` and ``madvise`` let malloc ask for huge
  pages, ``never`` does not; no mode file, or not Linux, means no huge pages."""
  mode = tmp_path / "enabled"
  monkeypatch.setattr(hostmem, "_THP_MODE", str(mode))
  monkeypatch.setattr(hostmem.sys, "platform", "linux")
  for text, want in (("[always] madvise never", True), ("always [madvise] never", True),
                     ("always madvise [never]", False)):
    mode.write_text(text + "\n")
    assert hostmem.thp_available() is want, text
  monkeypatch.setattr(hostmem.sys, "platform", "darwin")
  assert not hostmem.thp_available()
  monkeypatch.setattr(hostmem.sys, "platform", "linux")
  mode.unlink()
  assert not hostmem.thp_available()


def test_active_needs_every_tunable_and_thp(monkeypatch):
  """``active``/``describe``: all of TUNABLES in GLIBC_TUNABLES (others may sit beside them) and
  THP available; otherwise the malloc tunables given are recorded as they are (a user's
  hugetlb=0 beside our other three read 'default'), and none is the default allocator."""
  monkeypatch.setattr(hostmem, "thp_available", lambda: True)
  monkeypatch.setenv("GLIBC_TUNABLES", "glibc.mem.tagging=0:" + OURS)
  assert hostmem.active() and hostmem.describe() == f"glibc heap kept, THP ({OURS})"
  monkeypatch.setenv("GLIBC_TUNABLES", hostmem.TUNABLES[0])
  assert not hostmem.active() and hostmem.describe() == (
      f"glibc malloc tunables {hostmem.TUNABLES[0]}")
  user = ":".join(("glibc.malloc.hugetlb=0",) + hostmem.TUNABLES[1:])
  monkeypatch.setenv("GLIBC_TUNABLES", "glibc.mem.tagging=0:" + user)
  assert hostmem.describe() == f"glibc malloc tunables {user}"
  monkeypatch.setenv("GLIBC_TUNABLES", "glibc.mem.tagging=0")
  assert hostmem.describe() == "default"
  monkeypatch.setenv("GLIBC_TUNABLES", OURS)
  monkeypatch.setattr(hostmem, "thp_available", lambda: False)
  assert not hostmem.active() and hostmem.describe() == f"glibc malloc tunables {OURS}, no THP"
