"""The trainer end to end on the embedded corpus: learning, resume after SIGTERM, sharding,
multi-process, and bad configs failing before any compute. (kill -9 in a step or mid-save, then
a resume equal to the uninterrupted run: tests/reliability/test_reliability_faults.py.)"""

import json
import os
import shutil
import signal
import subprocess

import jax
import numpy as np
import pytest

from depthbench_jax.errors import ConfigError
from depthbench_jax.train import summary as summary_lib
from tests import helpers


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory):
  """One uninterrupted 20-step run that several tests compare against, trained once a session
  (``helpers.built_once_per_session``: both xdist workers run this file's tests). It reads its
  data in 2 grain workers (the suites read in 4); the runs compared with it read in none: the
  same batches, and a resume from its checkpoints may change the worker count."""
  def train(workdir):
    os.makedirs(workdir)
    proc = helpers.run_main(workdir, helpers.tiny_flags(**{"data.worker_count": 2,
                                                            "tensorboard": True}))
    with open(workdir + ".stdout", "w") as f:  # Beside the run dir: the progress lines.
      f.write(proc.stdout)
    with open(workdir + ".stderr", "w") as f:
      f.write(proc.stderr)
  return helpers.built_once_per_session(tmp_path_factory, "train_loop_reference", train)


def assert_losses_match(workdir, reference_run, rtol):
  """The train losses of steps 1..20 in ``workdir`` equal the reference run's to ``rtol``."""
  got, want = helpers.losses(workdir), helpers.losses(reference_run)
  np.testing.assert_allclose([got[s] for s in range(1, 21)], [want[s] for s in range(1, 21)],
                             rtol=rtol)


