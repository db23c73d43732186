"""Divergence: the guard sees every step, a diverged run keeps its last good checkpoint and
records the step and reason; skip-step rides over a transient non-finite step.

The NaN comes from ``config.debug.nan_at_step`` (an out-of-vocabulary token in that step's
batch), so the loss and every gradient of that step are NaN, as in a real blow-up. A real
divergence (LR 1e4) goes through the sweep in ``test_reliability_faults.py``.
"""

import json
import math
import os
import shutil
import time

import jax
import numpy as np
import pytest

from depthbench_jax.errors import ConfigError
from depthbench_jax.train import checkpoint, summary
from tests import helpers


def test_nan_step_marks_diverged_and_keeps_last_good_checkpoint(train_in_process, tmp_path):
  workdir = str(tmp_path / "nan")
  # Step 7 is neither a log nor a checkpoint step: the guard must still see it, and stop
  # before the checkpoint of step 9 would be written.
  config = helpers.tiny_config(steps=12, log_every=4, checkpoint_every=3, eval_every=0,
                               keep_checkpoints=5, **{"debug.nan_at_step": 7})
  result = train_in_process(config, workdir)
  s = helpers.summary(workdir)
  assert s["status"] == result["status"] == "diverged"
  assert s["diverged_step"] == 7 and "non-finite loss" in s["diverged_reason"], s
  # No final losses: step 8's NaN, or a pre-divergence value that depends on where the run was
  # last resumed, would have been set in runs.csv beside the finished runs' losses.
  assert s["final_train_loss"] is None and s["final_val_loss"] is None
  tokens_per_step = config.data.global_batch_size * config.data.seq_len
  assert (s["steps"], s["tokens"]) == (7, 7 * tokens_per_step)   # not the 8 the loop reached
  assert s["last_checkpoint_step"] == 6 and summary.checkpoint_steps(workdir) == [3, 6]
  assert summary.read_json(os.path.join(workdir, "status.json"))["step"] == 7
  _, params = checkpoint.restore_params(workdir)
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))
  losses = helpers.losses(workdir)
  # Step 8 (a log step) ran before the guard saw step 7: logged, never checkpointed.
  assert sorted(losses) == [4, 8] and math.isfinite(losses[4]) and math.isnan(losses[8])


def test_a_nan_first_seen_at_a_checkpoint_step_is_not_saved(train_in_process, tmp_path):
  """Step 5's NaN reaches the host at step 6, a checkpoint step: the guard reads it before the
  save, so checkpoint 6 (NaN params) is never written. The other diverging tests first see
  their bad step at a step that saves nothing, so a save ahead of the guard passed them."""
  workdir = str(tmp_path / "nan_at_save")
  config = helpers.tiny_config(steps=12, log_every=4, checkpoint_every=3, eval_every=0,
                               keep_checkpoints=5, **{"debug.nan_at_step": 5})
  train_in_process(config, workdir)
  s = helpers.summary(workdir)
  assert (s["status"], s["diverged_step"], s["last_checkpoint_step"]) == ("diverged", 5, 3)
  assert summary.checkpoint_steps(workdir) == [3]
  assert sorted(helpers.losses(workdir)) == [4]


def test_the_same_command_on_a_diverged_run_trains_nothing(train_in_process, tmp_path, capsys):
  """Run again with the same rules it retrained from its last checkpoint to the same NaN,
  adding the time to wall_time_s and device-hours. Now it says so and changes nothing; with
  other divergence settings (here: skip the bad step) it resumes from step 6 and finishes."""
  workdir = str(tmp_path / "again")
  config = helpers.tiny_config(steps=12, checkpoint_every=3, eval_every=0,
                               **{"debug.nan_at_step": 7})
  train_in_process(config, workdir)
  before = {name: open(os.path.join(workdir, name), "rb").read()
            for name in ("summary.json", "metrics.jsonl")}
  capsys.readouterr()
  result = train_in_process(config, workdir)
  assert result["status"] == "diverged" and result["diverged_step"] == 7
  assert "diverged at step 7 (non-finite loss" in capsys.readouterr().out
  assert all(open(os.path.join(workdir, name), "rb").read() == data
             for name, data in before.items())
  config.skip_nonfinite_steps = True
  result = train_in_process(config, workdir)
  assert result["status"] == "ok" and result["steps"] == 12 and result["skipped_steps"] == 1
  assert helpers.session_first_step(capsys.readouterr().out) == 7   # resumed from step 6


