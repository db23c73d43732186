"""The run directory's records: atomic JSON writes, the checkpoint steps, the summary's fields,
and metrics.jsonl as a resumed (or killed) run leaves it."""

import json
import os
import types

import ml_collections
import numpy as np
import pytest

from depthbench_jax.train import summary

MODEL = types.SimpleNamespace(design="hc", n_layers=4, d_model=64)


def _config(name=""):
  return ml_collections.ConfigDict({"name": name, "lr": 3e-4, "steps": 10})


class _Unprintable:
  def __str__(self):
    raise RuntimeError("killed mid-write")


def test_atomic_write_replaces_whole_files_only(tmp_path, monkeypatch):
  """A write that fails half way leaves the previous file as it was; neither a good nor a failed
  one leaves a temp file behind; what JSON cannot hold (numpy scalars) is stored as strings."""
  path = str(tmp_path / "summary.json")
  summary.atomic_write_json(path, {"b": 1, "a": np.float32(1.5)})
  assert json.load(open(path)) == {"a": "1.5", "b": 1} and os.listdir(tmp_path) == ["summary.json"]
  with pytest.raises(RuntimeError):
    summary.atomic_write_json(path, {"a": 2, "z": _Unprintable()})
  assert json.load(open(path)) == {"a": "1.5", "b": 1} and os.listdir(tmp_path) == ["summary.json"]
  # That failure comes before any file is opened (serialised first): a write that fails in the
  # file itself (a lone surrogate cannot be encoded), or at the rename, keeps the old file too
  # and leaves no temp file (writing straight into the target, or no cleanup, passed the above).
  with pytest.raises(UnicodeEncodeError):
    summary.atomic_write_text(path, '{"a": 3} \ud800')
  assert json.load(open(path)) == {"a": "1.5", "b": 1} and os.listdir(tmp_path) == ["summary.json"]
  def full_disk(*args):
    raise OSError(28, "No space left on device")
  monkeypatch.setattr(summary.os, "replace", full_disk)
  with pytest.raises(OSError):
    summary.atomic_write_json(path, {"a": 4})
  monkeypatch.undo()
  assert json.load(open(path)) == {"a": "1.5", "b": 1} and os.listdir(tmp_path) == ["summary.json"]


def test_run_name_is_the_configs_or_design_depth_width():
  assert summary.run_name(_config(), MODEL) == "hc_4x64"
  assert summary.run_name(_config("hc_4x64_lr3e-4"), MODEL) == "hc_4x64_lr3e-4"


def test_build_fills_the_summary_and_a_guard_with_a_reason_marks_it_diverged():
  counts = {"total": 1000, "non_embedding": 400}
  kw = dict(steps=10, tokens=640, final_train_loss=3.0, final_val_loss=3.5, wall_time_s=2.0,
            status="ok", last_checkpoint_step=10)
  out = summary.build(_config(), MODEL, counts, **kw)
  assert (out["name"], out["aspect_ratio"], out["params_total"], out["params_non_embedding"],
          out["tokens"], out["skipped_steps"]) == ("hc_4x64", 16.0, 1000, 400, 640, 0)
  assert (out["status"], out["diverged_step"], out["diverged_reason"]) == ("ok", None, None)
  assert out["config"] == _config().to_dict() and out["last_checkpoint_step"] == 10
  calm = types.SimpleNamespace(skipped=3, reason=None, step=None, max_grad_norm=12.5,
                               max_grad_norm_step=4)
  out = summary.build(_config(), MODEL, counts, guard=calm, **kw)
  assert (out["status"], out["skipped_steps"], out["diverged_step"]) == ("ok", 3, None)
  assert (out["max_grad_norm"], out["max_grad_norm_step"]) == (12.5, 4)
  bad = types.SimpleNamespace(skipped=0, reason="non-finite loss (nan)", step=7,
                              max_grad_norm=None, max_grad_norm_step=None)
  out = summary.build(_config(), MODEL, counts, guard=bad, **kw)
  assert (out["status"], out["diverged_step"], out["diverged_reason"]) == (
      "diverged", 7, "non-finite loss (nan)")