def start_then_signal(workdir, checkpoint_every, step, signum):
  """Starts the tiny run in ``workdir`` and sends ``signum`` once step ``step`` is logged. The
  run gets SIGINT's default disposition, as a terminal's foreground job has it: a suite started
  in the background (``cmd &``) ignores SIGINT, and so would the run, by design. (A Python
  handler here becomes SIG_DFL across exec; only SIG_IGN is inherited.)"""
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    proc = subprocess.Popen(
        helpers.main_command(workdir, helpers.tiny_flags(checkpoint_every=checkpoint_every)),
        cwd=helpers.ROOT, env=helpers.subprocess_env(), text=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  finally:
    signal.signal(signal.SIGINT, previous)
  helpers.wait_for_step(workdir, step, proc)
  proc.send_signal(signum)
  return proc


def test_loss_decreases_and_summary_is_complete(reference_run):
  losses = helpers.losses(reference_run)
  assert sorted(losses) == list(range(1, 21))
  assert np.mean([losses[s] for s in (18, 19, 20)]) < losses[1] - 0.5
  s = helpers.summary(reference_run)
  for key in ("params_total", "params_non_embedding", "steps", "tokens", "final_train_loss",
              "final_val_loss", "wall_time_s", "status", "config"):
    assert key in s, key
  assert s["status"] == "ok" and s["steps"] == 20 and s["tokens"] == 20 * 8 * 32
  assert s["final_val_loss"] < 5.6  # ln(257) = 5.55 at init.
  # The measured cost: wall time x devices (one session, one CPU device here).
  assert (s["devices"], s["device_kind"]) == (1, "cpu")
  assert s["max_grad_norm"] > 0 and 1 <= s["max_grad_norm_step"] <= 20
  assert s["device_hours"] == pytest.approx(s["wall_time_s"] / 3600, rel=0.05)
  from depthbench_jax import revision   # The code it trained at: this checkout's commit,
  assert s["code"] == [revision.code_revision()]   # where git can name one (README: a machine
  head = subprocess.run(["git", "-C", helpers.ROOT, "rev-parse", "HEAD"],   # with python3
                        capture_output=True, text=True)                     # alone; a tarball)
  if head.returncode == 0:
    assert s["code"][0]["commit"] == head.stdout.strip()
  assert os.listdir(os.path.join(reference_run, "tensorboard"))


def test_progress_line_of_an_eval_step_shows_that_steps_val_loss(reference_run):
  """Steps 10 and 20 evaluate; their lines showed the previous eval's val loss (none at step
  10, step 10's at the end, where summary.json has step 20's). A line between evals names the
  step its val loss is from."""
  from depthbench_jax.train.summary import read_metrics
  with open(reference_run + ".stdout") as f:
    lines = {l.split()[1]: l for l in f if l.startswith("step ") and "|" in l}
  val = read_metrics(reference_run, "val/loss")
  assert f"| val {val[10]:.4f} |" in lines["10/20"], lines["10/20"]
  assert f"| val {val[10]:.4f} (step 10) |" in lines["15/20"], lines["15/20"]  # not its own
  assert f"| val {helpers.summary(reference_run)['final_val_loss']:.4f} |" in lines["20/20"], (
      lines["20/20"])


def test_a_run_prints_no_info_logs(reference_run):
  """README: INFO logs are off unless DEPTHBENCH_VERBOSE=1. TensorFlow (imported by clu's
  writers) printed its oneDNN INFO line, after absl's "All log messages before
  absl::InitializeLog()" WARNING, twice per run, whatever TF_CPP_MIN_LOG_LEVEL said."""
  with open(reference_run + ".stderr") as f:
    err = f.read()
  assert "oneDNN" not in err and "InitializeLog" not in err, err[-2000:]


def test_developers_md_names_the_keys_a_run_writes(reference_run):
  """DEVELOPERS.md, the contract page other modules build against, named metrics.jsonl's keys
  loss, lr, ... (they are train/loss, train/lr, ...) and left n_layers, d_model, aspect_ratio and
  lr out of summary.json's."""
  import re
  with open(os.path.join(helpers.ROOT, "DEVELOPERS.md")) as f:
    text = f.read()
  metrics_doc = re.search(r"WORKDIR/metrics\.jsonl(.*?)\nWORKDIR/", text, re.S).group(1)
  summary_doc = re.search(r"`summary\.json` keys:(.*?)Recipe extras", text, re.S).group(1)
  with open(os.path.join(reference_run, "metrics.jsonl")) as f:
    metric_keys = {k for line in f for k in json.loads(line)}
  assert {k for k in metric_keys if f"`{k}`" not in metrics_doc} == set(), metrics_doc
  summary_keys = set(helpers.summary(reference_run))
  assert {k for k in summary_keys if not re.search(rf"\b{k}\b", summary_doc)} == set()


def test_steps_per_s_leaves_out_the_eval_and_save_at_step_10(reference_run):
  """Step 10 evaluates (compiling the eval step) and checkpoints; step 11's steps/s must still
  be a training step's rate (``train/throughput.py``), not one step over that pause."""
  from depthbench_jax.train.summary import read_metrics
  rate = read_metrics(reference_run, "perf/steps_per_s")
  steady = float(np.median([rate[s] for s in range(2, 21)]))
  assert rate[11] > 0.25 * steady, (rate[11], steady)


def test_tensorboard_has_one_steps_per_s_curve_the_metrics_log_has(reference_run):
  """TensorBoard carries the trainer's own scalars, and its steps/s are the clean ones of
  ``metrics.jsonl`` (no second, pause-inclusive curve such as clu's ``ReportProgress``)."""
  from tensorboard.backend.event_processing import event_accumulator
  from tensorboard.util import tensor_util
  from depthbench_jax.train.summary import read_metrics
  events = event_accumulator.EventAccumulator(os.path.join(reference_run, "tensorboard"),
                                              size_guidance={"tensors": 0})
  events.Reload()
  tags = set(events.Tags()["tensors"]) | set(events.Tags()["scalars"])
  assert {"train/loss", "train/lr", "train/grad_norm", "perf/steps_per_s", "perf/tokens_per_s",
          "val/loss"} <= tags
  assert not {t for t in tags if "per_sec" in t or "uptime" in t}, tags
  logged = read_metrics(reference_run, "perf/steps_per_s")
  written = {e.step: float(tensor_util.make_ndarray(e.tensor_proto))
             for e in events.Tensors("perf/steps_per_s")}
  assert written.keys() == logged.keys()
  np.testing.assert_allclose([written[s] for s in sorted(logged)],
                             [logged[s] for s in sorted(logged)], rtol=1e-5)


@pytest.mark.parametrize("checkpoint_every, signum", [   # 1: the signal lands on a save step
    (100, signal.SIGTERM), (1, signal.SIGTERM),
    (100, signal.SIGINT)],   # Ctrl-C: once a KeyboardInterrupt traceback, nothing saved
    ids=["sigterm", "sigterm-on-a-save-step", "ctrl-c"])
def test_sigterm_saves_and_exits_cleanly_then_resumes(reference_run, tmp_path, checkpoint_every,
                                                      signum):
  workdir = str(tmp_path / "term")
  proc = start_then_signal(workdir, checkpoint_every=checkpoint_every, step=5, signum=signum)
  assert proc.wait(timeout=120) == 0, proc.stderr.read()[-3000:]
  ckpts = [d for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit()]
  assert ckpts, "SIGTERM must leave a checkpoint"
  # The first session really stopped early (a SIGTERM ignored would finish all 20 steps, and
  # the "resume" below would train nothing and match trivially).
  assert max(map(int, ckpts)) < 20 and max(helpers.losses(workdir)) < 20
  assert not os.path.exists(os.path.join(workdir, "summary.json"))
  # Saved at the step it stopped (every step is logged), and keep_checkpoints=2 kept the newest
  # two: a save a step early, or keeping the oldest, resumed bitwise the same and passed.
  n = max(helpers.losses(workdir))
  assert sorted(map(int, ckpts)) == ([n - 1, n] if checkpoint_every == 1 else [n]), (ckpts, n)
  proc = helpers.run_main(workdir, helpers.tiny_flags(checkpoint_every=checkpoint_every),
                          PYTHONPROFILEIMPORTTIME=1)
  # Resumed (a retrain from step 1 repeats the same losses exactly).
  assert helpers.session_first_step(proc.stdout) == max(map(int, ckpts)) + 1, proc.stdout
  # README: the same config twice on one device is bitwise the same run, resumed or not (and
  # with TensorBoard or not: the reference writes it, these sessions do not, nor import
  # TensorFlow for it).
  assert_losses_match(workdir, reference_run, rtol=0)
  assert not os.path.exists(os.path.join(workdir, "tensorboard"))
  imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
              if line.startswith("import time:")]
  assert "jax" in imported and "tensorflow" not in imported
  from depthbench_jax.train import checkpoint
  _, params, _ = checkpoint.restore_run(workdir)
  _, want, _ = checkpoint.restore_run(reference_run)
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(want)))