def test_a_diverged_run_resumed_and_interrupted_is_not_left_done(train_in_process, tmp_path,
                                                                 monkeypatch, capsys):
  """Resumed under other divergence rules and stopped at step 9 (a SIGTERM), the run kept its
  old summary 'diverged at step 7', which the sweep counts as done: skipped for good with a
  checkpoint at 9. The earlier summary and status now move aside when training starts, and the
  sweep sees a run to resume."""
  from depthbench_jax import sweep
  from depthbench_jax.train import loop
  workdir = str(tmp_path / "resumed")
  config = helpers.tiny_config(steps=12, checkpoint_every=3, eval_every=0,
                               **{"debug.nan_at_step": 7})
  train_in_process(config, workdir)
  diverged = helpers.summary(workdir)
  config.skip_nonfinite_steps = True
  capsys.readouterr()
  with monkeypatch.context() as m:
    m.setattr(loop._Preemption, "reached", lambda self, step: step == 9)
    assert train_in_process(config, workdir)["status"] == "interrupted"
  out = capsys.readouterr().out
  assert helpers.session_first_step(out) == 7   # resumed from step 6
  assert f"{workdir}: saved at step 9 of 12; the same command resumes it" in out
  assert summary.checkpoint_steps(workdir)[-1] == 9
  assert sweep.run_state(workdir) == "partial"
  assert summary.read_json(os.path.join(workdir, "summary.previous.json")) == diverged
  assert os.path.exists(os.path.join(workdir, "status.previous.json"))
  # The first command again (its rules call step 7 a divergence): it trained on from step 9
  # through no divergence to 'ok' with a skipped step; it is the run's verdict, put back. Not
  # while a session trains there (it wrote the diverged summary under the live one).
  config.skip_nonfinite_steps = False
  from depthbench_jax.train import workdir_lock
  live = workdir_lock.TrainerLock(workdir, 0)
  live.acquire()
  with pytest.raises(ConfigError, match="another trainer"):
    train_in_process(config, workdir)
  live.release()
  assert not os.path.exists(os.path.join(workdir, "summary.json"))
  assert train_in_process(config, workdir) == diverged
  assert "diverged at step 7 (non-finite loss" in capsys.readouterr().out
  assert helpers.summary(workdir) == diverged and sweep.run_state(workdir) == "done"
  assert not os.path.exists(os.path.join(workdir, "summary.previous.json"))
  assert os.path.exists(os.path.join(workdir, "status.json"))
  config.skip_nonfinite_steps = True
  assert train_in_process(config, workdir)["status"] == "ok"
  assert helpers.session_first_step(capsys.readouterr().out) == 10
  assert sweep.run_state(workdir) == "done"


@pytest.mark.parametrize("checkpoint_every", [3, 100])
def test_a_diverged_run_retrained_under_other_rules_keeps_its_sessions_time(
    train_in_process, tmp_path, checkpoint_every):
  """The retrained session took its earlier time from the checkpoint it resumed from: the
  diverged session's time past its last save (all of it, diverged before the first) left the
  run's wall time and device-hours, which README sums over every session. (The diverged
  summary's figures are made large here, so the count cannot be this session's own.)"""
  workdir = str(tmp_path / f"run{checkpoint_every}")
  config = helpers.tiny_config(steps=12, checkpoint_every=checkpoint_every, eval_every=0,
                               **{"debug.nan_at_step": 7})
  assert train_in_process(config, workdir)["status"] == "diverged"
  path = os.path.join(workdir, "summary.json")
  diverged = dict(summary.read_json(path), wall_time_s=5000.0, device_hours=3.0)
  summary.atomic_write_json(path, diverged)
  config.skip_nonfinite_steps = True
  done = train_in_process(config, workdir)
  assert done["status"] == "ok" and done["skipped_steps"] == 1
  assert 5000 < done["wall_time_s"] < 5000 + 600
  assert 3.0 < done["device_hours"] < 3.0 + 600 / 3600


