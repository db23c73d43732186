"""Sweep planning, resume, best-LR selection and the run_sweep.sh wrapper (with a fake trainer)."""

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from depthbench_jax import shapes, sweep
from depthbench_jax.errors import ConfigError
from depthbench_jax.residual import registry
from depthbench_jax.main import SLURM_STEP_VARIABLES
from tests import helpers
from tests.helpers import slurm_step

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(REPO, "configs", "smoke.py")

TINY_SUITE = textwrap.dedent("""
    from configs import smoke
    NAME = "tiny"
    get_config = smoke.get_config
    def sweep():
      return ([dict(arch="preln", shape="4x128", lr=lr) for lr in (1e-3, 3e-3)]
              + [dict(arch="preln", shape="8x96", lr=lr) for lr in (1e-3, 3e-3)])
""")

# Stands in for `python -m depthbench_jax.main`: logs its call, then writes a summary (or not).
FAKE_MAIN = textwrap.dedent("""
    import json, os, sys
    args = dict(a.split("=", 1) for a in sys.argv[1:])
    workdir, arg = args["--workdir"], args["--config"].split(":", 1)[1]
    with open(os.environ["FAKE_LOG"], "a") as f:
      f.write(json.dumps({"workdir": workdir, "arg": arg,
                          "pid": os.environ.get("JAX_PROCESS_ID"),
                          "n": os.environ.get("JAX_NUM_PROCESSES"),
                          "coord": os.environ.get("JAX_COORDINATOR_ADDRESS"),
                          "xla": os.environ.get("XLA_FLAGS", ""),
                          "platforms": os.environ.get("JAX_PLATFORMS")}) + "\\n")
    if os.environ.get("JAX_PROCESS_ID") == os.environ.get("FAKE_CRASH_PID", "-"):
      sys.exit(5)
    if os.environ.get("JAX_PROCESS_ID", "0") != "0":
      sys.exit(0)
    if os.path.basename(workdir) in os.environ.get("FAKE_CRASH", "").split(","):
      sys.exit(3)
    if os.path.basename(workdir) == os.environ.get("FAKE_HOSTS_DIFFER"):
      sys.exit(4)  # errors.HOSTS_DIFFER
    if os.path.basename(workdir) == os.environ.get("FAKE_PREEMPTED"):
      if not os.environ.get("FAKE_NO_CHECKPOINT"):
        os.makedirs(os.path.join(workdir, "checkpoints", "10"), exist_ok=True)
      sys.exit(0)  # Saved (or stopped before its first save) at a preemption: no summary.
    if os.path.basename(workdir) == os.environ.get("FAKE_ABORT"):
      import resource
      resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
      os.abort()  # JAX's coordination service: a host did not join in time.
    os.makedirs(workdir, exist_ok=True)
    design, shape, lr = os.path.basename(workdir).rsplit("_", 2)
    n_layers, d_model = map(int, shape.split("x"))
    with open(os.path.join(workdir, "summary.json"), "w") as f:
      json.dump({"name": os.path.basename(workdir), "status": "ok", "final_val_loss": 3.0,
                 "design": design, "n_layers": n_layers, "d_model": d_model,
                 "lr": float(lr[2:])}, f)
    if os.path.basename(workdir) == os.environ.get("FAKE_FAIL_AFTER_SUMMARY"):
      sys.exit(3)  # e.g. a step after training failed, or the process exit itself
""")


@pytest.fixture
def tiny(tmp_path):
  config = tmp_path / "tiny_suite.py"
  config.write_text(TINY_SUITE)
  fake = tmp_path / "fake_main.py"
  fake.write_text(FAKE_MAIN)
  return {"config": str(config), "results": str(tmp_path / "results"),
          "main_cmd": [sys.executable, str(fake)], "log": str(tmp_path / "calls.jsonl")}


def calls(path):
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f]


def write_summary(workdir, **kw):
  """A trainer's summary.json for the run of folder ``<design>_<L>x<d>_lr<lr>``."""
  design, shape, lr = sweep.parse_run_name(os.path.basename(workdir))
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump({"status": "ok", "final_val_loss": 3.0, "design": design,
               "n_layers": shape.n_layers, "d_model": shape.d_model, "lr": lr, **kw}, f)


def test_names_and_args():
  assert sweep.format_lr(3e-4) == "3e-4"
  assert sweep.format_lr(0.0012) == "1.2e-3"
  assert sweep.format_lr(5e-4) == "5e-4"
  assert sweep.run_name("hc", shapes.Shape(16, 1216), 3e-4) == "hc_16x1216_lr3e-4"
  for design, shape, lr in [("attnres_block", shapes.Shape(70, 640), 1.2e-3),
                            ("hc", shapes.Shape(16, 1216), 3e-4)]:   # '_' in a design name too.
    assert sweep.parse_run_name(sweep.run_name(design, shape, lr)) == (design, shape, lr)
  for other in ("notes", "hc_16x1216", "hc_16x1216_lr1e-3e-4", "hc_16x_lr1e-3"):
    assert sweep.parse_run_name(other) is None
  run = sweep.parse_run_arg("arch=hc,shape=16x1216,lr=3e-4", {"arch": "preln", "shape": "4x8",
                                                                "lr": 1.0})
  assert run == {"arch": "hc", "shape": shapes.Shape(16, 1216), "lr": 3e-4}
  with pytest.raises(ConfigError, match="allowed"):
    sweep.parse_run_arg("arch=hc,depth=3", {"arch": "preln", "shape": "4x8", "lr": 1.0})
  for lr in ("fast", "inf", "nan", "0", "-1e-3"):  # inf and nan were format_lr tracebacks.
    with pytest.raises(ConfigError, match=f"lr='{lr}'; allowed: a positive number"):
      sweep.parse_run_arg(f"lr={lr}", {"arch": "preln", "shape": "4x8", "lr": 1.0})


def test_a_run_listed_twice_is_one_run(tmp_path):
  """Duplicate entries (1e-3 and 0.001 name the same run) would train, plan and count twice."""
  config = tmp_path / "dup_suite.py"
  config.write_text(textwrap.dedent("""
      from configs import smoke
      get_config = smoke.get_config
      sweep = [dict(arch="preln", shape="4x128", lr=1e-3)] * 2 + [
          dict(arch="preln", shape="4x128", lr=0.001), dict(arch="hc", shape="4x128", lr=1e-3)]
  """))
  runs = sweep.list_runs(str(config), str(tmp_path / "results"))
  assert [r.name for r in runs] == ["preln_4x128_lr1e-3", "hc_4x128_lr1e-3"]


def test_a_sweep_entry_whose_lr_is_not_a_number_is_a_config_error(tmp_path):
  """``lr="3e-3"`` in a sweep entry is read as 3e-3; ``lr="fast"`` or ``lr=None`` (a grid
  lookup that found nothing) names the argument and what is allowed (once a ValueError or
  TypeError traceback from the run name)."""
  config = tmp_path / "string_lr_suite.py"
  for lr, error in (('"3e-3"', None), ('"fast"', "lr='fast'"), ("None", "lr='None'")):
    config.write_text(textwrap.dedent(f"""
        from configs import smoke
        get_config = smoke.get_config
        sweep = [dict(arch="preln", shape="4x128", lr={lr})]
    """))
    if error is None:
      assert [r.name for r in sweep.list_runs(str(config))] == ["preln_4x128_lr3e-3"]
      continue
    with pytest.raises(ConfigError, match=f"{error}; allowed: a positive number"):
      sweep.list_runs(str(config))


def test_entries_differing_beyond_the_run_name_are_refused(tmp_path):
  """A suite that sweeps its own key (``n_streams=2`` and ``8``) names both entries
  ``hc_4x128_lr3e-3``: one run and one workdir, the other entry silently dropped. Refused,
  naming both entries."""
  config = tmp_path / "streams_suite.py"
  config.write_text(textwrap.dedent("""
      from configs import smoke
      get_config = smoke.get_config
      sweep = [dict(arch="hc", shape="4x128", lr=3e-3, n_streams=n) for n in (2, 8)]
  """))
  with pytest.raises(ConfigError, match=r"n_streams=2.*n_streams=8.*hc_4x128_lr3e-3.*allowed"):
    sweep.list_runs(str(config), str(tmp_path / "results"))


@pytest.mark.parametrize("suite", ["suite_multiscale", "suite_300m_isobackbone"])
def test_a_copy_of_a_control_suite_sweeps_its_own_lr_grid(tmp_path, suite):
  """A new suite modelled on a control suite, with its own ``lrs_for`` (a 120M model's higher
  LRs), silently swept suite_400m's grid: the control suites' sweep() read suite_400m's."""
  text = open(os.path.join(REPO, "configs", f"{suite}.py")).read()
  assert "lrs_for = suite_400m.lrs_for" in text
  mine = tmp_path / "my_suite.py"
  mine.write_text(text.replace("lrs_for = suite_400m.lrs_for",
                               "def lrs_for(design):\n  return (3e-3, 6e-3)"))
  runs = sweep.list_runs(str(mine), str(tmp_path / "results"))
  assert {r.lr for r in runs} == {3e-3, 6e-3}
  assert {r.lr for r in sweep.list_runs(os.path.join(REPO, "configs", f"{suite}.py"))} == {
      5e-4, 1e-3, 2e-3, 4e-3}


def test_format_duration():
  assert [sweep.format_duration(s) for s in (0, 52.9, 60, 3125, 45000, float("inf"))] == [
      "0s", "53s", "1m00s", "52m05s", "12h30m", "?"]
  # Rounded at the unit shown, across a unit's edge too (it truncated: 32.9 s read 32s).
  assert [sweep.format_duration(s) for s in (32.9, 59.6, 3599.6, 45029, 45031)] == [
      "33s", "1m00s", "1h00m", "12h30m", "12h31m"]