@pytest.mark.slow
def test_sharded_2x2x2_matches_single_device(reference_run, tmp_path):
  workdir = str(tmp_path / "sharded")
  flags = helpers.tiny_flags(**{"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2})
  helpers.run_main(workdir, flags, devices=8)
  assert_losses_match(workdir, reference_run, rtol=2e-4)
  # Device-hours are the report's measured cost: wall time x every device of the mesh.
  s = helpers.summary(workdir)
  assert s["devices"] == 8
  assert s["device_hours"] == pytest.approx(8 * s["wall_time_s"] / 3600, rel=0.05)
  # The post-hoc tools read a pod's checkpoint on one device (this process has one).
  import jax
  from depthbench_jax.train import checkpoint
  _, params, step = checkpoint.restore_run(workdir)
  _, want, _ = checkpoint.restore_run(reference_run)
  assert step == 20 and jax.device_count() == 1
  for got, ref in zip(jax.tree.leaves(params), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=2e-3, atol=2e-4)


def preempted_at_step_10(run, workdir):
  """Copies the 20-step ``run`` to ``workdir`` as it stood after its step-10 checkpoint."""
  shutil.copytree(run, workdir)
  shutil.rmtree(os.path.join(workdir, "checkpoints", "20"))
  os.remove(os.path.join(workdir, "summary.json"))
  metrics = os.path.join(workdir, "metrics.jsonl")
  kept = [l for l in open(metrics) if json.loads(l)["step"] <= 10]
  with open(metrics, "w") as f:
    f.writelines(kept)


@pytest.mark.slow  # three trainer processes with TensorBoard on: ~20 s on 2 cores
def test_resume_on_other_shards_is_refused_and_on_its_own_matches(tmp_path):
  """A shard downloaded into config.data.path between a preemption and the resume gives another
  train stream and window permutation; the restored iterator position (the step) would silently
  repeat some windows and skip others. The resume is one error line, exit 2, the run directory
  untouched; with the run's two shards back it resumes and matches the uninterrupted run."""
  import pyarrow.parquet as pq
  data = tmp_path / "fineweb-edu"
  data.mkdir()
  for i in range(2):
    pq.write_table(helpers.fineweb_like(150, 150 * i), data / f"{i:03d}_00000.parquet")
  flags = helpers.tiny_flags(**{"data.source": "parquet", "data.path": str(data),
                                "data.cache_dir": str(tmp_path / "cache"), "tensorboard": True})
  reference, workdir = str(tmp_path / "reference"), str(tmp_path / "preempted")
  helpers.run_main(reference, flags)
  preempted_at_step_10(reference, workdir)
  before = helpers.snapshot(workdir)
  pq.write_table(helpers.fineweb_like(150, 300), data / "002_00000.parquet")
  proc = helpers.run_main(workdir, flags, check=False)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert len(lines) == 1 and lines[0].startswith("error: config.data.path="), proc.stderr[-2000:]
  assert "now holds 3 shards" in lines[0] and "trained on 2 shards" in lines[0], lines[0]
  assert "allowed: the data the run started with" in lines[0] and "--workdir" in lines[0]
  assert helpers.snapshot(workdir) == before
  os.remove(data / "002_00000.parquet")
  helpers.run_main(workdir, flags, DEPTHBENCH_COMMIT="f" * 40)   # resumed after a `git pull`
  assert_losses_match(workdir, reference, rtol=1e-6)
  code = helpers.summary(workdir)["code"]   # the checkpoint carried the first session's commit
  assert code == helpers.summary(reference)["code"] + [{"commit": "f" * 40, "dirty": False}]
  # TensorBoard as `--load_fast=false` loads it: the preempted session's steps 11..20 (its
  # event file, copied) give way to the resumed session's, each step once (both were shown).
  points = tensorboard_points(workdir)
  first = {step: wall_time for step, _, wall_time in tensorboard_points(reference)}
  assert [step for step, _, _ in points] == list(range(1, 21))
  assert all(w == first[s] if s <= 10 else w > max(first.values()) for s, _, w in points)
  losses = helpers.losses(workdir)
  np.testing.assert_allclose([v for _, v, _ in points], [losses[s] for s in range(1, 21)],
                             rtol=1e-6)


def tensorboard_points(workdir, tag="train/loss"):
  """``[(step, value, wall_time)]`` of ``tag`` in ``workdir/tensorboard`` as the TensorBoard UI
  loads a run without the Rust data server (the multiplexer's accumulator, which drops a run's
  points at or after the step of its second and later ``SessionLog.START`` events)."""
  from tensorboard.backend.event_processing import plugin_event_accumulator
  from tensorboard.util import tensor_util
  events = plugin_event_accumulator.EventAccumulator(os.path.join(workdir, "tensorboard"),
                                                     size_guidance={"tensors": 0})
  events.Reload()
  return [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)), e.wall_time)
          for e in events.Tensors(tag)]


def start_two_processes(workdir, flags, devices=1, flags_of_1=None, cwds=(helpers.ROOT,) * 2,
                        preexec_fn=None):
  """Two local gloo processes of ``main.py`` with ``devices`` CPU devices each (a pair: each
  process its own), process 1 with ``flags_of_1`` where given, process i started in ``cwds[i]``
  (two hosts' views of a path)."""
  import portpicker
  port = portpicker.pick_unused_port()
  devices = devices if isinstance(devices, tuple) else (devices, devices)
  return [subprocess.Popen(
      helpers.main_command(workdir, flags if i == 0 or flags_of_1 is None else flags_of_1),
      cwd=cwds[i],
      env=helpers.subprocess_env(devices[i], JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
                                 JAX_NUM_PROCESSES=2, JAX_PROCESS_ID=i),
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=preexec_fn)
      for i in range(2)]