def test_metrics_log_appends_and_read_metrics_skips_what_it_cannot_use(tmp_path):
  """Every append adds a line (resumed runs add to the old file); a disabled log (not process
  0) writes nothing; a torn last line (a kill mid-write) and lines without the key are skipped."""
  workdir = str(tmp_path)
  assert summary.read_metrics(workdir) == {}
  summary.MetricsLog(workdir, enabled=False).append(1, {"train/loss": 9.0})
  assert not os.path.exists(tmp_path / "metrics.jsonl")
  summary.MetricsLog(workdir).append(1, {"train/loss": np.float32(5.5), "train/lr": 1e-3})
  summary.MetricsLog(workdir).append(2, {"eval/loss": 6.0})
  summary.MetricsLog(workdir).append(3, {"train/loss": 4.5})
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write('{"step": 4, "train/lo')
  assert summary.read_metrics(workdir) == {1: 5.5, 3: 4.5}
  assert summary.read_metrics(workdir, "eval/loss") == {2: 6.0}


def test_a_session_line_drops_the_abandoned_sessions_records_after_its_checkpoint(tmp_path):
  """Lost session: 510..540 after its checkpoint at 500 (540 NaN); the resumed one logs every
  100, from 600: its first record goes back to no earlier step, yet 510..540 are not the run's.
  A second session line drops the first resumed session's 600 too (resumed again at 500)."""
  workdir = str(tmp_path)
  log = summary.MetricsLog(workdir)
  log.start_session(0)
  for step in (490, 500, 510, 520, 530, 540):
    log.append(step, {"train/loss": float("nan") if step == 540 else 3.0})
  log.start_session(500)
  log.append(600, {"train/loss": 2.5})
  assert summary.read_metrics(workdir) == {490: 3.0, 500: 3.0, 600: 2.5}
  summary.MetricsLog(workdir).start_session(500)
  assert summary.read_metrics(workdir) == {490: 3.0, 500: 3.0}


def test_checkpoint_steps_ignore_orbax_temporary_directories_and_sort_numerically(tmp_path):
  from depthbench_jax.train import checkpoint  # orbax: only this test needs it.
  workdir = str(tmp_path)
  assert summary.checkpoint_steps(workdir) == [] and not checkpoint.has_checkpoint(workdir)
  (tmp_path / "checkpoints" / "10.orbax-checkpoint-tmp-1234").mkdir(parents=True)
  assert not checkpoint.has_checkpoint(workdir)   # a first save killed mid-write
  for step in ("10", "9", "100"):
    (tmp_path / "checkpoints" / step).mkdir()
  assert summary.checkpoint_steps(workdir) == [9, 10, 100] and checkpoint.has_checkpoint(workdir)


def test_a_result_of_a_later_step_is_not_replaced_by_an_earlier_one(tmp_path):
  """evaluate/diagnose --step=100 once silently replaced the final step's result (the step
  decides no option); a later step, or the same one, still replaces it."""
  from depthbench_jax.errors import ConfigError
  path = str(tmp_path / "evals.json")
  summary.atomic_write_json(path, {"step": 7770, "options": {"sets": ["sciq"]}})
  same = {"sets": ["sciq"]}
  with pytest.raises(ConfigError, match=r"^checkpoint step 100 \(--step, else the latest\): .* "
                                        r"later step 7770, .* allowed: --out"):
    summary.check_replaceable(path, same, overwrite=False, step=100)
  for step in (7770, 8000, None):
    summary.check_replaceable(path, same, overwrite=False, step=step)
  summary.check_replaceable(path, same, overwrite=True, step=100)


