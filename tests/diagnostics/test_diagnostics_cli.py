"""End to end: train a tiny run with the in-loop hook, then ``python -m depthbench_jax.diagnose``."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import (ROOT, assert_cli_refuses_before_loading, assert_refused_untouched,
                           run_main, subprocess_env, tiny_flags)


@pytest.mark.slow
def test_training_hook_and_posthoc_cli(tmp_path):
  workdir = str(tmp_path / "run")
  run_main(workdir, tiny_flags(**{"model.n_layers": 4, "steps": 10, "diagnostics.every": 5,
                                     "tensorboard": True}))

  from tensorboard.backend.event_processing import event_accumulator
  acc = event_accumulator.EventAccumulator(os.path.join(workdir, "tensorboard"),
                                           size_guidance={"tensors": 0})
  acc.Reload()
  tags = set(acc.Tags()["tensors"])
  assert {"diagnostics/causal_share", "diagnostics/permutation_share",
          "diagnostics/causal", "diagnostics/permutation"} <= tags
  assert [e.step for e in acc.Tensors("diagnostics/causal_share")] == [5, 10]

  proc = subprocess.run([sys.executable, "-m", "depthbench_jax.diagnose", f"--workdir={workdir}",
                         "--set=causal_reduction=max"], cwd=ROOT, env=subprocess_env(),
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(os.path.join(workdir, "diagnostics.json")) as f:
    result = json.load(f)
  assert result["step"] == 10 and result["design"] == "preln"
  assert (f"diagnostics at step 10 -> {os.path.join(workdir, 'diagnostics.json')}" in proc.stderr
          and "causal share " in proc.stderr and "(late pairs above 0.45)" in proc.stderr
          and ": late angular distance 0." in proc.stderr)
  assert result["causal"]["reduction"] == "max"
  for rel in result["plots"].values():
    assert os.path.exists(os.path.join(workdir, rel))


def test_cli_misspelt_set_key_is_one_error_before_the_checkpoint_loads(tmp_path):
  """--set=permutaton_chunk=4 (once silently ignored): one error line naming the allowed keys,
  exit 2, the run dir untouched."""
  (tmp_path / "summary.json").write_text('{"status": "ok"}')
  proc = subprocess.run([sys.executable, "-m", "depthbench_jax.diagnose", f"--workdir={tmp_path}",
                         "--set=permutaton_chunk=4"], cwd=ROOT, env=subprocess_env(),
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: --set=permutaton_chunk=4: ")
  assert "allowed keys: batch_size" in lines[0]
  assert os.listdir(tmp_path) == ["summary.json"]


@pytest.mark.parametrize("flag, named", [
    ("--batch_size=abc", "--batch_size=abc"),   # absl: a FATAL line and exit 1
    ("--batch_size=0", "--batch_size=0"),       # once silently the config's batch size
    ("--batch_size=-2", "--batch_size=-2"),     # once a traceback after the checkpoint loaded
    ("--nope=1", "nope"),                       # absl: a FATAL line and exit 1
    # An unquoted glob's second folder: dropped once, the first run alone diagnosed, exit 0.
    ("results/x/run_b/", "unexpected argument 'results/x/run_b/': not a flag"),
])
def test_cli_bad_flag_is_one_error_line_before_the_checkpoint_loads(tmp_path, flag, named):
  assert_cli_refuses_before_loading("depthbench_jax.diagnose", tmp_path, [flag], named)


@pytest.mark.parametrize("flags, named", [
    # Each once resolved without a word: the flag's batch, the per-field threshold.
    (["--set=batch_size=1", "--batch_size=2"], "--batch_size=2 and --set=batch_size=1"),
    (["--set=thresholds=[0.3,0.1]", "--set=causal_threshold=0.45"],
     "--set=thresholds and --set=causal_threshold both set it"),
])
def test_cli_two_flags_setting_one_option_are_one_error_line(tmp_path, flags, named):
  assert_cli_refuses_before_loading("depthbench_jax.diagnose", tmp_path, flags, named)


@pytest.mark.parametrize("item, named", [
    ("causal_reduction=foo", "causal_reduction"),   # once a ConfigError traceback after the restore
    ("thresholds=0.5", "thresholds"),               # once a TypeError traceback
    ("curve_points=abc", "curve_points"),           # once a TypeError traceback
    ("batch_size=0", "batch_size"),                 # once silently the whole held-out batch
    ("dead_threshold=abc", "dead_threshold"),       # once silently accepted
    ("dead_threshold=2", "dead_threshold"),         # every Block AttnRes layer 'dead'
    ("causal_threshold=-0.1", "causal_threshold"),  # a 100% share
    ("run_causal=maybe", "run_causal"),             # once silently true
])
def test_cli_bad_set_value_is_one_error_line_before_the_checkpoint_loads(tmp_path, item, named):
  assert_cli_refuses_before_loading("depthbench_jax.diagnose", tmp_path, [f"--set={item}"],
                                    named, starts="error: --set")


def test_cli_on_a_run_without_held_out_batches_is_one_error_line(tmp_path):
  """config.data.val_batches=0 was an app.UsageError: the whole flag help, then the message, and
  exit 1."""
  from tests.helpers import saved_run
  workdir = str(tmp_path / "run")
  saved_run(workdir, **{"data.val_batches": 0})
  before = sorted(os.listdir(workdir))
  proc = _diagnose(workdir)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.strip().splitlines() if l.startswith("error: ")]
  assert len(lines) == 1 and "config.data.val_batches=0" in lines[0] and "allowed" in lines[0]
  assert "--helpfull" not in proc.stderr and "--workdir: Run directory" not in proc.stderr
  assert sorted(os.listdir(workdir)) == before


def test_cli_on_a_run_whose_training_data_moved_is_one_error_line(tmp_path):
  """A run trained on parquet shards diagnosed where they are not (another host, a moved
  folder): the held-out batches cannot be made; one error line naming config.data.path, exit 2,
  where it was the ConfigError's traceback and exit 1."""
  from tests.helpers import saved_run
  workdir = str(tmp_path / "run")
  missing = str(tmp_path / "moved" / "*.parquet")
  saved_run(workdir, **{"data.source": "parquet", "data.path": missing})
  before = sorted(os.listdir(workdir))
  proc = _diagnose(workdir)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.strip().splitlines() if l.startswith("error: ")]
  assert len(lines) == 1 and lines[0].startswith(f"error: config.data.path={missing!r}"), lines
  assert "allowed" in lines[0] and "Traceback" not in proc.stderr
  assert sorted(os.listdir(workdir)) == before