def test_smoke_config_and_listing():
  from depthbench_jax.residual import registry
  c = sweep.load_config_module(SMOKE).get_config("arch=preln,shape=8x96")
  assert (c.model.n_layers, c.model.d_model, c.name) == (8, 96, "preln_8x96_lr3e-3")
  assert c.data.source == "embedded" and c.model.dtype == "float32"
  with pytest.raises(ConfigError, match="allowed"):
    sweep.load_config_module(SMOKE).get_config("arch=nope")
  runs = sweep.list_runs(SMOKE, "/tmp/r")
  assert len(runs) == 2 * len(registry.names())
  assert {r.design for r in runs} == set(registry.names())
  assert runs[0].workdir == os.path.join("/tmp/r", runs[0].name)


def test_smoke_gives_deepnorm_its_own_lr():
  """DeepNorm diverges at the smoke sweep's 3e-3 (configs/smoke.py): the sweep and a bare
  ``arch=deepnorm`` run at 2e-3; a named ``lr=`` still wins; other designs keep 3e-3."""
  smoke = sweep.load_config_module(SMOKE)
  assert smoke.get_config("arch=deepnorm").lr == 2e-3
  assert smoke.get_config("arch=deepnorm,lr=3e-3").lr == 3e-3
  assert smoke.get_config("arch=hc").lr == 3e-3
  lrs = {(r.design, r.name.split("_lr")[-1]) for r in sweep.list_runs(SMOKE, "/tmp/r")}
  assert ("deepnorm", "2e-3") in lrs and ("deepnorm", "3e-3") not in lrs
  assert ("keel", "3e-3") in lrs


def test_dry_run_plan(tiny, capsys, monkeypatch):
  from depthbench_jax.model.config import model_config_from
  from depthbench_jax.systems.flops import train_flops_per_token
  monkeypatch.setenv("FAKE_LOG", tiny["log"])   # a launched run would log its call
  write_summary(os.path.join(tiny["results"], "preln_4x128_lr1e-3"))
  assert sweep.main([tiny["config"], "--results_dir", tiny["results"], "--dry_run",
                     "--main_cmd", " ".join(tiny["main_cmd"])]) == 0
  out = capsys.readouterr().out
  assert "4 runs (1 done, 3 to run)" in out and "device-hours" in out
  assert "preln_8x96_lr3e-3" in out and " done " in out
  runs = sweep.list_runs(tiny["config"], tiny["results"])
  rows = sweep.plan_rows(tiny["config"], runs, mfu=0.5, peak_flops=1e12)
  config = sweep.load_config_module(tiny["config"]).get_config(runs[2].arg)
  tokens = 120 * 8 * 128
  assert rows[2]["tokens"] == tokens
  assert rows[2]["flops"] == pytest.approx(
      train_flops_per_token(model_config_from(config.model), 128) * tokens)
  assert rows[2]["device_hours"] == pytest.approx(rows[2]["flops"] / 0.5e12 / 3600)
  assert [r["state"] for r in rows] == ["done", "new", "new", "new"]
  assert not calls(tiny["log"])  # A dry run launches nothing.
  # An interrupted run has trained up to its latest kept checkpoint, not its oldest.
  for step in (30, 60):
    os.makedirs(os.path.join(runs[2].workdir, "checkpoints", str(step)))
  rows = sweep.plan_rows(tiny["config"], runs, mfu=0.5, peak_flops=1e12)
  assert rows[2]["state"] == "partial" and rows[2]["steps_done"] == 60


def test_resume_runs_only_what_is_missing(tiny, monkeypatch):
  monkeypatch.setenv("FAKE_LOG", tiny["log"])
  res = tiny["results"]
  write_summary(os.path.join(res, "preln_4x128_lr1e-3"))                      # finished
  write_summary(os.path.join(res, "preln_4x128_lr3e-3"), status="diverged")   # finished
  os.makedirs(os.path.join(res, "preln_8x96_lr1e-3", "checkpoints", "50"))    # interrupted
  write_summary(os.path.join(res, "preln_8x96_lr3e-3"), status="running")     # interrupted
  runs = sweep.list_runs(tiny["config"], res)
  assert [sweep.run_state(r.workdir) for r in runs] == ["done", "done", "partial", "partial"]
  outcome = sweep.execute(tiny["config"], runs, tiny["main_cmd"])
  ran = [os.path.basename(c["workdir"]) for c in calls(tiny["log"])]
  assert ran == ["preln_8x96_lr1e-3", "preln_8x96_lr3e-3"]
  assert calls(tiny["log"])[0]["arg"] == "arch=preln,shape=8x96,lr=1e-3"
  assert outcome["ok"] == ran and len(outcome["skipped"]) == 2
  sweep.execute(tiny["config"], runs, tiny["main_cmd"])  # Everything done: nothing runs.
  assert len(calls(tiny["log"])) == 2


def test_a_run_diverged_under_other_divergence_rules_is_relaunched(tiny, monkeypatch):
  """A suite edited to skip non-finite steps: the trainer resumes a run that diverged under the
  old rules from its checkpoint, so the sweep launches it again (it skipped it as done, and one
  LR grid was judged under two sets of rules); a run diverged under the suite's rules stays."""
  monkeypatch.setenv("FAKE_LOG", tiny["log"])
  res = tiny["results"]
  runs = sweep.list_runs(tiny["config"], res)
  module = sweep.load_config_module(tiny["config"])
  # runs[0] differs from the suite in a resumable field that is no divergence rule (log_every):
  # it stays done. A check of every resumable field relaunched it, past its divergence.
  for run, skip, log_every in zip(runs[:2], (False, True), (7, None)):
    config = sweep.config_of(module, run.arg)
    write_summary(run.workdir, status="diverged", config=dict(
        config.to_dict(), skip_nonfinite_steps=skip, log_every=log_every or config.log_every))
  assert not sweep.config_of(module, runs[0].arg).skip_nonfinite_steps
  assert [sweep.run_state(r.workdir) for r in runs[:2]] == ["done", "done"]
  assert [sweep.run_state(r.workdir, sweep.config_of(module, r.arg))
          for r in runs[:2]] == ["done", "partial"]
  # Relaunched, it resumes: its own fields must match as for any started run (another
  # data.path there is refused by the trainer, so here before anything runs).
  moved = dict(sweep.config_of(module, runs[1].arg).to_dict(), skip_nonfinite_steps=True)
  moved["data"] = dict(moved["data"], path="/elsewhere")
  write_summary(runs[1].workdir, status="diverged", config=moved)
  with pytest.raises(ConfigError, match="data.path"):
    sweep.check_recipes(tiny["config"], runs)
  write_summary(runs[1].workdir, status="diverged", config=dict(
      sweep.config_of(module, runs[1].arg).to_dict(), skip_nonfinite_steps=True))
  sweep.check_recipes(tiny["config"], runs)
  outcome = sweep.execute(tiny["config"], runs, tiny["main_cmd"])
  assert outcome["skipped"] == runs[:1]
  assert [os.path.basename(c["workdir"]) for c in calls(tiny["log"])] == [
      r.name for r in runs[1:]]


def test_a_relaunched_diverged_run_that_fails_counts_as_failed(tiny, monkeypatch):
  """A run relaunched under other divergence rules keeps its old diverged summary until the
  trainer sets it aside: a launch that failed before then (data missing on this host) was
  counted 'diverged' from that summary, and the sweep exited 0, every time."""
  monkeypatch.setenv("FAKE_LOG", tiny["log"])
  runs = sweep.list_runs(tiny["config"], tiny["results"])
  module = sweep.load_config_module(tiny["config"])
  write_summary(runs[1].workdir, status="diverged", config=dict(
      sweep.config_of(module, runs[1].arg).to_dict(), skip_nonfinite_steps=True))
  monkeypatch.setenv("FAKE_CRASH", runs[1].name)
  outcome = sweep.execute(tiny["config"], runs[:2], tiny["main_cmd"])
  assert outcome["failed"] == [runs[1].name] and outcome["diverged"] == []


@pytest.mark.parametrize("text", ["[]", "3", b"\xff", "{}", '{"status": "ok", "lr": 1e-3}',
                                  '{"design": "hc", "n_layers": 2, "d_model": 8, "lr": 1e-3}',
                                  '{"status": "ok", "n_layers": 2, "d_model": 8, "lr": 1e-3}'])
def test_a_summary_that_is_no_json_object_reads_as_none(tmp_path, text):
  """Valid JSON that is no object, or bytes not UTF-8: AttributeError / UnicodeDecodeError
  tracebacks in the sweep, dry run and report, where the trainer reads no summary; an object no
  trainer wrote (no final status, shape or LR): 'done' for the sweep, which never relaunched
  it while the trainer resumes it, and dropped from the report without a word."""
  (tmp_path / "summary.json").write_bytes(text if isinstance(text, bytes) else text.encode())
  assert sweep.read_summary(str(tmp_path)) is None
  assert sweep.run_state(str(tmp_path)) == "partial"
  (tmp_path / "summary.json").write_text(
      '{"status": "ok", "design": "hc", "n_layers": 2, "d_model": 8, "lr": 1e-3}')
  assert sweep.run_state(str(tmp_path)) == "done"


