"""Faults: SIGKILL at random points of training and of (async) checkpoint saving, a sweep killed
mid-way with a diverging run in it, and a truncated data shard.

Kill test design. One run (checkpoint_every=1, so an orbax save is almost always in flight) is
SIGKILLed twice, in a random order (seed printed on failure; RELIABILITY_SEED fixes it): once a
random 2-6 steps after it (re)started, once the moment a ``<step>.orbax-checkpoint-tmp-*``
directory (a save in progress) appears. It reads its data in 2 grain workers (as the suites do),
which must end with it. After each kill the next start must resume from the newest *complete*
step directory: the first step it logs is that step + 1 (a partial save would give a later step;
no resume would give step 1). The finished run's per-step losses must equal an uninterrupted
run's (run concurrently) to 1e-6.
"""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests import helpers

TMP = ".orbax-checkpoint-tmp"
SUITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny_suite.py")


def _ckpt_entries(workdir):
  path = os.path.join(workdir, "checkpoints")
  return os.listdir(path) if os.path.isdir(path) else []


def _metric_records(workdir):
  """Every ``train/loss`` record of metrics.jsonl, in the order written (resumes repeat)."""
  path = os.path.join(workdir, "metrics.jsonl")
  out = []
  if os.path.exists(path):
    for line in open(path):
      try:
        rec = json.loads(line)
      except json.JSONDecodeError:
        continue
      if "train/loss" in rec:
        out.append(rec["step"])
  return out


def _start(workdir, flags, stderr=subprocess.PIPE):
  return subprocess.Popen(helpers.main_command(workdir, flags), cwd=helpers.ROOT,
                          env=helpers.subprocess_env(), text=True,
                          stdout=subprocess.DEVNULL, stderr=stderr)