# What a plain diagnose of a tiny run records: config.diagnostics' defaults, less the *_chunk
# memory knobs (they do not change the numbers).
DEFAULT = {"batch_size": 2, "causal_threshold": 0.45, "permutation_threshold": 0.15,
           "curve_points": 101, "causal_reduction": "mean", "causal_skip": "zero_update",
           "permutation_pairs": "all",
           "dead_threshold": 0.05, "run_causal": True, "run_permutation": True}


def _run_with_diagnostics(tmp_path, options):
  """A saved run whose diagnostics.json was made with ``options``; returns (workdir, its bytes)."""
  from tests.helpers import saved_run
  workdir = str(tmp_path / "run")
  saved_run(workdir)
  path = os.path.join(workdir, "diagnostics.json")
  with open(path, "w") as f:
    json.dump({"step": 1, "design": "preln", "options": options, "plots": {}, "angular": {}}, f)
  return workdir, open(path, "rb").read()


def _diagnose(workdir, *flags):
  return subprocess.run([sys.executable, "-m", "depthbench_jax.diagnose", f"--workdir={workdir}",
                         *flags], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
                        timeout=300)


@pytest.mark.parametrize("flag, named", [
    ("--set=causal_reduction=max", '--set=causal_reduction="max"'),
    ("--batch_size=1", "--batch_size=1"),
    ("--set=thresholds=[0.5,0.15]", "--set=causal_threshold=0.5"),
])
def test_cli_rerun_with_other_settings_is_refused_and_leaves_the_diagnostics(
    tmp_path, flag, named):
  """Once silently replaced diagnostics.json and its plots: now one error line naming the
  setting, the file and its value, and the way out; nothing written."""
  workdir, before = _run_with_diagnostics(tmp_path, DEFAULT)
  files = sorted(os.listdir(workdir))
  proc = _diagnose(workdir, flag)
  assert_refused_untouched(proc, named, os.path.join(workdir, "diagnostics.json"), before,
                           files)  # No plots/ either.