def test_an_implementation_switch_is_no_other_recipe(tmp_path):
  """mHC's Sinkhorn kernel and the attention kernel choose how the same math runs
  (recipe.IMPLEMENTATION_FIELDS), as the report's other_recipe_runs reads it: a suite
  switching to Pallas after some mHC runs finished on XLA stopped every sweep, dry run
  included, and one stopped midway still did. Another sinkhorn_iters still counts."""
  smoke = os.path.join(REPO, "configs", "smoke.py")
  run = next(r for r in sweep.list_runs(smoke, str(tmp_path)) if r.design == "mhc")
  trained = sweep.config_of(sweep.load_config_module(smoke), run.arg).to_dict()
  trained["model"]["residual"] = dict(trained["model"]["residual"], sinkhorn_kernel="pallas")
  trained["model"]["attention_kernel"] = "fused"
  write_summary(run.workdir, config=trained)
  assert sweep.recipe_edits(smoke, [run]) == []
  os.remove(os.path.join(run.workdir, "summary.json"))   # stopped midway: its config.json
  os.makedirs(os.path.join(run.workdir, "checkpoints", "5"))   # (no checkpoint: not started)
  with open(os.path.join(run.workdir, "config.json"), "w") as f:
    json.dump(trained, f)
  assert sweep.trained_config(run.workdir) == json.loads(json.dumps(trained))
  assert sweep.run_state(run.workdir) == "partial" and sweep.recipe_edits(smoke, [run]) == []
  trained["model"]["residual"]["sinkhorn_iters"] = 5
  write_summary(run.workdir, config=trained)
  [(_, changed)] = sweep.recipe_edits(smoke, [run])
  assert [c[0] for c in changed] == ["model.residual.sinkhorn_iters"]