def test_two_processes_over_a_live_trainers_lock_both_refuse_at_once(tmp_path):
  """A 2-process rerun of a run a 1-process job still trains: process 0 was refused, process 1
  got its own lock and waited on process 0 in orbax's first barrier (5 minutes, then an abort).
  Both refuse now, with the live trainer's line, and its files stay as they are."""
  from depthbench_jax.train import workdir_lock
  workdir = str(tmp_path / "live")
  os.makedirs(workdir)
  live = workdir_lock.TrainerLock(workdir, 0)   # the 1-process job's lock
  live.acquire()
  procs = []
  try:
    procs = start_two_processes(workdir, helpers.tiny_flags(steps=4))
    errors = [p.communicate(timeout=120)[1] for p in procs]
  finally:
    live.release()
    for p in procs:   # a failure leaves no process waiting in a collective for minutes
      if p.poll() is None:
        p.kill()
  assert [p.returncode for p in procs] == [2, 2], errors
  for err in errors:
    assert f"error: --workdir={workdir}: another trainer (process 0) is training in it" in err
  assert os.listdir(workdir) == [".trainer-0.lock"]   # the live one's: nothing written


def test_two_processes_given_other_configs_both_refuse_before_writing(tmp_path):
  """Two real gloo processes, one with another warmup: each gathers the other's run over JAX's
  collectives (main.check_same_run) and exits HOSTS_DIFFER naming the field, nothing written."""
  from depthbench_jax.errors import HOSTS_DIFFER
  workdir = str(tmp_path / "two_recipes")
  procs = start_two_processes(workdir, helpers.tiny_flags(warmup_steps=2),
                              flags_of_1=helpers.tiny_flags(warmup_steps=3))
  errors = [p.communicate(timeout=120)[1] for p in procs]
  assert [p.returncode for p in procs] == [HOSTS_DIFFER] * 2, errors
  assert "error: process 0 of 2 runs config.warmup_steps=2 (process 1: 3); allowed:" in errors[0]
  assert "error: process 1 of 2 runs config.warmup_steps=3 (process 0: 2); allowed:" in errors[1]
  assert not os.path.exists(workdir)


def test_two_processes_given_a_bad_config_refuse_before_making_any_folder(tmp_path):
  """main's docstring: bad input exits 2 before anything is written. On two processes the
  results-folder check (main.check_results_shared) made the workdir's parent before the
  config was validated, and a bad config left it behind."""
  workdir = str(tmp_path / "new" / "x" / "run")
  procs = start_two_processes(workdir, helpers.tiny_flags(**{"model.n_heads": 5}))
  errors = [p.communicate(timeout=120)[1] for p in procs]
  assert [p.returncode for p in procs] == [2, 2], errors
  assert all("config.model" in e and "allowed" in e for e in errors), errors
  assert not os.path.exists(tmp_path / "new")


def test_two_processes_driving_other_device_counts_both_refuse_before_writing(tmp_path):
  """One host with 1 device, the other with 2: every gather reshapes jax.devices() to
  processes x local devices, so both crashed with a traceback in the first (check_same_run's)
  and a sweep went on to fail every run. Now one line on each, HOSTS_DIFFER, nothing written."""
  from depthbench_jax.errors import HOSTS_DIFFER
  workdir = str(tmp_path / "uneven")
  procs = start_two_processes(workdir, helpers.tiny_flags(), devices=(1, 2))
  errors = [p.communicate(timeout=120)[1] for p in procs]
  assert [p.returncode for p in procs] == [HOSTS_DIFFER] * 2, errors
  for err in errors:
    assert ("error: the processes drive different numbers of devices (process 0: 1, process "
            "1: 2); allowed:" in err) and "Traceback" not in err, err[-2000:]
  assert not os.path.exists(workdir)


def test_two_processes_reading_other_shards_both_refuse_before_writing(tmp_path):
  """Two hosts with their own copies of config.data.path, one copy short of a shard (an
  interrupted rsync; here one relative path seen from two folders): each cut its rows of the
  global batch from another window permutation, repeating some windows and skipping others.
  Each process gathers the other's data fingerprint and exits HOSTS_DIFFER naming the path and
  both shard counts, before anything is written."""
  import pyarrow.parquet as pq
  from depthbench_jax.errors import HOSTS_DIFFER
  for host, shards in (("host0", 2), ("host1", 1)):
    (tmp_path / host / "shards").mkdir(parents=True)
    for i in range(shards):
      pq.write_table(helpers.fineweb_like(150, 150 * i),
                     tmp_path / host / "shards" / f"{i:03d}_00000.parquet")
  workdir = str(tmp_path / "results" / "run")
  flags = helpers.tiny_flags(**{"data.source": "parquet", "data.path": "shards",
                                "data.cache_dir": "cache"})
  procs = start_two_processes(workdir, flags, cwds=[str(tmp_path / "host0"),
                                                    str(tmp_path / "host1")])
  errors = [p.communicate(timeout=120)[1] for p in procs]
  assert [p.returncode for p in procs] == [HOSTS_DIFFER] * 2, errors
  for me, other, mine, theirs in ((0, 1, 2, 1), (1, 0, 1, 2)):
    line = [l for l in errors[me].splitlines() if l.startswith("error:")]
    assert len(line) == 1 and line[0].startswith("error: config.data.path='shards'"), errors[me]
    assert (f"process {me} of 2 reads {mine} shards" in line[0]
            and f"process {other} {theirs} shards" in line[0]), line[0]
  assert not os.path.exists(workdir)