def test_cli_out_at_the_runs_evals_is_refused_as_another_tools_result(tmp_path):
  """``diagnose --out=RUN/evals.json`` was refused naming ten ``--set=`` flags the user never
  gave, against evaluate's batch_size; now the file is named as no diagnostics result."""
  workdir, _ = _run_with_diagnostics(tmp_path, DEFAULT)
  evals = os.path.join(workdir, "evals.json")
  with open(evals, "w") as f:
    json.dump({"step": 1, "domains": {}, "sets": {}, "options": {"batch_size": 8}}, f)
  before, files = open(evals, "rb").read(), sorted(os.listdir(workdir))
  assert_refused_untouched(_diagnose(workdir, f"--out={evals}"), f"--out={evals} holds no "
                           "diagnostics result ('angular' not in it", evals, before, files)


def test_cli_rerun_with_the_same_settings_replaces_diagnostics_and_records_them(tmp_path):
  """A memory knob (permutation_chunk) is not a setting: the file is replaced. The console
  carries no INFO lines (orbax's restore once printed ~30) and no warning (it warned that a
  "Metadata file does not exist" in every checkpoint it read)."""
  workdir, _ = _run_with_diagnostics(tmp_path, DEFAULT)
  proc = _diagnose(workdir, "--set=permutation_chunk=2")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert not re.search(r"^[IW]\d{4} ", proc.stderr, re.M), proc.stderr[-2000:]
  result = json.load(open(os.path.join(workdir, "diagnostics.json")))
  assert result["step"] == 5 and result["options"] == DEFAULT
  # Two layers have no late pair (a share of null): said so, not a TypeError after the write.
  assert result["causal"]["share"] is None
  assert "causal share n/a (no late pairs)" in proc.stderr


def test_cli_overwrite_replaces_diagnostics_made_with_other_settings(tmp_path):
  """...and the plots: the permutation heatmap of the replaced run, which the new
  diagnostics.json no longer names, is removed (it stayed beside the new ones)."""
  workdir, _ = _run_with_diagnostics(tmp_path, DEFAULT)
  plots = os.path.join(workdir, "plots")
  os.makedirs(plots)
  for name in ("diag_permutation.png", "other_diag_permutation.png", "notes.png"):
    open(os.path.join(plots, name), "wb").write(b"old")
  proc = _diagnose(workdir, "--set=causal_reduction=max", "--set=run_permutation=false",
                   "--overwrite")
  assert proc.returncode == 0, proc.stderr[-2000:]
  result = json.load(open(os.path.join(workdir, "diagnostics.json")))
  assert result["step"] == 5 and result["options"] == dict(
      DEFAULT, causal_reduction="max", run_permutation=False)
  assert os.path.exists(os.path.join(plots, "diag_causal.png"))
  assert "permutation" not in result["plots"]
  assert sorted(os.listdir(plots)) == sorted(
      ["notes.png", "other_diag_permutation.png", *map(os.path.basename,
                                                        result["plots"].values())])