def _stat(pid):
  """``(state, ppid)`` of ``pid`` from /proc, or None once it is gone."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])
  except (OSError, ValueError, IndexError):
    return None


def _data_workers(pid):
  """The grain worker processes of the trainer ``pid`` (multiprocessing spawn children)."""
  out = []
  for entry in os.listdir("/proc"):
    if entry.isdigit() and (_stat(entry) or (None, None))[1] == pid:
      try:
        with open(f"/proc/{entry}/cmdline", "rb") as f:
          if b"spawn_main" in f.read():
            out.append(int(entry))
      except OSError:
        pass
  return out


def _assert_workers_exit(workers, timeout=10):
  """The SIGKILLed trainer's data workers end (their exit-with-parent watch): they were left
  blocked on its batch queue for good, holding their memory. Any left are killed, then failed."""
  deadline = time.time() + timeout
  alive = lambda: [w for w in workers if (_stat(w) or ("Z",))[0] != "Z"]
  while alive() and time.time() < deadline:
    time.sleep(0.1)
  left = alive()
  for w in left:
    os.kill(w, signal.SIGKILL)
  assert not left, f"data workers {left} outlived their SIGKILLed trainer"


def _kill_when(proc, ready, timeout=240):
  deadline = time.time() + timeout
  while time.time() < deadline:
    if proc.poll() is not None:
      return False
    if ready():
      workers = _data_workers(proc.pid)
      proc.send_signal(signal.SIGKILL)
      proc.wait()
      assert workers, "the run reads in data workers (data.worker_count=2): none found"
      _assert_workers_exit(workers)
      return True
    time.sleep(0.005)
  proc.kill()
  raise AssertionError("kill point not reached")


@pytest.mark.slow
def test_sigkill_in_training_and_mid_save_resumes_exactly(tmp_path):
  steps = 24
  # Read in 2 grain worker processes, as the suites do: the resumed batches are the same.
  flags = helpers.tiny_flags(steps=steps, checkpoint_every=1, eval_every=0,
                             **{"data.worker_count": 2})
  reference = str(tmp_path / "reference")
  ref_log = open(tmp_path / "reference.log", "w+")
  ref_proc = _start(reference, helpers.tiny_flags(steps=steps, checkpoint_every=100,
                                                  eval_every=0),
                    stderr=ref_log)  # Uninterrupted, alongside the killed one.
  workdir = str(tmp_path / "killed")
  seed = int(os.environ.get("RELIABILITY_SEED", time.time_ns() % 10000))
  rng = random.Random(seed)
  plan = ["step", "save"]
  rng.shuffle(plan)
  caught_mid_save, resume_from = False, 0
  for kind in plan + ["finish"]:
    n_before = len(_metric_records(workdir))
    proc = _start(workdir, flags)
    started = lambda: len(_metric_records(workdir)) > n_before
    if kind == "finish":
      _, err = proc.communicate(timeout=300)
      assert proc.returncode == 0, err[-3000:]
    elif kind == "step":
      target = resume_from + rng.randint(2, 6)
      new_steps = lambda: _metric_records(workdir)[n_before:]
      assert _kill_when(proc, lambda: max(new_steps() or [0]) >= target), seed
    else:
      assert _kill_when(proc, lambda: started() and
                        any(TMP in e for e in _ckpt_entries(workdir))), seed
    # This start resumed from the newest complete step of the last kill, never a partial one.
    first = _metric_records(workdir)[n_before]
    assert first == resume_from + 1, (seed, kind, first, resume_from)
    if kind != "finish":
      entries = _ckpt_entries(workdir)
      caught_mid_save |= any(TMP in e for e in entries)
      resume_from = max((int(e) for e in entries if e.isdigit()), default=0)
      assert not os.path.exists(os.path.join(workdir, "summary.json"))
  assert caught_mid_save, f"seed {seed}: no kill landed during a checkpoint save"
  assert ref_proc.wait(timeout=300) == 0, open(tmp_path / "reference.log").read()[-3000:]
  assert not [e for e in _ckpt_entries(workdir) if TMP in e]
  resumed, uninterrupted = helpers.losses(workdir), helpers.losses(reference)
  assert sorted(resumed) == sorted(uninterrupted) == list(range(1, steps + 1))
  np.testing.assert_allclose([resumed[s] for s in range(1, steps + 1)],
                             [uninterrupted[s] for s in range(1, steps + 1)], rtol=1e-6)
  assert helpers.summary(workdir)["status"] == "ok"


def _sweep(results, **kwargs):
  cmd = [sys.executable, "-m", "depthbench_jax.sweep", SUITE, f"--results_dir={results}"]
  return subprocess.Popen(cmd, cwd=helpers.ROOT, env=helpers.subprocess_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kwargs)


@pytest.mark.slow
def test_sweep_goes_on_after_divergence_and_resumes_without_redoing(tmp_path):
  """Run 1 diverges (LR 1e4) and the sweep goes on; killed during run 2, the sweep restarted
  skips run 1 (its summary untouched) and finishes run 2."""
  results = str(tmp_path / "results")
  diverging, second = (os.path.join(results, f"preln_2x32_lr{lr}") for lr in ("1e4", "3e-3"))
  sweep = _sweep(results, start_new_session=True)  # Own group: the kill takes its child too.
  deadline = time.time() + 300
  while not os.path.exists(os.path.join(second, "config.json")):
    assert sweep.poll() is None and time.time() < deadline, sweep.stdout.read()[-3000:]
    time.sleep(0.02)
  os.killpg(sweep.pid, signal.SIGKILL)
  first_pass = sweep.communicate()[0]
  assert "preln_2x32_lr1e4: diverged" in first_pass, first_pass[-3000:]
  d = helpers.summary(diverging)
  assert d["status"] == "diverged" and d["diverged_step"] and d["diverged_reason"], d
  assert not os.path.exists(os.path.join(second, "summary.json"))
  mtime = os.stat(os.path.join(diverging, "summary.json")).st_mtime_ns

  resumed = _sweep(results)
  out, _ = resumed.communicate(timeout=300)
  assert resumed.returncode == 0, out[-3000:]
  assert re.findall(r"\[sweep\] \d+/\d+ (\S+)", out) == [os.path.basename(second)], out
  assert os.stat(os.path.join(diverging, "summary.json")).st_mtime_ns == mtime
  assert helpers.summary(second)["status"] == "ok"
  assert "skipped 1, ok 1, diverged 0, failed 0" in out, out[-2000:]


def test_truncated_parquet_shard_error_names_the_file(tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq
  shards = tmp_path / "shards"
  shards.mkdir()
  texts = [f"document {i}: " + "the quick brown fox jumps over the lazy dog. " * 20
           for i in range(200)]
  pq.write_table(pa.table({"text": texts}), shards / "000_good.parquet")
  pq.write_table(pa.table({"text": texts}), shards / "001_bad.parquet")
  bad = shards / "001_bad.parquet"
  data = bad.read_bytes()
  bad.write_bytes(data[: len(data) // 2])  # Truncated mid-file: no footer.
  workdir = str(tmp_path / "run")
  proc = helpers.run_main(workdir, helpers.tiny_flags(**{
      "data.source": "parquet", "data.path": str(shards),
      "data.cache_dir": str(tmp_path / "cache")}), check=False, timeout=240)
  assert proc.returncode == 2, proc.stderr[-3000:]
  lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert len(lines) == 1 and str(bad) in lines[0] and "allowed" in lines[0], proc.stderr[-3000:]
  assert not os.path.exists(os.path.join(workdir, "checkpoints"))