def test_in_training_diagnostics_of_hc_finish_on_two_devices_as_diagnose_reads_them(tmp_path):
  """HC's in-training diagnostics on the mesh of 2 devices hung XLA:CPU in the effective-rank
  SVDs (0% CPU until SIGKILL; SIGTERM only set a flag). They run on one device of the process
  now, on a whole copy of the params, and log what diagnose reads off the checkpoint."""
  from depthbench_jax import diagnose
  from depthbench_jax.data import pipeline
  from depthbench_jax.train import checkpoint, summary as summary_lib
  workdir = str(tmp_path / "hc")
  flags = helpers.tiny_flags(**{"model.residual.name": "hc", "model.d_model": 128,
                                "data.seq_len": 128, "model.n_layers": 4, "steps": 6,
                                "warmup_steps": 1, "diagnostics.every": 3, "checkpoint_every": 6,
                                "eval_every": 0})
  helpers.run_main(workdir, flags, devices=2, timeout=120)
  logged = summary_lib.read_metrics(workdir, "diagnostics/erank_late")
  assert sorted(logged) == [3, 6]
  config, params, _ = checkpoint.restore_run(workdir, 6)
  batch = pipeline.make_val_batches(config, process_index=0, process_count=1)[0]
  want = diagnose.diagnose(workdir, config, params, batch, step=6)["mixing"]["erank_late"]
  np.testing.assert_allclose(logged[6], want, rtol=1e-4)


@pytest.mark.parametrize("host1_copy", ["empty", "torn"])
def test_data_one_host_alone_cannot_read_is_refused_on_both_at_once(tmp_path, host1_copy):
  """Host 1's copy of config.data.path holds no shard (main.py's config check) or a torn one
  (the trainer's read of the shards): host 1 went to its exit while host 0 waited for it in the
  next all-gather, minutes, then an abort the sweep took for hosts that never joined. Both now
  exit HOSTS_DIFFER at once, naming host 1 and its reason, before anything is written."""
  import pyarrow.parquet as pq
  from depthbench_jax.errors import HOSTS_DIFFER
  for host in ("host0", "host1"):
    (tmp_path / host / "shards").mkdir(parents=True)
  pq.write_table(helpers.fineweb_like(150, 0), tmp_path / "host0" / "shards" / "000_00000.parquet")
  if host1_copy == "torn":
    (tmp_path / "host1" / "shards" / "000_00000.parquet").write_bytes(b"PAR1 cut short")
  workdir = str(tmp_path / "results" / "run")
  flags = helpers.tiny_flags(**{"data.source": "parquet", "data.path": "shards",
                                "data.cache_dir": "cache"})
  procs = start_two_processes(workdir, flags, cwds=[str(tmp_path / "host0"),
                                                    str(tmp_path / "host1")])
  try:
    errors = [p.communicate(timeout=120)[1] for p in procs]
  finally:   # the hang this test is about leaves both running
    for p in procs:
      if p.poll() is None:
        p.kill()
  assert [p.returncode for p in procs] == [HOSTS_DIFFER] * 2, errors
  lines = [[l for l in err.splitlines() if l.startswith("error:")] for err in errors]
  assert len(lines[0]) == 1 and lines[0] == lines[1], lines
  assert lines[0][0].startswith("error: process 1 of 2 only: ") and "shards" in lines[0][0]
  assert not os.path.exists(workdir)


@pytest.mark.slow
def test_two_processes_gloo_survive_a_sigterm_to_one_and_match_one(reference_run, tmp_path):
  # JAX's preemption service: the signalled process and its peer agree on one step to save at;
  # neither is left in the next step's collective (it hung until killed before). Resumed, the
  # two-process run's losses equal the one-process reference (multi-host data and collectives).
  workdir = str(tmp_path / "two_term")
  start = lambda: start_two_processes(workdir, helpers.tiny_flags())
  procs = start()
  helpers.wait_for_step(workdir, 4, procs[0])
  procs[1].send_signal(signal.SIGTERM)
  for p in procs:
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-3000:]
  ckpts = [int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit()]
  assert ckpts and max(ckpts) < 20 and not os.path.exists(os.path.join(workdir, "summary.json"))
  outs = []
  for p in start():
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    outs.append(out)
  assert helpers.session_first_step(outs[0]) == max(ckpts) + 1, outs[0]   # resumed
  assert_losses_match(workdir, reference_run, rtol=2e-4)