def test_a_result_in_the_runs_own_folder_is_its_own_after_a_copy_a_move_or_a_link(tmp_path):
  """evaluate/diagnose refused RUN/evals.json of a run folder copied or moved (rsynced results)
  or reached through a link as 'the result of another run' (the path it was made at); a file
  elsewhere (a debug --out) still names the run it holds, and another run's is refused."""
  from depthbench_jax.errors import ConfigError
  made = tmp_path / "fin"
  made.mkdir()
  summary.atomic_write_json(str(made / "evals.json"), {"workdir": str(made), "options": {}})
  copied = tmp_path / "fin2"
  os.rename(made, copied)
  (tmp_path / "link").symlink_to(copied)
  for run in (copied, tmp_path / "link"):
    summary.check_replaceable(str(run / "evals.json"), {}, overwrite=False, workdir=str(run))
  debug = tmp_path / "debug.json"
  summary.atomic_write_json(str(debug), {"workdir": str(copied), "options": {}})
  summary.check_replaceable(str(debug), {}, overwrite=False, workdir=str(tmp_path / "link"))
  with pytest.raises(ConfigError, match="holds the result of another run"):
    summary.check_replaceable(str(debug), {}, overwrite=False, workdir=str(tmp_path / "other"))
  with pytest.raises(ConfigError, match=r"^--workdir=: empty; allowed: a folder path"):
    summary.check_folder("", "--workdir=")


@pytest.mark.parametrize("dirty, recorded", [(None, False), ("0", False), ("1", True)])
def test_a_named_commit_records_the_dirty_flag_it_is_given(monkeypatch, dirty, recorded):
  """A device run names its commit ($DEPTHBENCH_COMMIT: the copy's .git can be stale), and was
  recorded clean whatever the copied tree held; $DEPTHBENCH_DIRTY says it held edits."""
  from depthbench_jax import revision
  monkeypatch.setenv("DEPTHBENCH_COMMIT", "a" * 40)
  if dirty is None:
    monkeypatch.delenv("DEPTHBENCH_DIRTY", raising=False)
  else:
    monkeypatch.setenv("DEPTHBENCH_DIRTY", dirty)
  assert revision.code_revision() == {"commit": "a" * 40, "dirty": recorded}


@pytest.mark.parametrize("porcelain, dirty", [(" M depthbench_jax/bench.py\n", True), ("", False)])
def test_the_checkouts_dirty_flag_is_whether_git_lists_changes(monkeypatch, porcelain, dirty):
  """The git path was only compared with itself (a run's record against code_revision()), so a
  flag read upside down passed; here git's answers are given and the record read."""
  import subprocess
  from depthbench_jax import revision
  monkeypatch.delenv("DEPTHBENCH_COMMIT", raising=False)
  answers = {"rev-parse": "c" * 40 + "\n", "status": porcelain}
  monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
      cmd, 0, stdout=answers[cmd[3]], stderr=""))
  assert revision.code_revision() == {"commit": "c" * 40, "dirty": dirty}


def test_a_result_of_another_tool_is_refused_as_such(tmp_path):
  """evaluate --out at a diagnostics.json (and diagnose at an evals.json) was refused naming
  every setting as changed, against the other tool's; ``kind`` names the file for what it is.
  An empty or unreadable file keeps the settings check; ``--overwrite`` replaces either."""
  from depthbench_jax.errors import ConfigError
  path = str(tmp_path / "diagnostics.json")
  summary.atomic_write_json(path, {"step": 5, "angular": {}, "options": {"batch_size": 2}})
  with pytest.raises(ConfigError, match=r"^--out=.*diagnostics\.json holds no evals result "
                                        r"\('domains' not in it: another tool's\?\), .*allowed: "
                                        r"another --out, or --overwrite$"):
    summary.check_replaceable(path, {"batch_size": 2}, False, kind=("evals", "domains"))
  summary.check_replaceable(path, {"batch_size": 2}, False, kind=("diagnostics", "angular"))
  summary.check_replaceable(path, {"batch_size": 2}, True, kind=("evals", "domains"))
