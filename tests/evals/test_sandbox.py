"""The sandbox kills runaway code and blocks writes outside its temp dir, sockets and forks."""

import os
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
  for name in ("humaneval", "mbpp"):
    for e in datasets.load_set(name, FIXTURES):
      completion = e.answer if name == "humaneval" else e.answer
      assert sandbox.run_program(tasks.code_program(name, e, completion)).passed, e.id
      assert not sandbox.run_program(tasks.code_program(name, e, "    return None\n")).passed