def test_a_resumed_sessions_progress_lines_show_the_last_eval_before_it(train_in_process,
                                                                         tmp_path, monkeypatch,
                                                                         capsys):
  """Stopped at step 5 after the eval at step 4, the resumed session's lines showed no val
  until its own eval at step 8; they now show step 4's, named."""
  from depthbench_jax.train import loop
  workdir = str(tmp_path / "vals")
  config = helpers.tiny_config(steps=10, eval_every=4, checkpoint_every=100, log_every=1)
  with monkeypatch.context() as m:
    m.setattr(loop._Preemption, "reached", lambda self, step: step == 5)
    assert train_in_process(config, workdir)["status"] == "interrupted"
  capsys.readouterr()
  train_in_process(config, workdir)
  lines = {l.split()[1]: l for l in capsys.readouterr().out.splitlines() if l.startswith("step ")}
  val4 = summary.read_metrics(workdir, "val/loss")[4]
  assert f"| val {val4:.4f} (step 4) |" in lines["6/10"], lines["6/10"]
  assert "(step" not in lines["8/10"].split("| val ")[1].split("|")[0]   # its own eval
  # The session's own clock: step 6 is its compile (no rate, no ETA yet), step 7 its first rate
  # and ETA. Counted from 0 after the resume, step 6 read 5 steps in no time, and ETA stayed '?'.
  assert lines["6/10"].endswith("| steps/s from the next line | ETA ?"), lines["6/10"]
  assert "steps/s" in lines["7/10"] and not lines["7/10"].endswith("ETA ?"), lines["7/10"]
  assert 6 not in summary.read_metrics(workdir, "perf/steps_per_s")


def test_skip_nonfinite_steps_rides_over_one_bad_step(train_in_process, tmp_path):
  workdir = str(tmp_path / "skip")
  config = helpers.tiny_config(steps=10, checkpoint_every=5, eval_every=0,
                               skip_nonfinite_steps=True, **{"debug.nan_at_step": 4})
  train_in_process(config, workdir)
  s = helpers.summary(workdir)
  assert s["status"] == "ok" and s["skipped_steps"] == 1 and s["diverged_step"] is None, s
  losses = helpers.losses(workdir)
  assert math.isnan(losses[4]) and all(math.isfinite(losses[k]) for k in losses if k != 4)
  assert losses[10] < losses[1]
  assert s["last_checkpoint_step"] == 10
  # The skipped step held the LR schedule back by one: the logged LR is the one applied.
  lrs = summary.read_metrics(workdir, "train/lr")
  assert lrs[5] == lrs[4] and lrs[4] != lrs[3] and lrs[6] != lrs[5]
  # ... and is the schedule's own value (the relative checks held under any constant shift):
  # logged step k applies count k - 1, and k - 2 after the skipped step 4.
  from depthbench_jax.train import optimizer
  want = optimizer.lr_schedule(config, 10)
  assert lrs[1] == 0.0 and len(lrs) == 10
  for k, lr in lrs.items():
    assert lr == pytest.approx(float(want(k - 1 if k <= 4 else k - 2)), rel=1e-6), k