def test_two_processes_save_at_one_step_on_a_ctrl_c_to_one(tmp_path):
  """README: a first Ctrl-C saves and exits cleanly. Under several processes it was Python's
  KeyboardInterrupt on each (a traceback, exit -2, the steps since the last checkpoint lost):
  now it is a SIGTERM the preemption service hears, and both save at one step."""
  workdir = str(tmp_path / "two_int")
  # As in a terminal: a suite started as a background job of a non-interactive shell
  # (`./launch/test.sh &`, as CI may) ignores SIGINT, its children inherit that, and the trainer
  # leaves an ignored SIGINT ignored (run_sweep.sh's background jobs): the run went on. (Under
  # `timeout`, which resets it, the test passed.)
  procs = start_two_processes(workdir, helpers.tiny_flags(steps=100000, checkpoint_every=100000),
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  try:
    helpers.wait_for_step(workdir, 4, procs[0])
    procs[1].send_signal(signal.SIGINT)
    for p in procs:
      _, err = p.communicate(timeout=120)
      assert p.returncode == 0, err[-3000:]
      assert "Traceback" not in err
  finally:
    for p in procs:   # a failure leaves no process waiting in a collective for minutes
      if p.poll() is None:
        p.kill()
  ckpts = [int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit()]
  assert ckpts and 4 <= max(ckpts) < 100000   # (200 steps could all train before the save)


@pytest.mark.slow
def test_resume_on_two_processes_continues_a_one_process_runs_data_and_diagnoses(reference_run,
                                                                                 tmp_path):
  """The one-process reference's step-10 checkpoint resumed as two gloo processes x 2 devices,
  mesh 1x2x2 with fsdp across the processes and in two microbatches (config.grad_accum_steps,
  which a resume may change: the same gradient): steps 11..20 read the batches the uninterrupted
  run read, none repeated or skipped (grain saves the iterator under each process count; every
  process's state is the step). The in-loop diagnostics at step 20 read params sharded across
  the processes (no process could fetch the probes' outputs: the run crashed there) from the
  global batch's first rows (they read every P-th), so their loss is diagnose's on the step-20
  checkpoint. Logged MFU divides by the peak of all 4 devices (no run had set a peak: the
  formula never ran)."""
  from tensorboard.backend.event_processing import event_accumulator
  from tensorboard.util import tensor_util
  from depthbench_jax import diagnose
  from depthbench_jax.data import pipeline
  from depthbench_jax.train import checkpoint
  workdir = str(tmp_path / "regrown")
  preempted_at_step_10(reference_run, workdir)
  flags = helpers.tiny_flags(**{"mesh.data": 1, "mesh.fsdp": 2, "mesh.tensor": 2,
                                "diagnostics.every": 10, "grad_accum_steps": 2,
                                "tensorboard": True, "peak_flops_per_device": 1e9})
  for p in start_two_processes(workdir, flags, devices=2):
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
  assert helpers.summary(workdir)["steps"] == 20
  assert_losses_match(workdir, reference_run, rtol=2e-4)
  from depthbench_jax.model.config import model_config_from
  from depthbench_jax.systems.flops import train_flops_per_token
  from depthbench_jax.train import summary
  config = checkpoint.restore_run(workdir, 20)[0]
  flops_per_step = (train_flops_per_token(model_config_from(config.model), config.data.seq_len)
                    * config.data.global_batch_size * config.data.seq_len)
  mfu, steps_per_s = (summary.read_metrics(workdir, k) for k in ("perf/mfu", "perf/steps_per_s"))
  assert sorted(mfu) and sorted(mfu) == sorted(s for s in steps_per_s if s > 10)
  for step, value in mfu.items():
    assert value == pytest.approx(steps_per_s[step] * flops_per_step / (1e9 * 4), rel=1e-6)
  # tok/s is the global batch's (8 x 32 tokens a step), not a host's nor a micro-batch's.
  tokens_per_s = summary.read_metrics(workdir, "perf/tokens_per_s")
  assert sorted(tokens_per_s) == sorted(steps_per_s) and set(mfu) <= set(tokens_per_s)
  for step, value in tokens_per_s.items():
    assert value == pytest.approx(steps_per_s[step] * 8 * 32, rel=1e-6)
  events = event_accumulator.EventAccumulator(os.path.join(workdir, "tensorboard"),
                                              size_guidance={"tensors": 0})
  events.Reload()
  logged = {e.step: float(tensor_util.make_ndarray(e.tensor_proto))
            for e in events.Tensors("diagnostics/loss")}
  config, params, _ = checkpoint.restore_run(workdir, 20)
  batch = pipeline.make_val_batches(config, process_index=0, process_count=1)[0]
  want = diagnose.diagnose(workdir, config, params, batch, step=20)["loss"]
  assert sorted(logged) == [20]
  np.testing.assert_allclose(logged[20], want, rtol=1e-4)
  # metrics.jsonl holds them too: under tensorboard=False they were computed and discarded.
  assert summary.read_metrics(workdir, "diagnostics/loss") == {20: pytest.approx(logged[20])}


@pytest.mark.parametrize("flag, field", [
    ("--config.model.n_heads=5", "config.model.n_heads"),
    ("--config.model.residual.name=resnet", "config.model.residual.name"),
    ("--config.data.source=parquet", "config.data.path"),
    ("stray", "unexpected argument 'stray': not a flag"),   # once dropped without a word
])
def test_bad_config_fails_before_compute_naming_the_field(tmp_path, flag, field):
  workdir = str(tmp_path / "bad")
  os.makedirs(workdir)
  marker = os.path.join(workdir, "summary.json")
  with open(marker, "w") as f:
    json.dump({"status": "ok", "keep": True}, f)
  proc = helpers.run_main(workdir, helpers.tiny_flags() + [flag], check=False, timeout=120)
  assert proc.returncode != 0
  lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert len(lines) == 1 and field in lines[0], proc.stderr[-2000:]
  assert "allowed" in lines[0]
  assert json.load(open(marker)) == {"status": "ok", "keep": True}
  assert not os.path.exists(os.path.join(workdir, "checkpoints"))


def test_restore_run_reads_the_step_asked_for(reference_run):
  """The reference run keeps its checkpoints at 10 and 20: ``--step`` of evaluate/diagnose."""
  from depthbench_jax.train import checkpoint
  _, params10, step10 = checkpoint.restore_run(reference_run, 10)
  _, params20, step20 = checkpoint.restore_run(reference_run)
  assert (step10, step20) == (10, 20)
  assert not all(np.array_equal(a, b) for a, b in zip(
      jax.tree.leaves(params10), jax.tree.leaves(params20)))


def test_peak_flops_by_device_kind_and_override(monkeypatch):
  # v5e reports "TPU v5 lite": its own peak, not v5p's; the config field overrides any kind.
  import types
  import jax
  from configs import base
  from depthbench_jax.train import loop
  config = base.get_config()
  # The H100 PCIe and NVL cards took the SXM's peak (MFU 24% and 15% low on them).
  for kind, want in (("TPU v5 lite", 197e12), ("TPU v5", 459e12),
                     ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12),
                     ("NVIDIA H100 NVL", 835e12), ("cpu", None)):
    monkeypatch.setattr(jax, "devices", lambda kind=kind: [types.SimpleNamespace(device_kind=kind)])
    assert loop.peak_flops_per_device(config) == want, kind
  config.peak_flops_per_device = 1e12
  assert loop.peak_flops_per_device(config) == 1e12


