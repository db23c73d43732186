"""Huge-page malloc (depthbench_jax/hostmem.py): the environment it builds and its effect."""

from __future__ import annotations

import subprocess
import sys

import pytest

from depthbench_jax import hostmem
from tests.helpers import ROOT

needs_thp = pytest.mark.skipif(not hostmem.thp_available(),
                               reason="needs Linux with transparent huge pages")


def _clean_env(**extra):
  env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ROOT}
  env.update(extra)
  return env


def test_appends_the_tunable_and_keeps_the_others():
  assert hostmem.with_huge_pages({})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
  env = hostmem.with_huge_pages({"GLIBC_TUNABLES": "glibc.mem.tagging=0", "HOME": "/h"})
  assert env == {"GLIBC_TUNABLES": "glibc.mem.tagging=0:glibc.malloc.hugetlb=1", "HOME": "/h"}
  assert hostmem.with_huge_pages(env) == env  # idempotent


def test_an_explicit_choice_or_the_opt_out_is_left_alone():
  for env in ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"},
              {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=2:glibc.mem.tagging=0"},
              {hostmem.OPT_OUT: "1"}):
    assert hostmem.with_huge_pages(env) == env


_FAULTS = """
import ctypes, resource
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
size = 256 << 20
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
ptr = libc.malloc(size)
ctypes.memset(ptr, 1, size)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(env) -> int:
  out = subprocess.run([sys.executable, "-c", _FAULTS], env=env, capture_output=True, text=True,
                       check=True)
  return int(out.stdout)


@needs_thp
def test_huge_pages_cut_the_page_faults_of_a_large_malloc():
  """Touching a fresh 256 MiB malloc: 65,536 faults of 4 KiB by default, ~128 of 2 MiB."""
  default = _faults(_clean_env())
  huge = _faults(hostmem.with_huge_pages(_clean_env()))
  assert default > 30_000
  assert huge < default / 10


_REEXEC = ("from depthbench_jax import hostmem; "
           "hostmem.reexec_with_huge_pages('depthbench_jax.hostmem')")


@needs_thp
def test_reexec_restarts_the_module_once_with_the_tunable():
  """The restarted ``python -m depthbench_jax.hostmem`` prints the tunables it started with;
  without a restart the ``-c`` program prints nothing."""
  run = lambda env: subprocess.run([sys.executable, "-c", _REEXEC], env=env, capture_output=True,
                                   text=True, check=True).stdout.strip()
  assert run(_clean_env()) == "glibc.malloc.hugetlb=1"
  assert run(_clean_env(GLIBC_TUNABLES="glibc.malloc.hugetlb=1")) == ""
  assert run(_clean_env(**{hostmem.OPT_OUT: "1"})) == ""