def test_a_resumed_run_keeps_its_skipped_steps_wall_time_and_best_loss(train_in_process,
                                                                         tmp_path):
  # Steps 1-5 run (step 4 skipped), the checkpoint at 5 carries the run's progress; the
  # session that went on to 10 is lost (its checkpoint and summary removed), and a new session
  # resumes at 5: the summary counts the skipped step and the first session's time.
  workdir = str(tmp_path / "resume")
  config = helpers.tiny_config(steps=10, checkpoint_every=5, eval_every=0, keep_checkpoints=5,
                               skip_nonfinite_steps=True, **{"debug.nan_at_step": 4})
  train_in_process(config, workdir)
  manager = checkpoint.make_manager(workdir, keep=5, async_save=False)
  progress = checkpoint.restore_progress(manager, 5)
  assert progress["skipped_steps"] == 1 and progress["wall_time_s"] > 0
  assert progress["device_seconds"] == pytest.approx(progress["wall_time_s"] * jax.device_count(),
                                                     rel=1e-3)   # read microseconds apart
  assert math.isfinite(progress["best_loss"])
  guard = _guard()
  guard.resume(progress)
  assert guard.best == progress["best_loss"] and guard.skipped == 1
  manager.delete(10)
  manager.wait_until_finished()
  os.remove(os.path.join(workdir, "summary.json"))
  config.debug.nan_at_step = 0   # the second session does not replay step 4
  started = time.time()
  train_in_process(config, workdir)
  elapsed = time.time() - started
  s = helpers.summary(workdir)
  assert s["status"] == "ok" and s["skipped_steps"] == 1
  # Both sessions counted: this session's own time is at most ``elapsed``, so a total above
  # it holds the first session's (``> progress`` held for this session alone when it ran longer).
  assert elapsed < s["wall_time_s"] <= progress["wall_time_s"] + elapsed
  assert elapsed * jax.device_count() < s["device_hours"] * 3600


def test_a_run_killed_after_its_last_checkpoint_keeps_its_final_train_loss(train_in_process,
                                                                           tmp_path, capsys):
  # Killed after the final step's save but before summary.json (e.g. in the final eval): the
  # next session restores step 10 and trains no step, and its summary still has the loss
  # logged at step 10 (metrics.jsonl), not None.
  workdir = str(tmp_path / "last")
  config = helpers.tiny_config(steps=10, checkpoint_every=5, eval_every=0)
  train_in_process(config, workdir)
  first = helpers.summary(workdir)
  os.remove(os.path.join(workdir, "summary.json"))
  capsys.readouterr()
  train_in_process(config, workdir)
  assert helpers.session_first_step(capsys.readouterr().out) is None   # no step trained
  s = helpers.summary(workdir)
  assert s["steps"] == 10 and s["final_train_loss"] is not None
  assert s["final_train_loss"] == first["final_train_loss"]
  assert s["final_val_loss"] == pytest.approx(first["final_val_loss"], rel=1e-6)


def test_a_latest_checkpoint_without_its_commit_marker_is_one_clear_error(train_in_process,
                                                                          tmp_path):
  # checkpoints/10 lost its contents (a copy or a filesystem cut short; orbax writes
  # commit_success.txt last): resuming names it and the complete step 5 instead of raising an
  # orbax KeyError mid-restore, and touches nothing.
  workdir = str(tmp_path / "uncommitted")
  config = helpers.tiny_config(steps=10, checkpoint_every=5, eval_every=0, keep_checkpoints=5)
  train_in_process(config, workdir)
  os.remove(os.path.join(workdir, "summary.json"))
  step_dir = os.path.join(workdir, "checkpoints", "10")
  for name in os.listdir(step_dir):
    path = os.path.join(step_dir, name)
    shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
  before = open(os.path.join(workdir, "config.json")).read()
  with pytest.raises(ConfigError, match=r"checkpoints/10 .*commit_success.txt.*step 5"):
    train_in_process(config, workdir)
  assert open(os.path.join(workdir, "config.json")).read() == before
  assert not os.path.exists(os.path.join(workdir, "summary.json"))


def test_a_committed_checkpoint_that_lost_its_array_files_is_one_clear_error(train_in_process,
                                                                            tmp_path):
  """checkpoints/10 kept its commit marker but lost its array data (a copy cut short): diagnose,
  evaluate and a resume raised a tensorstore 'NOT_FOUND' traceback from orbax; each now names
  the step and the earlier checkpoint to read or resume from instead."""
  from depthbench_jax.train import checkpoint
  workdir = str(tmp_path / "damaged")
  config = helpers.tiny_config(steps=10, checkpoint_every=5, eval_every=0, keep_checkpoints=5)
  train_in_process(config, workdir)
  data = os.path.join(workdir, "checkpoints", "10", "state", "d")
  assert os.listdir(data)
  shutil.rmtree(data)
  with pytest.raises(ConfigError, match=r"^--workdir=.*: checkpoint 10 cannot be read \(.*\); "
                                        r"allowed: --step=5 \(an earlier checkpoint\)$"):
    checkpoint.restore_run(workdir)
  assert checkpoint.restore_run(workdir, 5)[2] == 5
  # The trainer resuming it (its summary gone): the same line, with the way to resume.
  os.remove(os.path.join(workdir, "summary.json"))
  with pytest.raises(ConfigError, match=rf"^--workdir={workdir}: checkpoint 10 cannot be read "
                                        r"\(.*\); allowed: .*checkpoints/10 moved aside, to resume "
                                        r"from step 5, or a new --workdir$"):
    train_in_process(config, workdir)