def test_periodic_evals_read_eval_batches_and_the_final_one_reads_all(train_in_process,
                                                                       tmp_path):
  """``eval_batches=1`` of 3 validation batches: the step-2 val loss reads one, the final val
  loss (which picks the best LR) all three, so it equals a run evaluating all three every time;
  no test had set the two apart, so a final loss over ``eval_batches`` passed."""
  runs = {}
  for eval_batches in (1, 0):   # 0: all
    config = helpers.tiny_config(steps=4, eval_every=2, checkpoint_every=4,
                                 eval_batches=eval_batches, **{"data.val_batches": 3})
    workdir = str(tmp_path / f"eval{eval_batches}")
    train_in_process(config, workdir)
    runs[eval_batches] = (summary_lib.read_metrics(workdir, "val/loss"), helpers.summary(workdir))
  (one, one_summary), (every, every_summary) = runs[1], runs[0]
  assert one[2] != every[2]                                  # step 2: 1 batch against 3
  assert one[4] == every[4] == one_summary["final_val_loss"] == every_summary["final_val_loss"]


def test_a_step_that_raises_gives_the_callers_signal_handlers_back(tmp_path, monkeypatch):
  """In-process training (a notebook) whose step raised kept the trainer's SIGINT handler:
  the caller's first Ctrl-C afterwards only set a flag nothing read."""
  from depthbench_jax.train import loop
  # A terminal's Ctrl-C (pytest under launch/test.sh in the background ignores SIGINT, which the
  # trainer then leaves alone).
  outer = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def fail(*args):
      assert signal.getsignal(signal.SIGINT) != before[signal.SIGINT]   # the trainer's, here
      raise RuntimeError("a step failed")
    monkeypatch.setattr(loop, "_global_batch", fail)
    with pytest.raises(RuntimeError, match="a step failed"):
      loop.train_and_evaluate(helpers.tiny_config(steps=4, warmup_steps=1),
                              str(tmp_path / "run"))
    assert {s: signal.getsignal(s) for s in before} == before
  finally:
    signal.signal(signal.SIGINT, outer)


def test_a_line_of_the_compile_step_alone_logs_no_rate(train_in_process, tmp_path, capsys):
  """log_every=1: the first line's window held only the compile step, and its steps/s (1 /
  the compile) reached the progress line, metrics.jsonl and TensorBoard as the run's pace."""
  config = helpers.tiny_config(steps=3, warmup_steps=1, log_every=1, checkpoint_every=3)
  workdir = str(tmp_path / "run")
  train_in_process(config, workdir)
  rates = summary_lib.read_metrics(workdir, "perf/steps_per_s")
  assert sorted(rates) == [2, 3] and all(r > 0 for r in rates.values())
  first = [l for l in capsys.readouterr().out.splitlines() if l.startswith("step 1/3 (")][0]
  assert "steps/s from the next line" in first and first.endswith("ETA ?"), first


def test_with_periodic_evals_off_the_final_val_loss_is_still_logged(train_in_process, tmp_path,
                                                                     capsys):
  """``eval_every=0``: the final val loss reached summary.json and the report, but no progress
  line, metrics.jsonl or TensorBoard; it is logged at the last step like a periodic one."""
  config = helpers.tiny_config(steps=4, eval_every=0, checkpoint_every=4)
  workdir = str(tmp_path / "run")
  train_in_process(config, workdir)
  logged = summary_lib.read_metrics(workdir, "val/loss")
  assert logged == {4: helpers.summary(workdir)["final_val_loss"]}
  last = [l for l in capsys.readouterr().out.splitlines() if l.startswith("step 4/4")][-1]
  assert f"val {logged[4]:.4f}" in last, last


def test_a_resume_under_a_larger_log_every_drops_the_abandoned_sessions_later_records(
    reference_run, train_in_process, tmp_path):
  """A session that logged steps 11..20 past its step-10 checkpoint, then was lost; the resume
  logs every 7 steps (14, 20). Only a step going back marked a new session, so 11..13 and 15..19
  of the lost session stayed in the run's history (NaNs, after a divergence). Each session's
  first line now says where it starts."""
  workdir = str(tmp_path / "lost")
  shutil.copytree(reference_run, workdir)
  shutil.rmtree(os.path.join(workdir, "checkpoints", "20"))
  os.remove(os.path.join(workdir, "summary.json"))
  train_in_process(helpers.tiny_config(log_every=7, tensorboard=True), workdir)
  got, want = helpers.losses(workdir), helpers.losses(reference_run)
  assert sorted(got) == list(range(1, 11)) + [14, 20]
  np.testing.assert_allclose([got[s] for s in got], [want[s] for s in got], rtol=1e-6)


