"""Two local gloo processes: one dying makes the other exit non-zero with a clear error, fast.

(2 processes matching 1 is ``tests/train/test_train_loop.py::
test_two_processes_gloo_survive_a_sigterm_to_one_and_match_one``.)
The survivor's next collective fails (gloo: connection reset); ``main.py`` prints one
``error: process i of 2 failed: ...`` line and exits 1 without JAX's shutdown barrier, which
would wait for the dead peer. ``JAX_HEARTBEAT_TIMEOUT_S`` bounds any other wait.
"""

import os
import resource
import signal
import subprocess
import time

import pytest

from tests import helpers

EXIT_WITHIN_S = 60


@pytest.mark.slow
@pytest.mark.parametrize("victim", [1, 0])
def test_one_process_dying_stops_the_other_with_a_clear_error(tmp_path, victim):
  """Process 1 dies, and process 0 (which also hosts the coordination service) must stop; or the
  coordinator dies, and process 1 must stop."""
  import portpicker
  workdir = str(tmp_path / "two")
  port = portpicker.pick_unused_port()
  flags = helpers.tiny_flags(steps=100000, eval_every=0, checkpoint_every=100000)
  procs = [subprocess.Popen(
      helpers.main_command(workdir, flags), cwd=helpers.ROOT,
      env=helpers.subprocess_env(JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
                                 JAX_NUM_PROCESSES=2, JAX_PROCESS_ID=i,
                                 JAX_HEARTBEAT_TIMEOUT_S=10),
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for i in range(2)]
  try:
    helpers.wait_for_step(workdir, 5, procs[0])
    procs[victim].send_signal(signal.SIGKILL)
    killed_at = time.time()
    survivor = procs[1 - victim]
    _, err = survivor.communicate(timeout=EXIT_WITHIN_S)
    assert survivor.returncode == 1, err[-3000:]   # main's own exit, not an abort
    assert time.time() - killed_at < EXIT_WITHIN_S
    lines = [l for l in err.splitlines() if l.startswith("error:")]
    assert len(lines) == 1 and f"process {1 - victim} of 2 failed" in lines[0], err[-3000:]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()


@pytest.mark.parametrize("process_id", [0, 1])
def test_a_host_that_never_joins_aborts_the_others_as_the_sweep_expects(tmp_path, process_id):
  """The sweep stops a pod's sweep on exit ``-SIGABRT`` (``sweep.py``: "the processes did not all
  join"), which its own tests fake with ``os.abort()``. Here the real thing: a process whose peer
  never starts (as the coordinator, or waiting for one) is aborted by JAX once
  ``JAX_INIT_TIMEOUT_S`` is over, not left to raise into a traceback and exit 1 (after which
  every later run would wait as long again)."""
  import portpicker
  port = portpicker.pick_unused_port()
  proc = subprocess.run(
      helpers.main_command(str(tmp_path / "run"), helpers.tiny_flags()), cwd=helpers.ROOT,
      env=helpers.subprocess_env(JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
                                 JAX_NUM_PROCESSES=2, JAX_PROCESS_ID=process_id,
                                 JAX_INIT_TIMEOUT_S=2),
      preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0)),
      capture_output=True, text=True, timeout=120)
  assert proc.returncode == -signal.SIGABRT, proc.stderr[-3000:]
  assert not os.path.exists(tmp_path / "run" / "checkpoints")