def test_a_finished_run_run_again_trains_nothing_and_keeps_its_files(train_in_process, tmp_path,
                                                                      capsys):
  # main.py on a finished run restored the last checkpoint, evaluated again and rewrote
  # summary.json with the restart's seconds added to wall_time_s (28 s became 36 s). It now
  # says the run is finished and leaves every file as it was.
  workdir = str(tmp_path / "done")
  config = helpers.tiny_config(steps=6, checkpoint_every=3, eval_every=0)
  train_in_process(config, workdir)
  before = helpers.snapshot(workdir)
  capsys.readouterr()
  result = train_in_process(config, workdir)
  out = capsys.readouterr().out
  assert f"{workdir}: finished at step 6 (summary.json); nothing to train" in out
  assert helpers.snapshot(workdir) == before
  assert result == helpers.summary(workdir)


def test_no_validation_batches_means_no_val_loss(train_in_process, tmp_path):
  # data.val_batches=0 is allowed: the run has no val loss (None), never a 0.0 that would win
  # every best-LR selection.
  workdir = str(tmp_path / "noval")
  config = helpers.tiny_config(steps=4, checkpoint_every=4, eval_every=2,
                               **{"data.val_batches": 0})
  result = train_in_process(config, workdir)
  s = helpers.summary(workdir)
  assert s["status"] == "ok" and s["final_val_loss"] is None and result["final_val_loss"] is None
  from depthbench_jax.sweep import is_usable
  assert not is_usable(s)


def _guard(**div):
  skip = div.pop("skip", False)
  return summary.DivergenceGuard(helpers.tiny_config(
      skip_nonfinite_steps=skip, **{f"divergence.{k}": v for k, v in div.items()}))


def test_the_guard_keeps_the_largest_finite_gradient_norm_across_a_resume():
  """A gradient explosion that clipping absorbs stops nothing (DepthBench's HC at its widest
  500M shape): the largest pre-clip norm and its step are kept, across a checkpoint."""
  step = lambda s, g: (s, {"loss": 3.0, "grad_norm": g})
  guard = _guard(skip=True)
  assert guard.check_steps([step(1, 2.0), step(2, 250.0), step(3, math.nan), step(4, 1.0)]) is None
  assert (guard.max_grad_norm, guard.max_grad_norm_step) == (250.0, 2)
  resumed = _guard(skip=True)
  resumed.resume(json.loads(json.dumps(guard.progress())))
  resumed.check_steps([step(5, 9.0)])
  assert (resumed.max_grad_norm, resumed.max_grad_norm_step) == (250.0, 2)
  resumed.check_steps([step(6, 900.0)])
  assert (resumed.max_grad_norm, resumed.max_grad_norm_step) == (900.0, 6)


def test_a_run_of_skipped_steps_goes_on_counting_across_a_resume():
  """max_skipped_steps=2: two non-finite steps, a checkpoint, a resume, a third: the run
  diverges as it would have uninterrupted (the count in a row restarted at 0 on resume)."""
  bad = {"loss": math.nan, "grad_norm": math.nan}
  whole, first = _guard(skip=True, max_skipped_steps=2), _guard(skip=True, max_skipped_steps=2)
  assert whole.check_steps([(s, bad) for s in (1, 2)]) is None
  assert first.check_steps([(s, bad) for s in (1, 2)]) is None
  resumed = _guard(skip=True, max_skipped_steps=2)
  resumed.resume(json.loads(json.dumps(first.progress())))   # as the checkpoint stores it
  assert whole.check_steps([(3, bad)]) == resumed.check_steps([(3, bad)]) is not None
  assert resumed.skipped == whole.skipped == 3
  fresh = _guard(skip=True, max_skipped_steps=2)
  fresh.resume({"best_loss": None, "skipped_steps": 2})      # a checkpoint from before the field
  assert fresh.check_steps([(3, bad)]) is None