def test_a_finished_run_under_another_recipe_is_refused_before_anything_runs(tiny, monkeypatch,
                                                                             capsys):
  # The suite's steps were edited after preln_4x128_lr1e-3 finished: skipping it would put a
  # 60-step and 120-step runs in one best-LR comparison. One error line names the run, the field
  # and both values; nothing is launched, the finished run is untouched.
  monkeypatch.setenv("FAKE_LOG", tiny["log"])
  module = sweep.load_config_module(tiny["config"])
  done = os.path.join(tiny["results"], "preln_4x128_lr1e-3")
  trained = module.get_config("arch=preln,shape=4x128,lr=1e-3").to_dict()
  write_summary(done, config=dict(trained, steps=60, log_every=5))
  before = open(os.path.join(done, "summary.json")).read()
  for extra in ([], ["--dry_run"]):
    assert sweep.main([tiny["config"], "--results_dir", tiny["results"],
                       "--main_cmd", " ".join(tiny["main_cmd"])] + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    assert "preln_4x128_lr1e-3" in err[0] and "config.steps=120" in err[0] and "60" in err[0]
    assert "allowed" in err[0] and "log_every" not in err[0]   # log_every may change
  assert not calls(tiny["log"])
  assert open(os.path.join(done, "summary.json")).read() == before
  # run_sweep.sh stops at the error line too: no report is rendered after it.
  out = subprocess.run([os.path.join(REPO, "launch", "run_sweep.sh"), tiny["config"],
                        "--results_dir", tiny["results"], "--main_cmd",
                        " ".join(tiny["main_cmd"])], capture_output=True, text=True)
  assert out.returncode == 2 and "error: config.steps=120" in out.stderr
  assert not os.path.exists(os.path.join(tiny["results"], "report.md"))
  # The same shards read from another mount: the same run (a started run's resume compares the
  # path as written, test below); every sweep stopped at it, dry run included.
  data = dict(trained["data"], path="/scratch/fineweb-edu")
  write_summary(done, config=dict(trained, data=data))
  assert sweep.main([tiny["config"], "--results_dir", tiny["results"], "--dry_run"]) == 0
  write_summary(done, config=dict(trained, log_every=5))   # the same recipe: skipped, the rest run
  assert sweep.main([tiny["config"], "--results_dir", tiny["results"],
                     "--main_cmd", " ".join(tiny["main_cmd"])]) == 0
  assert len(calls(tiny["log"])) == 3


def test_a_started_run_under_another_recipe_is_refused_before_anything_runs(tiny, monkeypatch,
                                                                            capsys):
  """An edit after a run was interrupted passed the dry run; the real sweep's trainer refused
  that run's resume and the sweep trained the others under the edit, run after run. Its
  config.json now counts like a finished run's summary."""
  monkeypatch.setenv("FAKE_LOG", tiny["log"])
  module = sweep.load_config_module(tiny["config"])
  started = os.path.join(tiny["results"], "preln_4x128_lr1e-3")
  os.makedirs(os.path.join(started, "checkpoints", "16"))
  trained = module.get_config("arch=preln,shape=4x128,lr=1e-3").to_dict()
  with open(os.path.join(started, "config.json"), "w") as f:
    json.dump(dict(trained, steps=40), f)
  for extra in (["--dry_run"], []):
    assert sweep.main([tiny["config"], "--results_dir", tiny["results"],
                       "--main_cmd", " ".join(tiny["main_cmd"])] + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "config.steps=120" in err[0] and "was trained with 40" in err[0]
  assert not calls(tiny["log"])
  with open(os.path.join(started, "config.json"), "w") as f:   # its resume would refuse it
    json.dump(dict(trained, data=dict(trained["data"], path="/scratch/fineweb-edu")), f)
  assert sweep.main([tiny["config"], "--results_dir", tiny["results"], "--dry_run"]) == 2
  assert "config.data.path=" in capsys.readouterr().err
  # Crashed before its first checkpoint: nothing trained to keep, the trainer starts it afresh
  # (it was refused, and with it every host's sweep).
  os.rmdir(os.path.join(started, "checkpoints", "16"))
  assert sweep.main([tiny["config"], "--results_dir", tiny["results"], "--dry_run"]) == 0


def test_crashed_run_does_not_stop_the_sweep(tiny, monkeypatch):
  monkeypatch.setenv("FAKE_LOG", tiny["log"])
  monkeypatch.setenv("FAKE_CRASH", "preln_4x128_lr3e-3")
  runs = sweep.list_runs(tiny["config"], tiny["results"])
  outcome = sweep.execute(tiny["config"], runs, tiny["main_cmd"])
  assert outcome["failed"] == ["preln_4x128_lr3e-3"] and len(outcome["ok"]) == 3
  assert sweep.main([tiny["config"], "--results_dir", tiny["results"], "--main_cmd",
                     " ".join(tiny["main_cmd"])]) == 1  # Retried, crashes again: exit 1.


def test_hosts_given_different_runs_stop_the_sweep(tiny, monkeypatch, capsys):
  """A host restarted mid-sweep joins the others on an earlier run and main.check_same_run
  refuses: each host stops there (it went on failing every later run, out of step, and the
  last host waited JAX_INIT_TIMEOUT_S for a coordinator that had finished, then aborted)."""
  from depthbench_jax.errors import HOSTS_DIFFER
  assert HOSTS_DIFFER == 4  # What FAKE_MAIN exits with.
  monkeypatch.setenv("FAKE_LOG", tiny["log"])
  monkeypatch.setenv("FAKE_HOSTS_DIFFER", "preln_4x128_lr3e-3")
  assert sweep.main([tiny["config"], "--results_dir", tiny["results"], "--main_cmd",
                     " ".join(tiny["main_cmd"])]) == 1
  assert [os.path.basename(c["workdir"]) for c in calls(tiny["log"])] == [
      "preln_4x128_lr1e-3", "preln_4x128_lr3e-3"]
  out = capsys.readouterr().out
  assert "Restart run_sweep.sh on every host" in out
  # The two runs after it counted (the line said "not started 0" of four runs), exit still 1.
  assert "[sweep] done: skipped 0, ok 1, diverged 0, failed 1, stopped 0, not started 2" in out


def test_a_run_preempted_on_another_host_stops_this_hosts_sweep(tiny, monkeypatch, capsys):
  """On a pod a SIGTERM to one host's run_sweep.sh makes every process of the run save and exit
  0 without a summary (JAX's preemption service). The other hosts' sweeps called that a failed
  run and went on to the next, where each waited JAX_INIT_TIMEOUT_S for a coordinator that had
  stopped, then aborted; now they stop too (exit 143, no report) and the next sweep resumes."""
  monkeypatch.setenv("FAKE_LOG", tiny["log"])
  monkeypatch.setenv("FAKE_PREEMPTED", "preln_4x128_lr3e-3")
  assert sweep.main([tiny["config"], "--results_dir", tiny["results"], "--main_cmd",
                     " ".join(tiny["main_cmd"])]) == 143
  assert [os.path.basename(c["workdir"]) for c in calls(tiny["log"])] == [
      "preln_4x128_lr1e-3", "preln_4x128_lr3e-3"]
  out = capsys.readouterr().out
  assert ("preln_4x128_lr3e-3: a process of the run was preempted; the next sweep resumes it "
          "from its checkpoint") in out
  assert "stopped 1, not started 2" in out
  # Stopped before its first checkpoint: the message promised one the next sweep did not find.
  monkeypatch.setenv("FAKE_PREEMPTED", "preln_8x96_lr1e-3")
  monkeypatch.setenv("FAKE_NO_CHECKPOINT", "1")
  assert sweep.main([tiny["config"], "--results_dir", tiny["results"], "--main_cmd",
                     " ".join(tiny["main_cmd"])]) == 143
  assert ("preln_8x96_lr1e-3: a process of the run was preempted; the next sweep starts it "
          "afresh (it had saved no checkpoint)") in capsys.readouterr().out


def test_a_folder_holding_only_the_sweeps_process_logs_is_no_started_run(tmp_path):
  """A run refused at its start under LOCAL_PROCESSES leaves process_<i>.log alone: the report
  counted it 'started without a summary (training, interrupted or crashed)' and its plan line
  contradicted the table under it. So did a folder cleared with ``rm -rf RUN/*``, which leaves
  the trainers' dot-file locks."""
  workdir = tmp_path / "preln_4x128_lr1e-3"
  assert sweep.run_state(str(workdir)) == "new"
  workdir.mkdir()
  (workdir / "process_0.log").write_text("error: config.data.global_batch_size=7 ...\n")
  (workdir / "process_1.log").write_text("")
  (workdir / ".trainer-0.lock").write_text("")
  (workdir / ".trainer-1.lock").write_text("")
  assert sweep.run_state(str(workdir)) == "new"
  (workdir / ".trainer-0.lock.bak").write_text("")   # any other file is a trace of a run
  assert sweep.run_state(str(workdir)) == "partial"
  (workdir / ".trainer-0.lock.bak").unlink()
  (workdir / "config.json").write_text("{}")
  assert sweep.run_state(str(workdir)) == "partial"


def test_a_pod_run_whose_hosts_never_joined_stops_the_sweep(tiny, monkeypatch, capsys):
  """A host that never starts: JAX aborts process 0 after JAX_INIT_TIMEOUT_S (300 s), and the
  sweep went on to the next run to wait as long again, run after run. On a pod it now stops;
  on one machine an aborted run is a failed run, and the sweep goes on."""
  monkeypatch.setenv("FAKE_LOG", tiny["log"])
  monkeypatch.setenv("FAKE_ABORT", "preln_4x128_lr1e-3")
  for name in (*SLURM_STEP_VARIABLES, "JAX_NUM_PROCESSES", "JAX_COORDINATOR_ADDRESS",
               "JAX_PROCESS_ID"):
    monkeypatch.delenv(name, raising=False)
  args = [tiny["config"], "--results_dir", tiny["results"], "--main_cmd",
          " ".join(tiny["main_cmd"])]
  assert sweep.main(args) == 1 and len(calls(tiny["log"])) == 4
  assert "did not all join" not in capsys.readouterr().out
  monkeypatch.setenv("SLURM_NTASKS", "2")   # Not a SLURM job without its id: one machine still.
  assert sweep.main(args) == 1 and "did not all join" not in capsys.readouterr().out
  monkeypatch.setenv("SLURM_JOB_ID", "9")   # An salloc shell, no job step: one machine still.
  assert sweep.main(args) == 1 and "did not all join" not in capsys.readouterr().out
  slurm_step(monkeypatch, ntasks=2)         # An srun step of two tasks is a pod.
  assert sweep.main(args) == 1 and "did not all join" in capsys.readouterr().out
  for name in SLURM_STEP_VARIABLES:
    monkeypatch.delenv(name)
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "localhost:1")
  monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
  monkeypatch.setenv("JAX_PROCESS_ID", "0")
  open(tiny["log"], "w").close()
  assert sweep.main(args) == 1 and len(calls(tiny["log"])) == 1
  out = capsys.readouterr().out
  assert "did not all join" in out   # the other three were done by the sweeps above
  assert "done: skipped 3, ok 0, diverged 0, failed 1, stopped 0, not started 0" in out


def test_a_file_where_a_runs_folder_goes_is_one_error_line(tiny, capsys):
  """A NotADirectoryError traceback (exit 1, so run_sweep.sh went on to write a report that
  said nothing of it), in the dry run too."""
  os.makedirs(tiny["results"])
  taken = os.path.join(tiny["results"], "preln_4x128_lr3e-3")
  with open(taken, "w") as f:
    f.write("x")
  for extra in ([], ["--dry_run"]):
    assert sweep.main([tiny["config"], "--results_dir", tiny["results"],
                       "--main_cmd", " ".join(tiny["main_cmd"])] + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: run preln_4x128_lr3e-3's folder: {taken} is a file; allowed: a "
                   f"folder there (made if missing)"]
  assert open(taken).read() == "x" and not calls(tiny["log"])


def test_a_runs_processes_stop_soon_after_one_of_them_fails(tmp_path, monkeypatch):
  """Process 0 killed by a SIGTERM before its handler: process 1 waited JAX_INIT_TIMEOUT_S
  (300 s) for the dead coordinator, and the sweep on it. The others now get SIBLING_GRACE_S,
  then are killed, and the run reads the first failure's code."""
  import time
  script = tmp_path / "proc.py"
  script.write_text("import os, sys, time\n"
                    "if os.environ['JAX_PROCESS_ID'] == '0':\n  sys.exit(3)\n"
                    "time.sleep(120)\n")
  monkeypatch.setattr(sweep, "SIBLING_GRACE_S", 1.0)
  run = sweep.Run("preln_4x128_lr3e-3", "arch=preln", "preln", shapes.Shape(4, 128), 3e-3,
                  str(tmp_path / "run"))
  start = time.monotonic()
  assert sweep.launch(run, "c.py", [sys.executable, str(script)], local_processes=2) == 3
  assert time.monotonic() - start < 30
  # Both finishing on their own: each its own code, the largest by size.
  script.write_text("import os, sys\nsys.exit(int(os.environ['JAX_PROCESS_ID']) * 5)\n")
  assert sweep.launch(run, "c.py", [sys.executable, str(script)], local_processes=2) == 5
  # Process 1 cannot start (its log is a folder): process 0, already started, was left to wait
  # 300 s for it after the sweep had gone on (and exited); it is stopped with the error.
  script.write_text("import time\ntime.sleep(120)\n")
  run = dataclasses.replace(run, workdir=str(tmp_path / "run2"))
  (tmp_path / "run2" / "process_1.log").mkdir(parents=True)
  started = []
  real_start = sweep._start
  monkeypatch.setattr(sweep, "_start", lambda *a, **k: started.append(real_start(*a, **k)) or
                      started[-1])
  with pytest.raises(IsADirectoryError):
    sweep.launch(run, "c.py", [sys.executable, str(script)], local_processes=2)
  assert len(started) == 1 and started[0].poll() is not None


def test_local_processes_env(tiny, monkeypatch):
  monkeypatch.setenv("FAKE_LOG", tiny["log"])
  monkeypatch.delenv("JAX_PLATFORMS")
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_foo=1")
  run = sweep.list_runs(tiny["config"], tiny["results"])[0]
  assert sweep.launch(run, tiny["config"], tiny["main_cmd"], local_processes=2) == 0
  got = sorted(calls(tiny["log"]), key=lambda c: c["pid"])
  assert [c["pid"] for c in got] == ["0", "1"] and {c["n"] for c in got} == {"2"}
  assert got[0]["coord"] == got[1]["coord"] and got[0]["coord"].startswith("localhost:")
  assert all(c["xla"] == "--xla_foo=1" for c in got)
  # CPU processes, also where a GPU is present (each would claim every GPU).
  assert {c["platforms"] for c in got} == {"cpu"}
  monkeypatch.setenv("JAX_PLATFORMS", "cuda")
  open(tiny["log"], "w").close()
  sweep.launch(run, tiny["config"], tiny["main_cmd"], local_processes=2)
  assert {c["platforms"] for c in calls(tiny["log"])} == {"cuda"}
  # Process 1 fails while process 0 writes an ok summary and exits 0: the launch fails.
  monkeypatch.setenv("FAKE_CRASH_PID", "1")
  assert sweep.launch(run, tiny["config"], tiny["main_cmd"], local_processes=2) == 5


def test_a_run_whose_trainer_fails_after_its_ok_summary_counts_as_failed(tiny, monkeypatch,
                                                                         capsys):
  """A summary says 'ok' but the trainer exited 3 after writing it: the run is failed and the
  sweep exits 1 (no test had a trainer that wrote its summary and then failed)."""
  monkeypatch.setenv("FAKE_LOG", tiny["log"])
  runs = sweep.list_runs(tiny["config"], tiny["results"])
  monkeypatch.setenv("FAKE_FAIL_AFTER_SUMMARY", runs[0].name)
  outcome = sweep.execute(tiny["config"], runs, tiny["main_cmd"])
  assert outcome["failed"] == [runs[0].name] and runs[0].name not in outcome["ok"]
  assert outcome["ok"] == [r.name for r in runs[1:]]
  # Its lines say failed, not the summary's 'ok' (read from another trainer, it printed a
  # run refused by the workdir lock as both 'ok in 6s' and failed).
  lines = [l for l in capsys.readouterr().out.splitlines()
           if l.startswith(f"[sweep] {runs[0].name}:")]
  assert lines and all("failed (exit 3)" in l and "ok" not in l for l in lines), lines


@pytest.mark.parametrize("env, named", [
    ({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "abc"}, "JAX_PROCESS_ID='abc'"),
    ({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2"}, "JAX_PROCESS_ID=2"),
    ({"JAX_COORDINATOR_ADDRESS": "node0", "JAX_PROCESS_ID": "0"}, "ADDRESS='node0'"),
    ({"JAX_NUM_PROCESSES": None, "JAX_PROCESS_ID": "1"}, "without JAX_NUM_PROCESSES"),
    # A count that does not parse: hosts_expected read it first, a ValueError traceback.
    ({"JAX_NUM_PROCESSES": "x", "JAX_PROCESS_ID": "0"}, "JAX_NUM_PROCESSES='x'"),
])
def test_a_bad_multi_host_env_is_one_error_line_before_any_run(tiny, monkeypatch, capsys, env,
                                                                  named):
  """A pod host started with a bad JAX_* set: one error line naming the variable, exit 2,
  nothing launched (it was a traceback per run, or, with JAX_NUM_PROCESSES missing, a host that
  trained every run alone into the shared run dirs)."""
  monkeypatch.setenv("FAKE_LOG", tiny["log"])
  monkeypatch.delenv("SLURM_JOB_ID", raising=False)
  for name, value in {"JAX_COORDINATOR_ADDRESS": "node0:1234", "JAX_NUM_PROCESSES": "2",
                      **env}.items():
    if value is None:
      monkeypatch.delenv(name, raising=False)
    else:
      monkeypatch.setenv(name, value)
  assert sweep.main([tiny["config"], "--results_dir", tiny["results"],
                     "--main_cmd", " ".join(tiny["main_cmd"])]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: ") and named in err[0], err
  assert "allowed" in err[0]
  assert not calls(tiny["log"]) and not os.path.exists(tiny["results"])


def test_local_processes_with_a_pods_jax_env_is_refused(tiny, monkeypatch, capsys):
  """LOCAL_PROCESSES left exported on a pod host replaced its JAX_* variables: each host ran
  every run as its own local cluster, all of them into the same shared run dirs."""
  monkeypatch.setenv("FAKE_LOG", tiny["log"])
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "node0:1234")
  monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
  monkeypatch.setenv("LOCAL_PROCESSES", "2")
  assert sweep.main([tiny["config"], "--results_dir", tiny["results"],
                     "--main_cmd", " ".join(tiny["main_cmd"])]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "LOCAL_PROCESSES" in err[0] and "JAX_NUM_PROCESSES=4" in err[0], err
  assert "allowed" in err[0] and not calls(tiny["log"])
  # A leftover JAX_PROCESS_ID alone: the runs trained, but run_sweep.sh read it as this host's
  # and skipped the report without a word.
  monkeypatch.delenv("JAX_COORDINATOR_ADDRESS")
  monkeypatch.delenv("JAX_NUM_PROCESSES")
  monkeypatch.setenv("JAX_PROCESS_ID", "1")
  assert sweep.main([tiny["config"], "--results_dir", tiny["results"],
                     "--main_cmd", " ".join(tiny["main_cmd"])]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "with JAX_PROCESS_ID=1: it replaces them" in err[0], err
  assert not calls(tiny["log"])


@pytest.mark.parametrize("launch", [{"LOCAL_PROCESSES": "2"},
                                    {"JAX_COORDINATOR_ADDRESS": "n:1", "JAX_NUM_PROCESSES": "2",
                                     "JAX_PROCESS_ID": "0"}])
def test_a_bad_jax_timeout_is_refused_once_where_runs_join_processes(tiny, monkeypatch, capsys,
                                                                     launch):
  """JAX_HEARTBEAT_TIMEOUT_S=abc passed the sweep and its dry run, then failed every run in
  main (exit 2, 'continuing'); on one process per run it is not read, and not refused."""
  monkeypatch.setenv("FAKE_LOG", tiny["log"])
  monkeypatch.setenv("JAX_HEARTBEAT_TIMEOUT_S", "abc")
  args = [tiny["config"], "--results_dir", tiny["results"], "--dry_run"]
  assert sweep.main(args) == 0
  capsys.readouterr()
  for name, value in launch.items():
    monkeypatch.setenv(name, value)
  for extra in ([], ["--main_cmd", " ".join(tiny["main_cmd"])]):
    assert sweep.main(args[:-1] + extra + (["--dry_run"] if not extra else [])) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: JAX_HEARTBEAT_TIMEOUT_S='abc'; allowed: a whole number of seconds "
                   ">= 1"], err
  assert not calls(tiny["log"])


def test_local_processes_that_do_not_split_the_batch_are_refused_once(tiny, monkeypatch,
                                                                      capsys):
  """LOCAL_PROCESSES=3 under a batch of 8: every run of the suite started 3 processes and
  failed in turn, each naming the batch, not the setting that changed."""
  monkeypatch.setenv("FAKE_LOG", tiny["log"])
  monkeypatch.setenv("LOCAL_PROCESSES", "3")
  for extra in ([], ["--dry_run"]):   # the dry run printed its plan and exited 0
    assert sweep.main([tiny["config"], "--results_dir", tiny["results"],
                       "--main_cmd", " ".join(tiny["main_cmd"])] + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "error: --local_processes (LOCAL_PROCESSES)=3 (3 processes of one device each), run "), err
    assert "is not divisible by the data-parallel size 3" in err[0] and "allowed" in err[0]
    # What the flag the user turned may be (it offered only a batch, which no flag sets).
    assert err[0].endswith("or a mesh (or device count) whose data x fsdp divides 8"), err[0]
    assert not calls(tiny["log"]) and not os.path.exists(tiny["results"])
  # Only what the process count decides: a data path the trainer will refuse is not blamed on
  # LOCAL_PROCESSES here.
  run = sweep.list_runs(tiny["config"], tiny["results"])[0]
  config = sweep.config_of(sweep.load_config_module(tiny["config"]), run.arg)
  config.data.source, config.data.path = "parquet", "/nonexistent/shards"
  sweep.check_local_processes(config, 2, run)


@pytest.mark.parametrize("edit, error", [
    # A typo in the last entry: it stopped the dry run, but the sweep trained every run before
    # it, then recorded that one as failed.
    ("_good = sweep\nsweep = lambda: _good() + [dict(arch='hcc', shape='4x128', lr=1e-3)]\n",
     "error: run hcc_4x128_lr1e-3: config argument arch='hcc'; allowed: "
     + ", ".join(registry.names())),
    # A pilot copied from smoke.py with steps=10 keeps its warmup of 12: the dry run passed and
    # the sweep launched every run, each refused by the trainer, 'continuing' run after run.
    ("def get_config(arg=None):\n  c = smoke.get_config(arg)\n  c.steps = 10\n  return c\n",
     "error: run preln_4x128_lr1e-3: config.warmup_steps=12 is 12 of the run's 10 steps"),
    # The same under steps=-1 (the budget's 1 step): only the dry run counted the budget.
    ("def get_config(arg=None):\n  c = smoke.get_config(arg)\n  c.steps = -1\n"
     "  c.tokens_per_param = 1e-6\n  return c\n",
     "error: run preln_4x128_lr1e-3: config.warmup_steps=12 is 12 of the run's 1 steps"),
])
def test_a_suite_the_trainer_would_refuse_stops_the_sweep_before_any_run_trains(
    tiny, monkeypatch, capsys, edit, error):
  """The dry run and the sweep check every run they would launch (``sweep.checked_config``)."""
  monkeypatch.setenv("FAKE_LOG", tiny["log"])
  with open(tiny["config"], "a") as f:
    f.write(edit)
  for extra in (["--dry_run"], []):
    assert sweep.main([tiny["config"], "--results_dir", tiny["results"],
                       "--main_cmd", " ".join(tiny["main_cmd"])] + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(error), err
  assert not calls(tiny["log"])


def test_a_design_option_typo_stops_the_sweep_also_with_every_run_done(tiny, monkeypatch,
                                                                       capsys):
  """The sweep checked only the runs it would launch: with all done, `n_stream` (for
  n_streams) stopped the dry run, while the sweep exited 0 and reported that suite."""
  monkeypatch.setenv("FAKE_LOG", tiny["log"])
  module = sweep.load_config_module(tiny["config"])
  for run in sweep.list_runs(tiny["config"], tiny["results"]):
    write_summary(run.workdir, config=sweep.config_of(module, run.arg).to_dict())
  with open(tiny["config"], "a") as f:
    f.write("def get_config(arg=None, _get=get_config):\n  c = _get(arg)\n"
            "  c.model.residual.n_stream = 2\n  return c\n")
  for extra in (["--dry_run"], []):
    assert sweep.main([tiny["config"], "--results_dir", tiny["results"],
                       "--main_cmd", " ".join(tiny["main_cmd"])] + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "config.model.residual.n_stream: not a field" in err[0], err
  assert not calls(tiny["log"])


SMOKE_BODY = """
def get_config(arg=None):
  run = smoke.sweep_lib.parse_run_arg(arg, smoke.DEFAULTS)
  c = smoke.base.get_config()
  c.model = smoke.solver_model()
  {line}
  return smoke.sweep_lib.apply_run(c, run, smoke.ffn_rule())
"""


@pytest.mark.parametrize("edit, error", [
    # Set before apply_run, which sets the design with its defaults: a 4-stream HC trained.
    (SMOKE_BODY.format(line="c.model.residual.n_streams = 2"),
     "config.model.residual.n_streams=2 is set before sweep.apply_run"),
    (SMOKE_BODY.format(line="c.lr = 5e-4"), "config.lr=0.0005 is set before sweep.apply_run, "
     "which sets the run's design (with its defaults), shape, FFN and LR and made it 0.001; "
     "allowed: the suite's LR grid"),
    # An LR set after apply_run with the name to match (README's wording once): every LR of
    # the grid trained 1e-3 in a folder named for its own LR, the report's grid one LR twice.
    ("def get_config(arg=None, _get=get_config):\n  c = _get(arg)\n  c.lr = 1e-3\n"
     "  c.name = c.name.split('_lr')[0] + '_lr1e-3'\n  return c\n",
     "config.name='preln_4x128_lr1e-3': get_config renamed the run the sweep trains in"),
    ("def get_config(arg=None, _get=get_config):\n  c = _get(arg)\n  c.name = 'mine'\n"
     "  return c\n", "config.name='mine': get_config renamed the run"),
    (SMOKE_BODY.format(line="c.model.ffn_dim = 512"),
     "config.model.ffn_dim=512 is set before sweep.apply_run, which sets the run's design (with "
     "its defaults), shape, FFN and LR and made it None"),
    # A misspelt design key fell back to the default LR silently.
    ("LR_BY_ARCH = {'deepnrom': 2e-3}\n", "LR_BY_ARCH key 'deepnrom'; allowed: preln, "),
    ("LR_GRID = {'hc': 1e-3}\n", "LR_GRID['hc']=0.001; allowed: a tuple of positive LRs"),
    # Strings read one character at a time: "error: config argument lr='e'", naming no table.
    ("DEFAULT_LRS = '5e-4,1e-3'\n", "DEFAULT_LRS='5e-4,1e-3'; allowed: a tuple of positive"),
    ("from depthbench_jax.shapes import ShapeSet\nS = ShapeSet(1e6, 'total', ('4x128'))\n",
     "ShapeSet shapes='4x128'; allowed: a tuple of 'LxD' strings"),
    # A NameError in get_config was a traceback.
    (SMOKE_BODY.format(line="c.steps = STEPS"),
     "NameError: name 'STEPS' is not defined; allowed: a get_config that runs"),
])
def test_a_suite_file_mistake_is_one_error_line_naming_it(tiny, capsys, edit, error):
  """(The shape's own fields set before apply_run are not refused: the run's argument names the
  shape it replaces them with, as tests/reliability/tiny_suite.py does.)"""
  with open(tiny["config"], "a") as f:
    f.write(edit)
  assert sweep.main([tiny["config"], "--results_dir", tiny["results"], "--dry_run"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: ") and error in err[0], err
  assert not os.path.exists(tiny["results"])


def test_a_control_suite_copys_lr_grid_typed_as_a_string_is_named(tmp_path, capsys):
  """README has copies of the control suites edit lrs_for: one returning '1e-3' swept lr=1.0
  (from '1'), then stopped at "config argument lr='e'", naming no grid."""
  suite = tmp_path / "my_suite.py"
  suite.write_text("from configs import suite_400m\nfrom configs.suite_400m import get_config\n"
                   "NAME = 'my_suite'\nSHAPE_SETS = suite_400m.SHAPE_SETS\n"
                   "def lrs_for(design):\n  return '1e-3'\n"
                   "def sweep():\n  return suite_400m.sweep(SHAPE_SETS, lrs_for)\n")
  assert sweep.main([str(suite), "--results_dir", str(tmp_path / "r"), "--dry_run"]) == 2
  assert capsys.readouterr().err.strip().splitlines() == [
      "error: lrs_for('preln')='1e-3'; allowed: a tuple of positive LRs, e.g. (5e-4, 1e-3)"]


def test_a_control_suite_copys_own_lr_table_under_a_borrowed_lrs_for_is_refused(tmp_path,
                                                                                capsys):
  """A copy of suite_multiscale.py given its own DEFAULT_LRS/LR_GRID, with the borrowed
  ``lrs_for = suite_400m.lrs_for`` left: the tables were checked (a typo refused), then never
  read; the dry run planned suite_400m's grid for every design."""
  text = open(os.path.join(REPO, "configs", "suite_multiscale.py")).read()
  suite = tmp_path / "my_suite.py"
  suite.write_text(text + "\nDEFAULT_LRS = (1e-3, 2e-3)\nLR_GRID = {'hc': (5e-4,)}\n")
  assert sweep.main([str(suite), "--results_dir", str(tmp_path / "r"), "--dry_run"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [f"error: {suite}: DEFAULT_LRS and LR_GRID are read by no lrs_for: this file's "
                 "lrs_for is configs.suite_400m.lrs_for, which reads its own; allowed: a "
                 "lrs_for of this file's (def lrs_for(design): return LR_GRID.get(design, "
                 "DEFAULT_LRS)), or no table here"], err
  suite.write_text(text + "\nDEFAULT_LRS = (1e-3, 2e-3)\nLR_GRID = {'hc': (5e-4,)}\n"
                   "def lrs_for(design):\n  return LR_GRID.get(design, DEFAULT_LRS)\n")
  assert sweep.main([str(suite), "--results_dir", str(tmp_path / "r"), "--dry_run"]) == 0
  # The tables imported with the borrowed lrs_for are the ones it reads: no complaint.
  suite.write_text(text + "\nfrom configs.suite_400m import DEFAULT_LRS, LR_GRID\n")
  assert sweep.main([str(suite), "--results_dir", str(tmp_path / "r"), "--dry_run"]) == 0


def test_an_lr_grid_may_be_a_numpy_array(tiny, capsys):
  with open(tiny["config"], "a") as f:
    f.write("import numpy as np\nDEFAULT_LRS = 5e-4 * 2.0 ** np.arange(4)\n"
            "LR_GRID = {'hc': np.array([1e-3, 2e-3])}\n")
  assert sweep.main([tiny["config"], "--results_dir", tiny["results"], "--dry_run"]) == 0


def test_a_shape_set_before_apply_run_is_the_runs_own(tiny, capsys):
  with open(tiny["config"], "a") as f:
    f.write(SMOKE_BODY.format(line="c.model.d_model = 32; c.model.n_layers = 2; "
                                   "c.data.tokenizer = 'byte'; c.data.source = 'embedded'"))
  assert sweep.main([tiny["config"], "--results_dir", tiny["results"], "--dry_run"]) == 0
  assert "4 runs (0 done, 4 to run)" in capsys.readouterr().out


@pytest.mark.parametrize("flag", ["--results", "--dry"])
def test_an_abbreviated_flag_is_one_error_line(tiny, capsys, flag):
  """argparse took ``--results`` for ``--results_dir`` and ``--dry`` for ``--dry_run``, flags
  run_sweep.sh reads itself by their whole names: its 'dry run' then rendered the report, and a
  relative results dir went unresolved into the repo root."""
  with pytest.raises(SystemExit) as exit_:
    sweep.main([tiny["config"], flag, tiny["results"]] if flag == "--results" else
               [tiny["config"], "--results_dir", tiny["results"], flag])
  assert exit_.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(f"error: unrecognized arguments: {flag}" + (
      f" {tiny['results']}" if flag == "--results" else "") + "; allowed: "), err
  assert "[--results_dir RESULTS_DIR]" in err[0] and "[--dry_run]" in err[0]   # the usage


def test_local_processes_in_an_srun_step_is_refused(tiny, monkeypatch, capsys):
  """README's SLURM launch sets no JAX_* variable: each of the step's hosts ran every run as its
  own local cluster of LOCAL_PROCESSES, all into the same shared run dirs."""
  monkeypatch.setenv("FAKE_LOG", tiny["log"])
  monkeypatch.setenv("LOCAL_PROCESSES", "2")
  slurm_step(monkeypatch, ntasks=4)
  assert sweep.main([tiny["config"], "--results_dir", tiny["results"],
                     "--main_cmd", " ".join(tiny["main_cmd"])]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "LOCAL_PROCESSES)=2 with an srun step of SLURM_NTASKS=4" in err[0], err
  assert "allowed" in err[0] and not calls(tiny["log"])


def test_local_processes_that_is_not_a_number_is_one_error_line(tiny, monkeypatch, capsys):
  """LOCAL_PROCESSES=two was a ValueError traceback from argparse's default."""
  monkeypatch.setenv("LOCAL_PROCESSES", "two")
  assert sweep.main([tiny["config"], "--results_dir", tiny["results"], "--dry_run"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "LOCAL_PROCESSES)='two'" in err[0] and "allowed" in err[0], err
  assert sweep.main([tiny["config"], "--local_processes=-2", "--dry_run"]) == 2


def test_a_results_dir_that_is_a_file_is_one_error_line(tiny, tmp_path, capsys):
  """It was a NotADirectoryError traceback from the plan's checkpoint listing; the file stays."""
  path = tmp_path / "summary.json"
  path.write_text("{}")
  for extra in (["--dry_run"], ["--main_cmd", " ".join(tiny["main_cmd"])]):
    assert sweep.main([tiny["config"], "--results_dir", str(path)] + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --results_dir={path}: {path} is a file; allowed: a folder there "
                   f"(made if missing)"], err
  assert path.read_text() == "{}"
  # An empty value (a launch script's unset variable): the default folder was used unasked,
  # in the cwd, where run_sweep.sh refuses it.
  assert sweep.main([tiny["config"], "--results_dir=", "--dry_run"]) == 2
  assert capsys.readouterr().err.strip().splitlines() == [
      "error: --results_dir=: empty; allowed: a folder path (made if missing)"]


def _rec(design, L, d, lr, loss, status="ok"):
  return {"name": f"{design}_{L}x{d}_lr{lr}", "design": design, "n_layers": L, "d_model": d,
          "lr": lr, "final_val_loss": loss, "status": status}


def test_best_lr_ignores_diverged_runs():
  records = [
      _rec("hc", 16, 64, 1e-3, 3.10),
      _rec("hc", 16, 64, 2e-3, 2.90),
      _rec("hc", 16, 64, 4e-3, 1.00, status="diverged"),   # lower loss, but diverged
      _rec("hc", 16, 64, 8e-3, math.nan, status="diverged"),
      _rec("hc", 32, 48, 1e-3, math.inf),                  # "ok" but non-finite: excluded
      _rec("hc", 32, 48, 2e-3, 3.00, status="running"),    # unfinished: excluded
      {**_rec("preln", 16, 64, 1e-3, 3.2), "design": None, "n_layers": None, "d_model": None,
       "lr": None, "config": {"lr": 1e-3, "model": {"n_layers": 16, "d_model": 64,
                                                     "residual": {"name": "preln"}}}},
  ]
  groups = sweep.select_best_lr(records)
  best = groups[("hc", 16, 64)]
  assert best["best"]["lr"] == 2e-3 and len(best["excluded"]) == 2
  assert not best["lr_at_edge"]
  assert groups[("hc", 32, 48)]["best"] is None
  assert len(groups[("hc", 32, 48)]["excluded"]) == 2
  assert groups[("preln", 16, 64)]["best"]["final_val_loss"] == 3.2  # shape from its config


def test_run_sweep_sh_dry_run(tiny):
  """A dry run launches nothing and writes no report, also where a results dir exists (a report
  run there would rewrite report.md)."""
  write_summary(os.path.join(tiny["results"], "preln_4x128_lr1e-3"))
  before = helpers.snapshot(tiny["results"])
  out = subprocess.run([os.path.join(REPO, "launch", "run_sweep.sh"), tiny["config"],
                        "--dry_run", "--results_dir", tiny["results"]], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "suite tiny" in out.stdout and "4 runs (1 done, 3 to run)" in out.stdout
  assert helpers.snapshot(tiny["results"]) == before   # nothing ran, no report
  # The suite after a flag, as the sweep itself takes it: the script ran smoke.py with the file
  # as an extra word ("unrecognized arguments"); a flag's value is no suite file.
  out = subprocess.run([os.path.join(REPO, "launch", "run_sweep.sh"), "--dry_run", "--mfu",
                        "0.3", tiny["config"], "--results_dir", tiny["results"]], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "suite tiny" in out.stdout and "at MFU 0.3 of" in out.stdout
  # --config twice: the last won without a word (a positional beside --config is refused).
  out = subprocess.run([os.path.join(REPO, "launch", "run_sweep.sh"),
                        f"--config={tiny['config']}", "--config", "configs/smoke.py",
                        "--dry_run"], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert out.returncode == 2 and out.stderr.strip().splitlines()[-1] == (
      f"error: --config given twice ({tiny['config']}, configs/smoke.py); allowed: one suite "
      f"file"), out.stderr[-2000:]


# A trainer that runs until SIGTERM, then "saves" (a marker) and exits 0 without a summary.
SLEEPY_MAIN = textwrap.dedent("""
    import json, os, signal, sys, time
    args = dict(a.split("=", 1) for a in sys.argv[1:])
    workdir = args["--workdir"]
    def term(*_):
      open(os.path.join(workdir, "saved"), "w").write("1")
      sys.exit(0)
    signal.signal(signal.SIGTERM, term)
    os.makedirs(workdir, exist_ok=True)
    with open(os.environ["FAKE_LOG"], "a") as f:
      f.write(json.dumps({"workdir": workdir}) + "\\n")
    time.sleep(120)
""")


@pytest.mark.parametrize("via", ["sweep", "run_sweep.sh"])
def test_sigterm_reaches_the_running_job_and_stops_the_sweep(tiny, tmp_path, via):
  # A scheduler's SIGTERM to the sweep (or to the wrapper shell, PID 1 in a container): the
  # running trainer gets it and saves, no other run starts, exit 143, and no report is written.
  import signal
  import time
  sleepy = tmp_path / "sleepy_main.py"
  sleepy.write_text(SLEEPY_MAIN)
  args = [tiny["config"], "--results_dir", tiny["results"], "--main_cmd",
          f"{sys.executable} {sleepy}"]
  cmd = ([sys.executable, "-m", "depthbench_jax.sweep"] if via == "sweep"
         else [os.path.join(REPO, "launch", "run_sweep.sh")]) + args
  proc = subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ, FAKE_LOG=tiny["log"]),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  deadline = time.time() + 120
  while not calls(tiny["log"]) and time.time() < deadline:
    time.sleep(0.2)
  assert calls(tiny["log"]), "the first run never started"
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=60)
  assert proc.returncode == 128 + signal.SIGTERM, out[-2000:]
  started = calls(tiny["log"])
  assert len(started) == 1 and os.path.exists(os.path.join(started[0]["workdir"], "saved"))
  assert "stopped 1, not started 3" in out   # It said "stopped 4".
  assert not os.path.exists(os.path.join(tiny["results"], "report.md"))


def test_run_sweep_sh_reads_paths_from_the_callers_directory(tiny, tmp_path):
  # From another directory, a relative config and --results_dir are the caller's (the script
  # cds to the repo: results once landed under the repo and the config was not found).
  out = subprocess.run(
      [os.path.join(REPO, "launch", "run_sweep.sh"), "tiny_suite.py", "--results_dir=rel",
       "--main_cmd", " ".join(tiny["main_cmd"])], cwd=tmp_path,
      env=dict(os.environ, FAKE_LOG=tiny["log"]), capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert len(calls(tiny["log"])) == 4
  assert all(c["workdir"].startswith(str(tmp_path / "rel")) for c in calls(tiny["log"]))
  assert not os.path.exists(os.path.join(REPO, "rel"))


def test_plan_totals_count_what_is_left_to_run():
  """An interrupted run resumes from its latest checkpoint: half of b's 10 steps are done, so
  half its budget is left (its whole budget was counted)."""
  row = lambda name, state, tokens, flops, hours, done=0: {
      "name": name, "state": state, "aspect_ratio": 32.0, "params_total": 1e6,
      "params_non_embedding": 5e5, "steps": 10, "tokens": tokens, "flops": flops,
      "device_hours": hours, "steps_done": done}
  rows = [row("a", "done", 1000, 1e15, 1.0, 10), row("b", "partial", 2000, 2e15, 2.0, 5),
          row("c", "new", 4000, 4e15, 4.0)]
  assert sweep.format_plan(rows, 0.4, 1e12).splitlines()[-1] == (
      "3 runs (1 done, 2 to run); to run: 5K tokens, 5.000e+15 FLOPs, 5.0 device-hours at MFU "
      "0.4 of 1e+12 FLOP/s (all runs: 7.0 device-hours)")
  assert (sweep.human(1e6), sweep.human(1000), sweep.human(1234567)) == ("1M", "1K", "1.23M")


ILL_TYPED_SUITE = textwrap.dedent("""
    from configs import smoke
    NAME = "ill_typed"
    def get_config(arg=None):
      c = smoke.get_config(arg)
      c.steps = 1e3
      return c
    def sweep():
      return [dict(arch="preln", shape="4x128", lr=1e-3)]
""")


@pytest.mark.parametrize("flag", ["--mfu=0", "--mfu=1.5", "--mfu=nan", "--peak_flops=0",
                                  "--peak_flops=-1e15", "--peak_flops=989"])
def test_a_plan_with_an_impossible_mfu_or_peak_is_one_error_line(tiny, capsys, flag):
  """--mfu=0 or --peak_flops=0 was a ZeroDivisionError traceback; --mfu=1.5 or nan printed
  device-hours no device can reach (or nan), as did a peak in TFLOP/s (989)."""
  assert sweep.main([tiny["config"], "--results_dir", tiny["results"], "--dry_run", flag]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(f"error: {flag.split('=')[0]}="), err
  assert "allowed" in err[0]


def test_a_value_of_the_wrong_type_in_the_suite_file_is_one_error_line(tmp_path, capsys):
  """``c.steps = 1e3`` in a suite file: ConfigDict's TypeError (a traceback) becomes one error
  naming the file's line, the field and its type."""
  config = tmp_path / "ill_typed_suite.py"
  config.write_text(ILL_TYPED_SUITE)
  assert sweep.main([str(config), "--results_dir", str(tmp_path / "r"), "--dry_run"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: "), err
  assert f"{config}:6" in err[0] and "c.steps = 1e3" in err[0], err
  assert "allowed: a value of type int" in err[0], err
  # An argument the file's get_config does not take is named as such, not as a field.
  with pytest.raises(ConfigError, match=r"base.py:arch=hc: get_config\(\) takes 0 .*allowed: "
                                        r"the file alone"):
    sweep.config_of(sweep.load_config_module(os.path.join(REPO, "configs", "base.py")),
                    "arch=hc")


def test_every_design_hyperparameter_can_be_overridden_by_flag(monkeypatch):
  """``--config.model.residual.<field>=`` for each field of each design's defaults (KEEL's
  ``alpha`` defaults to None = 2L, which config_flags refused to override at all), each to a
  value other than its default (the default itself would pass with the flag ignored; every
  bool default is True, so ``False`` is what a ``bool('False')`` parser would get wrong)."""
  from absl import flags
  from ml_collections import config_flags
  from depthbench_jax.residual import registry
  other = {type(None): lambda v: 8.0, bool: lambda v: not v, int: lambda v: v + 1,
           str: lambda v: v + "_other"}
  for design in registry.names():
    for field, default in registry.get(design).defaults.items():
      value = other[type(default)](default)
      assert value != default
      flag_values = flags.FlagValues()
      config_flags.DEFINE_config_file("config", None, flag_values=flag_values)
      argv = ["prog", f"--config={SMOKE}:arch={design}",
              f"--config.model.residual.{field}={value}"]
      monkeypatch.setattr(sys, "argv", argv)  # config_flags reads the overrides from sys.argv.
      flag_values(argv)
      assert flag_values.config.model.residual[field] == value, (design, field)


@pytest.mark.parametrize("suite", ["smoke.py", "suite_400m.py"])
def test_warmup_steps_by_flag_is_steps_or_a_fraction_in_every_suite(monkeypatch, suite):
  """base.py documents a fraction in (0, 1), but typed the field int, so on the smoke suite
  ``--config.warmup_steps=0.1`` was 'invalid literal for int()'; suite_400m retyped it float."""
  from absl import flags
  from ml_collections import config_flags
  from depthbench_jax.train.optimizer import warmup_steps_of
  for value, steps in ((0.1, 10), (20, 20)):
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, flag_values=flag_values)
    argv = ["prog", f"--config={os.path.join(REPO, 'configs', suite)}:arch=preln",
            f"--config.warmup_steps={value}"]
    monkeypatch.setattr(sys, "argv", argv)
    flag_values(argv)
    assert type(flag_values.config.warmup_steps) is type(value)
    assert warmup_steps_of(flag_values.config, total_steps=100) == steps


def test_a_suite_runs_optional_model_fields_can_be_overridden_by_flag(monkeypatch):
  """base.py types n_kv_heads, head_dim and ffn_dim (None = derived) so that a flag can set
  them; a suite's shaped model kept their None but lost the type, and config_flags refused
  ``--config.model.n_kv_heads=2`` on every suite run."""
  from absl import flags
  from ml_collections import config_flags
  for field, value in (("n_kv_heads", 2), ("head_dim", 64), ("ffn_dim", 512)):
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, flag_values=flag_values)
    argv = ["prog", f"--config={SMOKE}:arch=preln", f"--config.model.{field}={value}"]
    monkeypatch.setattr(sys, "argv", argv)  # config_flags reads the overrides from sys.argv.
    flag_values(argv)
    assert flag_values.config.model[field] == value, field


def test_dry_run_refuses_a_suite_whose_runs_main_would_refuse(tmp_path, capsys):
  """A misspelt field or a bad recipe value in a suite file: the plan printed every run as if
  fine, and each run then failed at its start on the pod. The dry run names the first."""
  config = tmp_path / "typo_suite.py"
  for line, field in (("c.warmup_step = 5", "config.warmup_step"),
                      ("c.weight_decay = -0.1", "config.weight_decay"),
                      # A long-context copy raising seq_len alone: every run failed at start.
                      ("c.data.seq_len = 8192", "config.model.max_seq_len=4096")):
    config.write_text(textwrap.dedent(f"""
        from configs import smoke
        def get_config(arg=None):
          c = smoke.get_config(arg)
          {line}
          return c
        def sweep():
          return [dict(arch="preln", shape="4x128", lr=1e-3)]
    """))
    assert sweep.main([str(config), "--results_dir", str(tmp_path / "r"), "--dry_run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: run preln_4x128_lr1e-3: "), err
    assert field in err[0] and "allowed" in err[0], err


def test_config_flag_is_the_positional_s_other_spelling(tiny, capsys):
  """main.py, systems and report take ``--config=SUITE``; the sweep took only a positional, so
  ``python -m depthbench_jax.sweep --config=configs/suite_400m.py --dry_run`` was argparse's
  'the following arguments are required: config'. Both spellings give the same plan; two
  different files, or none, are one error line."""
  args = ["--results_dir", tiny["results"], "--dry_run"]
  assert sweep.main([tiny["config"], *args]) == 0
  positional = capsys.readouterr().out
  assert sweep.main([f"--config={tiny['config']}", *args]) == 0
  assert capsys.readouterr().out == positional and "4 runs" in positional
  assert sweep.main([tiny["config"], f"--config={tiny['config']}", *args]) == 0
  capsys.readouterr()
  for bad in ([SMOKE, f"--config={tiny['config']}"], []):
    assert sweep.main([*bad, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: suite config") and "allowed" in err[0], err


OFF_TARGET_SUITE = textwrap.dedent("""
    from configs import smoke
    from depthbench_jax.shapes import ShapeSet
    NAME = "off_target"
    SHAPE_SETS = {"smoke": ShapeSet(target=918_912, count="total", shapes=("4x128", "8x160"))}
    get_config, ffn_rule, solver_model = smoke.get_config, smoke.ffn_rule, smoke.solver_model
    def sweep():
      return [dict(arch="preln", shape=s, lr=1e-3) for s in SHAPE_SETS["smoke"].shapes]
""")


def test_dry_run_warns_of_a_listed_shape_off_its_target(tmp_path, capsys):
  """A new suite's mistyped width (8x160 for the solver's 8x96): the plan printed its runs as if
  iso-parameter. 8x160 counts 2,624,480 (hand: 8 x (4 x 160^2 + 3 x 160 x 448 + 2 x 160)
  + 2 x 257 x 160 + 160), +185.61% off 918,912; 4x128 is the target itself."""
  config = tmp_path / "off_target_suite.py"
  config.write_text(OFF_TARGET_SUITE)
  assert sweep.main([str(config), "--results_dir", str(tmp_path / "r"), "--dry_run"]) == 0
  warnings = [l for l in capsys.readouterr().out.splitlines() if l.startswith("warning:")]
  assert len(warnings) == 1, warnings
  assert "shape 8x160 has 2.624M total Pre-LN parameters, +185.61% off" in warnings[0]
  assert "tolerance 2.00%" in warnings[0] and str(config) in warnings[0]


def test_dry_run_counts_the_model_get_config_builds_not_the_solvers(tmp_path, capsys):
  """A suite copy whose get_config ties the embeddings (README: a field set after apply_run):
  its runs hold 886.0K, not the 918.9K solver_model counts, -3.58% off the target (tied:
  918,912 - 257 x 128), and the dry run said nothing. A width the heads do not divide is named
  with its shape set (it said only 'does not divide d_model=130')."""
  config = tmp_path / "tied_suite.py"
  config.write_text(OFF_TARGET_SUITE.replace('shapes=("4x128", "8x160")', 'shapes=("4x128",)')
                    + textwrap.dedent("""
    def get_config(arg=None):
      c = smoke.get_config(arg)
      c.model.tie_embeddings = True
      return c
  """))
  assert sweep.main([str(config), "--results_dir", str(tmp_path / "r"), "--dry_run"]) == 0
  warnings = [l for l in capsys.readouterr().out.splitlines() if l.startswith("warning:")]
  assert warnings == [
      "warning: SHAPE_SETS['smoke'] shape 4x128 has 886K total Pre-LN parameters as get_config "
      "builds it (solver_model('smoke') counts 918.9K), -3.58% off its target 918.9K (tolerance "
      "2.00%); give solver_model('smoke') the model fields get_config sets, then the solver's "
      f"widths: python -m depthbench_jax.shapes {config}"], warnings
  config.write_text(OFF_TARGET_SUITE.replace('"8x160"', '"8x130"'))
  assert sweep.main([str(config), "--results_dir", str(tmp_path / "r"), "--dry_run"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].startswith(f"error: {config}: SHAPE_SETS['smoke'] shape 8x130: "), err
  assert "or set config.model.head_dim explicitly" in err[-1]
  # Doing what it says, in get_config: the solver's model still could not count the shape,
  # and the dry run refused with the same line (walker 219).
  config.write_text(OFF_TARGET_SUITE.replace('"8x160"', '"8x130"') + textwrap.dedent("""
    def get_config(arg=None):
      c = smoke.get_config(arg)
      if c.model.d_model % c.model.n_heads:
        c.model.head_dim = 32
      return c
  """))
  assert sweep.main([str(config), "--results_dir", str(tmp_path / "r"), "--dry_run"]) == 0
  out = capsys.readouterr().out
  assert "preln_8x130_lr1e-3" in out and "shape 8x130 has " in out


def test_a_process_groups_second_sigterm_is_not_announced_again(capsys):
  """SIGTERM to run_sweep.sh's process group reaches the sweep twice (directly and forwarded by
  the script's trap): the notice printed twice."""
  stop = sweep._Stop()
  stop._handle(signal.SIGTERM, None)
  stop._handle(signal.SIGTERM, None)
  assert capsys.readouterr().out.count("SIGTERM: passing it") == 1 and stop.requested


@pytest.mark.parametrize("main_cmd, said", [
    ('python -m "depthbench_jax.main', "--main_cmd='python -m \"depthbench_jax.main' (No closing "
     "quotation); allowed: a command that trains one run"),
    ("", "--main_cmd=''; allowed: a command that trains one run")])
def test_a_main_cmd_that_is_no_command_is_one_error_line_before_any_run(tmp_path, capsys,
                                                                        main_cmd, said):
  """An unclosed quote was a ValueError traceback after every run's config was checked; an
  empty one launched '--config=...' as the program, every run 'could not start'."""
  results = tmp_path / "r"
  assert sweep.main([os.path.join(REPO, "configs", "smoke.py"), f"--results_dir={results}",
                     f"--main_cmd={main_cmd}"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [f"error: {said}, e.g. 'python -m depthbench_jax.main'"], err
  assert not results.exists()


@pytest.mark.parametrize("source, said", [
    ("import nosuchmod\n", "does not load: ModuleNotFoundError: No module named 'nosuchmod'"),
    ("from configs import smoke\nget_config = smoke.get_config\nNAME = 'x'\n"
     "def sweep():\n  return undefined_name\n", "sweep() raised NameError"),
    # Entries that are no runs: tracebacks in the sweep's dry run once (the report said so).
    ("from configs import smoke\nget_config = smoke.get_config\nNAME = 'x'\n"
     "def sweep():\n  return None\n", "sweep gave NoneType; allowed: a list of run entries"),
    ("from configs import smoke\nget_config = smoke.get_config\nNAME = 'x'\n"
     "def sweep():\n  return [{'arch': 'preln', 'lr': 1e-3}]\n",
     "sweep entry {'arch': 'preln', 'lr': 0.001}; allowed: a dict with arch, shape and lr"),
    ("from configs import smoke\nget_config = smoke.get_config\nNAME = 'x'\n"
     "def sweep():\n  return ['arch=preln,shape=4x128,lr=1e-3']\n", "allowed: a dict with"),
    ("from configs import smoke\nget_config = smoke.get_config\nNAME = 'x'\n"
     "def sweep():\n  return [{'arch': 'preln', 'shape': '4x128', 'lr': float('nan')}]\n",
     "config argument lr='nan'; allowed: a positive number"),
    # A list where one value goes: 'config argument 0.002]', a value nobody typed, in no file.
    ("from configs import smoke\nget_config = smoke.get_config\nNAME = 'x'\n"
     "def sweep():\n  return [{'arch': 'hc', 'shape': '4x128', 'lr': [1e-3, 2e-3]}]\n",
     "suite.py: sweep entry {'arch': 'hc', 'shape': '4x128', 'lr': [0.001, 0.002]}: config "
     "argument")])
def test_a_suite_that_does_not_load_is_one_error_line(tmp_path, capsys, source, said):
  """A suite with an import or a name error was its traceback from sweep, systems and shapes
  (report already said it in one line)."""
  suite = tmp_path / "suite.py"
  suite.write_text(source)
  assert sweep.main([str(suite), "--dry_run", "--results_dir", str(tmp_path / "r")]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: ") and said in err[0], err