def test_cli_out_beside_the_runs_diagnostics_names_its_own_plots(tmp_path):
  """--out=RUN/diag_debug.json replaced RUN/plots/diag_*.png, which the run's diagnostics.json
  (and the report's heatmaps) still named; its plots are now diag_debug_diag_*.png."""
  workdir, _ = _run_with_diagnostics(tmp_path, DEFAULT)
  assert _diagnose(workdir).returncode == 0
  own = {p: open(os.path.join(workdir, "plots", p), "rb").read()
         for p in os.listdir(os.path.join(workdir, "plots"))}
  proc = _diagnose(workdir, "--batch_size=1", f"--out={workdir}/diag_debug.json")
  assert proc.returncode == 0, proc.stderr[-2000:]
  result = json.load(open(os.path.join(workdir, "diag_debug.json")))
  assert result["plots"]["causal"] == os.path.join("plots", "diag_debug_diag_causal.png")
  assert all(open(os.path.join(workdir, "plots", p), "rb").read() == data
             for p, data in own.items())


def test_cli_out_writes_elsewhere_and_leaves_the_diagnostics_and_plots(tmp_path):
  """--out: the result and its plots/ go beside PATH (plot paths still relative to the run)."""
  workdir, before = _run_with_diagnostics(tmp_path, DEFAULT)
  side = tmp_path / "debug" / "diagnostics.json"
  proc = _diagnose(workdir, "--set=causal_reduction=max", f"--out={side}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  result = json.load(open(side))
  assert result["options"] == dict(DEFAULT, causal_reduction="max")
  assert os.path.exists(os.path.join(workdir, result["plots"]["causal"]))
  assert os.path.exists(tmp_path / "debug" / "plots" / "diag_causal.png")
  assert open(os.path.join(workdir, "diagnostics.json"), "rb").read() == before
  assert not os.path.exists(os.path.join(workdir, "plots"))
  # A file where its plots/ go: a FileExistsError traceback after every probe, no result.
  other = tmp_path / "other"
  other.mkdir()
  (other / "plots").write_text("notes")
  proc = _diagnose(workdir, f"--out={other / 'diagnostics.json'}")
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert [l for l in proc.stderr.splitlines() if l.startswith("error:")] == [
      f"error: --out={other / 'diagnostics.json'}: {other / 'plots'} is a file; allowed: a "
      f"folder there (made if missing)"]


def test_cli_step_reads_that_checkpoint_not_the_latest(tmp_path):
  """Every --step test ran on a run of one checkpoint, its latest: --step dropped (the latest
  read) passed them."""
  from tests.helpers import saved_run
  workdir = str(tmp_path / "run")
  saved_run(workdir, step=10, earlier=(5,))
  proc = _diagnose(workdir, "--step=5")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert json.load(open(os.path.join(workdir, "diagnostics.json")))["step"] == 5


@pytest.mark.parametrize("flag, named, batch", [
    ("--batch_size=100", "--batch_size=100", 8), ("--set=batch_size=9", "--set=batch_size=9", 8),
    # A run trained with diagnostics off (not checked then) and the default 2 rows.
    ("--step=5", "config.diagnostics.batch_size=2", 1)])
def test_cli_more_rows_than_a_validation_batch_holds_is_refused(tmp_path, flag, named, batch):
  """--batch_size=100 on a run whose validation batch holds 8 rows diagnosed 8 and recorded 100,
  so a rerun with --batch_size=8 (the same numbers) was refused as other settings."""
  from tests.helpers import saved_run
  workdir = str(tmp_path / "run")
  saved_run(workdir, **{"data.global_batch_size": batch})
  files = sorted(os.listdir(workdir))
  proc = _diagnose(workdir, flag)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  how = "" if flag.startswith(("--batch_size", "--set")) else ", set by --batch_size=N"
  assert lines == [f"error: {named}; allowed: 1..{batch} (the rows of a validation batch, "
                   f"config.data.global_batch_size){how}"], proc.stderr[-2000:]
  assert sorted(os.listdir(workdir)) == files