def test_guard_spike_after_min_steps_only():
  guard = _guard(spike_factor=2.0, min_steps=3)
  assert guard.check_steps([(1, {"loss": 5.0, "grad_norm": 1.0}),
                            (2, {"loss": 11.0, "grad_norm": 1.0})]) is None  # Before min_steps.
  assert guard.check_steps([(3, {"loss": 4.0, "grad_norm": 1.0}),
                            (4, {"loss": 8.5, "grad_norm": 1.0}),
                            (5, {"loss": float("nan"), "grad_norm": 1.0})]).startswith("loss spike")
  assert guard.step == 4  # The first bad step wins.


def test_guard_measures_against_the_best_loss_from_min_steps_on():
  step = lambda s, loss: (s, {"loss": loss, "grad_norm": 1.0})
  # A slow climb: 4.5 is 1.5x the last loss but 2.25x the best (2.0).
  guard = _guard(spike_factor=2.0, min_steps=0)
  assert guard.check_steps([step(1, 2.0), step(2, 3.0), step(3, 4.5)]).startswith("loss spike")
  assert guard.step == 3
  guard = _guard(spike_factor=2.0, min_steps=3)   # step 3 is the first one checked
  assert guard.check_steps([step(1, 5.0), step(2, 5.0), step(3, 10.5)]).startswith("loss spike")
  assert guard.step == 3


def test_metrics_log_last_record_of_a_step_wins(tmp_path):
  """A resumed run logs the steps after its checkpoint again: the later values are the run's."""
  (tmp_path / "metrics.jsonl").write_text('{"step": 12, "train/loss": 4.30}\n'
                                          '{"step": 11, "train/loss": 4.40}\n'
                                          '{"step": 12, "train/loss": 4.25}\n')
  assert summary.read_metrics(str(tmp_path)) == {11: 4.40, 12: 4.25}
  # A session killed at 1050 and resumed from checkpoint 1000 has reached 1020: the killed
  # session's 1030-1050 are not the run's (the report's last logged step read 1050).
  killed = [f'{{"step": {s}, "train/loss": 3.0}}\n' for s in (1000, 1030, 1050)]
  (tmp_path / "metrics.jsonl").write_text("".join(killed) + '{"step": 1010, "train/loss": 2.9}\n'
                                          '{"step": 1010, "val/loss": 3.1}\n'
                                          '{"step": 1020, "train/loss": 2.8}\n')
  assert summary.read_metrics(str(tmp_path)) == {1000: 3.0, 1010: 2.9, 1020: 2.8}
  assert summary.read_metrics(str(tmp_path), "val/loss") == {1010: 3.1}


def test_metrics_log_after_a_torn_last_line_keeps_the_next_record(tmp_path):
  """A kill mid-write leaves a last line without its newline; the resumed run's first record
  must start a line of its own, not be glued onto the torn one and lost with it."""
  (tmp_path / "metrics.jsonl").write_text('{"step": 20, "train/loss": 4.40}\n{"step": 25, "tr')
  summary.MetricsLog(str(tmp_path)).append(25, {"train/loss": 4.25})
  assert summary.read_metrics(str(tmp_path)) == {20: 4.40, 25: 4.25}


def test_guard_nonfinite_gradient_and_skip_limit():
  guard = _guard()
  assert "gradient" in guard.check(3, 5.0, float("inf")) and guard.step == 3
  guard = _guard(skip=True, max_skipped_steps=2)
  nan = {"loss": float("nan"), "grad_norm": float("nan")}
  ok = {"loss": 5.0, "grad_norm": 1.0}
  assert guard.check_steps([(1, nan), (2, nan), (3, ok), (4, nan), (5, nan)]) is None
  assert guard.skipped == 4
  assert "max_skipped_steps=2" in guard.check_steps([(6, nan)]) and guard.step == 6