def test_a_finished_run_whose_checkpoints_were_deleted_is_still_finished(train_in_process,
                                                                        tmp_path, capsys):
  """Checkpoints deleted to free disk, config.json and summary.json kept: the same command
  trained it again from scratch and set its result aside (README: a finished run 'says so and
  changes nothing'). Under another recipe it is refused, as a resume would be."""
  config = helpers.tiny_config(steps=4, checkpoint_every=4)
  workdir = str(tmp_path / "run")
  train_in_process(config, workdir)
  shutil.rmtree(os.path.join(workdir, "checkpoints"))
  before = helpers.snapshot(workdir)
  capsys.readouterr()
  assert train_in_process(config, workdir)["steps"] == 4
  assert "finished at step 4 (summary.json; its checkpoints are gone); nothing to train" in (
      capsys.readouterr().out)
  assert helpers.snapshot(workdir) == before
  for other in ({"lr": 0.5}, {"steps": 8}):   # more steps: it trained again from scratch
    with pytest.raises(ConfigError, match=rf"config.{next(iter(other))}="):
      train_in_process(helpers.tiny_config(**{"steps": 4, "checkpoint_every": 4, **other}),
                       workdir)
    assert helpers.snapshot(workdir) == before



def test_a_resume_without_config_json_checks_the_recipe_its_checkpoint_records(
    reference_run, train_in_process, tmp_path):
  """config.json deleted: the resume's recipe check was skipped, and steps 11-20 trained at
  another LR than 1-10 in one run. Each checkpoint now records the config it was trained
  with, and the resume is refused as with config.json there."""
  workdir = str(tmp_path / "no_config")
  preempted_at_step_10(reference_run, workdir)
  os.remove(os.path.join(workdir, "config.json"))
  before = helpers.snapshot(workdir)
  with pytest.raises(ConfigError, match=r"config.lr=0.5"):
    train_in_process(helpers.tiny_config(lr=0.5, tensorboard=True), workdir)
  assert helpers.snapshot(workdir) == before


def test_a_second_trainer_in_a_workdir_is_refused_before_it_writes(train_in_process, tmp_path):
  """A rerun while a run still trains (a nohup job; a sweep orphaned by a killed run_sweep.sh)
  trained beside it: each deleted the other's checkpoints and their metrics.jsonl lines
  interleaved. The second is one error naming --workdir, and writes nothing; once the first
  lets go, the same command trains."""
  from depthbench_jax.train import workdir_lock
  workdir = str(tmp_path / "run")
  os.makedirs(workdir)
  first = workdir_lock.TrainerLock(workdir, 0)
  first.acquire()
  config = helpers.tiny_config(steps=4, checkpoint_every=4, eval_every=0)
  with pytest.raises(ConfigError, match=rf"^--workdir={workdir}: another trainer \(process 0\) "
                                        r"is training in it .*; allowed: one trainer per run"):
    train_in_process(config, workdir)
  assert os.listdir(workdir) == [".trainer-0.lock"]
  first.release()
  assert train_in_process(config, workdir)["status"] == "ok"
  # Released when the trainer returns: the lock is free again.
  again = workdir_lock.TrainerLock(workdir, 0)
  again.acquire()
  again.release()


def test_a_workdir_one_process_cannot_make_is_refused_by_the_agreed_lock(tmp_path,
                                                                         monkeypatch):
  """The trainer made its folder before the agreed lock: a host that could not (a PermissionError
  on process 1 only) raised a traceback and exited while the others waited in the lock's
  gather. The lock makes the folder itself, so the error is its ConfigError (agreed: every
  process raises it)."""
  from depthbench_jax.train import workdir_lock
  workdir = str(tmp_path / "results" / "run")
  real = os.makedirs

  def refused(path, *args, **kwargs):
    if path == workdir:
      raise PermissionError(13, "Permission denied", path)
    return real(path, *args, **kwargs)

  monkeypatch.setattr(workdir_lock.os, "makedirs", refused)
  with pytest.raises(ConfigError, match=rf"^--workdir={workdir}: cannot lock .*Permission "
                                        rf"denied: {workdir}\); allowed: a folder this"):
    workdir_lock.TrainerLock(workdir, 1).acquire_agreed(1)
  monkeypatch.setattr(workdir_lock.os, "makedirs", real)
  lock = workdir_lock.TrainerLock(workdir, 1)
  lock.acquire_agreed(1)   # made, then locked
  assert lock.held and os.listdir(workdir) == [".trainer-1.lock"]
  lock.release()


def test_a_trainer_holds_its_workdir_lock_at_every_save_and_its_summary(train_in_process,
                                                                       tmp_path, monkeypatch):
  """The refusal tests faked the first trainer with a bare lock: a trainer that released its
  own at once (or locked only an existing lock file, none in a fresh workdir) passed them. At
  each checkpoint save and the summary write, another lock on the workdir is refused."""
  from depthbench_jax.train import checkpoint, loop, summary as summary_lib, workdir_lock
  workdir = str(tmp_path / "fresh")
  held = []

  def locked_then(real):
    def call(*args, **kwargs):
      try:
        workdir_lock.TrainerLock(workdir, 0).acquire()
        held.append(False)
      except ConfigError:
        held.append(True)
      return real(*args, **kwargs)
    return call

  monkeypatch.setattr(loop.checkpoint, "save", locked_then(checkpoint.save))
  monkeypatch.setattr(loop.summary, "write", locked_then(summary_lib.write))
  config = helpers.tiny_config(steps=4, checkpoint_every=2, eval_every=0)
  assert train_in_process(config, workdir)["status"] == "ok"
  assert held == [True, True, True]   # saves at steps 2 and 4, then the summary
