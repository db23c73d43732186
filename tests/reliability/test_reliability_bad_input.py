"""Bad configs and flags: each is one ``error:`` line naming the field and what is allowed,
raised before any compute, leaving existing results untouched.

Most cases call ``config_check.validate`` in this process (milliseconds each); a few go end to
end through ``main.py`` (flag parsing, the config file's argument, exit status, the run dir).
"""

import json
import math
import os
import subprocess
import sys

import pytest

from depthbench_jax.errors import ConfigError, HostsDiffer
from depthbench_jax.main import SLURM_STEP_VARIABLES
from depthbench_jax.train import config_check
from tests import helpers
from tests.helpers import slurm_step

# (case, config overrides on tests.helpers.tiny_config, device count, process count, field).
CASES = [
    ("heads_not_dividing_width", {"model.n_heads": 3}, 1, 1, "config.model.n_heads"),
    ("kv_heads_not_dividing_heads", {"model.n_heads": 4, "model.n_kv_heads": 3}, 1, 1,
     "config.model.n_kv_heads"),
    ("odd_head_dim", {"model.d_model": 30}, 1, 1, "config.model.head_dim"),
    ("zero_layers", {"model.n_layers": 0}, 1, 1, "config.model.n_layers"),
    ("no_max_seq_len", {"model.max_seq_len": None}, 1, 1, "config.model.max_seq_len"),
    ("unknown_design", {"model.residual.name": "resnet"}, 1, 1, "config.model.residual.name"),
    ("unknown_remat_policy", {"model.remat_policy": "full"}, 1, 1, "config.model.remat_policy"),
    ("unsupported_dtype", {"model.dtype": "float16"}, 1, 1, "config.model.dtype"),
    ("unknown_attention_kernel", {"model.attention_kernel": "flash"}, 1, 1,
     "config.model.attention_kernel"),
    ("vocab_below_tokenizer", {"model.vocab_size": 100}, 1, 1, "config.model.vocab_size"),
    ("negative_steps", {"steps": -5}, 1, 1, "config.steps"),
    ("zero_steps", {"steps": 0}, 1, 1, "config.steps"),
    ("negative_lr", {"lr": -1.0}, 1, 1, "config.lr"),
    ("infinite_lr", {"lr": float("inf")}, 1, 1, "config.lr"),
    ("b2_of_one", {"b2": 1.0}, 1, 1, "config.b2"),
    ("negative_weight_decay", {"weight_decay": -0.1}, 1, 1, "config.weight_decay"),
    ("negative_peak_flops", {"peak_flops_per_device": -1e15}, 1, 1,
     "config.peak_flops_per_device"),   # once a negative MFU
    ("unknown_budget_design", {"budget_design": "resnet"}, 1, 1, "config.budget_design"),
    ("zero_log_every", {"log_every": 0}, 1, 1, "config.log_every"),
    ("zero_checkpoint_every", {"checkpoint_every": 0}, 1, 1, "config.checkpoint_every"),
    ("negative_eval_every", {"eval_every": -1}, 1, 1, "config.eval_every"),
    ("mesh_not_device_count", {"mesh.data": 3}, 1, 1, "config.mesh"),
    ("mesh_two_wildcards", {"mesh.data": -1, "mesh.fsdp": -1}, 8, 1, "config.mesh"),
    ("batch_not_divisible_by_data_parallel",
     {"mesh.data": 2, "mesh.fsdp": 2, "data.global_batch_size": 6}, 4, 1,
     "config.data.global_batch_size"),
    ("batch_not_divisible_by_processes", {"mesh.data": 1, "mesh.tensor": -1}, 3, 3,
     "config.data.global_batch_size"),
    ("tensor_axis_across_processes", {"mesh.data": 1, "mesh.tensor": -1}, 4, 2, "config.mesh"),
    ("zero_batch", {"data.global_batch_size": 0}, 1, 1, "config.data.global_batch_size"),
    # Read by the diagnostics' check before its own: a TypeError (None > 0) once.
    ("no_val_batches_under_diagnostics", {"data.val_batches": None, "diagnostics.every": 5}, 1,
     1, "config.data.val_batches"),
    ("zero_grad_accum_steps", {"grad_accum_steps": 0}, 1, 1, "config.grad_accum_steps"),
    # 8 rows over 2 shards: 4 each, not 8 slices (8 divides the global batch: only the
    # per-shard check can refuse it; 3 slices passed a check of the global batch too).
    ("grad_accum_not_dividing_a_shards_rows",
     {"grad_accum_steps": 8, "mesh.data": 2}, 2, 1, "config.grad_accum_steps"),
    ("seq_len_over_rope_limit", {"data.seq_len": 8192}, 1, 1, "config.data.seq_len"),
    ("missing_data_path", {"data.source": "parquet", "data.path": "/nonexistent/shards"}, 1, 1,
     "config.data.path"),
    ("unknown_data_source", {"data.source": "hdf5"}, 1, 1, "config.data.source"),
    ("tfds_without_name", {"data.source": "tfds"}, 1, 1, "config.data.tfds_name"),
    ("unknown_tokenizer", {"data.tokenizer": "sentencepiece"}, 1, 1, "config.data.tokenizer"),
    ("non_iso_shape", {"iso_target_params": 1e6}, 1, 1, "config.model shape"),
    ("unknown_iso_count", {"iso_target_params": 1e6, "iso_count": "embedding"}, 1, 1,
     "config.iso_count"),
    ("negative_spike_factor", {"divergence.spike_factor": -1.0}, 1, 1,
     "config.divergence.spike_factor"),
    ("spike_factor_at_most_one", {"divergence.spike_factor": 0.5}, 1, 1,   # all runs diverged
     "config.divergence.spike_factor"),
    ("negative_nan_injection_step", {"debug.nan_at_step": -3}, 1, 1, "config.debug.nan_at_step"),
    ("negative_diagnostics_every", {"diagnostics.every": -3}, 1, 1, "config.diagnostics.every"),
    ("diagnostics_without_validation", {"diagnostics.every": 5, "data.val_batches": 0}, 1, 1,
     "config.diagnostics.every"),
    # Once checked only when the training hook was built (after config.json), or never.
    ("unknown_causal_reduction", {"diagnostics.causal_reduction": "median"}, 1, 1,
     "config.diagnostics.causal_reduction"),
    ("three_thresholds", {"diagnostics.thresholds": (0.1, 0.2, 0.3)}, 1, 1,
     "config.diagnostics.thresholds"),
    ("negative_threshold", {"diagnostics.thresholds": (-5.0, 0.15)}, 1, 1,
     "config.diagnostics.thresholds"),
    ("dead_threshold_below_zero", {"diagnostics.dead_threshold": -1.0}, 1, 1,
     "config.diagnostics.dead_threshold"),
    ("negative_diagnostics_rows", {"diagnostics.batch_size": -1}, 1, 1,
     "config.diagnostics.batch_size"),
    ("zero_diagnostics_rows", {"diagnostics.batch_size": 0}, 1, 1,
     "config.diagnostics.batch_size"),
    ("more_diagnostics_rows_than_a_batch",   # once cut to the batch and recorded as asked
     {"diagnostics.batch_size": 100, "diagnostics.every": 5}, 1, 1,
     "config.diagnostics.batch_size"),
    # A misspelt field in a config file adds a field nothing reads: the run would silently
    # train with the default of the field meant.
    ("misspelt_field_in_file", {"data.seqlen": 64}, 1, 1, "config.data.seqlen"),
    ("misspelt_top_level_field_in_file", {"warmup_step": 3}, 1, 1, "config.warmup_step"),
    ("misspelt_mesh_axis_in_file", {"mesh.tensr": 2}, 1, 1, "config.mesh.tensr"),
    # Once a traceback (PRNGKey's int64 overflow) after config.json was written.
    ("seed_past_int64", {"seed": 2**63}, 1, 1, "config.seed"),
    # PRNGKey kept the low 32 bits (x64 off): 2**32 + 7 trained the model of seed 7.
    ("seed_past_uint32", {"seed": 2**32 + 7}, 1, 1, "config.seed"),
    ("negative_seed", {"seed": -1}, 1, 1, "config.seed"),
]


@pytest.mark.parametrize("field, value", [("data.seed", -1), ("data.seed", 2**32),
                                          ("data.val_batches", -1), ("data.worker_count", -1)])
def test_data_fields_the_pipeline_checks_are_refused_by_the_dry_run(field, value):
  """Checked only when the iterators were built, after every uncached shard was tokenized:
  the dry run and the sweep's check of every run passed them."""
  with pytest.raises(ConfigError, match=rf"^config.{field}={value}; allowed: "):
    config_check.validate_without_devices(helpers.tiny_config(**{field: value}))


def test_a_parquet_path_is_checked_as_the_loader_reads_it(tmp_path, monkeypatch):
  """'~' and a recursive '**' glob, which the loader expands (sources.parquet_files), were
  refused as "does not exist" after the shards had been tokenized by data.prepare."""
  shards = tmp_path / "fw" / "sample" / "10BT"
  shards.mkdir(parents=True)
  for name in ("a.parquet", "b.parquet"):
    (shards / name).write_bytes(b"")
  monkeypatch.setenv("HOME", str(tmp_path))
  for path in (str(tmp_path / "fw" / "**" / "*.parquet"), "~/fw/sample/10BT"):
    config_check.validate(helpers.tiny_config(**{"data.source": "parquet", "data.path": path}),
                          1, 1)
  with pytest.raises(ConfigError, match=r"^config.data.path='.*nothing.*' matches no parquet"):
    config_check.validate(helpers.tiny_config(**{"data.source": "parquet",
                                                 "data.path": str(tmp_path / "nothing")}), 1, 1)


def test_an_odd_head_dim_of_the_width_names_the_width():
  """shape=16x1200 in the 400M suite (head_dim 75 from d / 16) said head_dim=75 was wrong and
  offered None, the value set; the width is at fault."""
  from configs import suite_400m
  with pytest.raises(ConfigError) as err:
    config_check.validate_without_devices(suite_400m.get_config("arch=preln,shape=16x1200"))
  assert str(err.value).startswith(
      "config.model.head_dim=75 (None: d_model=1200 / n_heads=16) is odd; allowed: d_model a "
      "multiple of 2 x n_heads = 32 (e.g. 1184 or 1216;")


def test_at_least_twenty_cases():
  assert len(CASES) >= 20 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("overrides, devices, processes, field", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_config_is_one_line_naming_field_and_allowed(overrides, devices, processes, field):
  """Each message starts with its field: ``field in message`` let a batch of 0 pass through
  the diagnostics' row check ('config.diagnostics.batch_size=2; allowed: 1..0')."""
  config = helpers.tiny_config(**overrides)
  with pytest.raises(ConfigError) as err:
    config_check.validate(config, devices, processes)
  message = str(err.value)
  assert "\n" not in message and message.startswith(field) and "allowed" in message, message


def test_diagnostics_rows_are_checked_only_when_training_diagnoses():
  """A one-row batch with diagnostics off (the default) was refused for the diagnostics' default
  of 2 rows; with diagnostics on, it still is."""
  config_check.validate(helpers.tiny_config(**{"data.global_batch_size": 1}), 1, 1)
  with pytest.raises(ConfigError, match=r"^config.diagnostics.batch_size=2; allowed: 1..1 "):
    config_check.validate(helpers.tiny_config(**{"data.global_batch_size": 1,
                                                 "diagnostics.every": 5}), 1, 1)


@pytest.mark.parametrize("warmup, steps, ok", [(19, 20, True), (20, 20, False), (30, 20, False),
                                               (0.5, 20, True), (12, -1, True), (0, 2, True)])
def test_a_warmup_not_below_the_runs_steps_is_refused_before_anything_is_written(
    tmp_path, warmup, steps, ok):
  """A suite's warmup of 12 under ``--config.steps=10`` finished 'ok' at 0.75 lr: the LR never
  reached config.lr nor decayed. Checked once steps=-1 is resolved (the tiny model's budget:
  hundreds of steps)."""
  from depthbench_jax.train import loop
  config = helpers.tiny_config(warmup_steps=warmup, steps=steps)
  if ok:
    config_check.check_warmup(config, loop.total_steps_of(
        config, loop.count_params(config_check.validate(config, 1, 1))["total"]))
    return
  with pytest.raises(ConfigError, match=rf"^config.warmup_steps={warmup} is {warmup} of the "
                                        rf"run's 20 steps \(config.steps=20\).*; allowed: "):
    loop.train_and_evaluate(config, str(tmp_path / "run"))
  assert not os.path.exists(tmp_path / "run")


def test_a_one_step_run_whose_warmup_takes_its_only_step_is_refused():
  """lr_schedule's warmup is at least one step, the first at LR 0: warmup 0 under steps=1
  passed (0 < 1) and the run trained nothing, finishing 'ok'."""
  config = helpers.tiny_config(warmup_steps=0, steps=1)
  with pytest.raises(ConfigError, match=r"^config.warmup_steps=0 is 1 of the run's 1 steps"):
    config_check.check_warmup(config, 1)


@pytest.mark.parametrize("warmup, ok", [(1.5, False), (0.02, True), (2000.0, True)])
def test_a_float_warmup_is_a_fraction_below_one_or_whole_steps(warmup, ok):
  """In a suite typing warmup_steps float (suite_400m), 1.5 was silently read as 1 step;
  ``--config.warmup_steps=2000`` arrives there as 2000.0 and is 2000 steps (a config check:
  below the run's steps is ``check_warmup``'s, once they are known)."""
  config = helpers.tiny_config(steps=4000)   # below the steps: check_warmup's, in validate too
  del config["warmup_steps"]
  config.warmup_steps = warmup
  if ok:
    config_check.validate(config, 1, 1)
  else:
    with pytest.raises(ConfigError, match=r"config.warmup_steps=1.5; allowed: .*fraction"):
      config_check.validate(config, 1, 1)


def test_good_config_and_iso_shape_within_tolerance_pass():
  from depthbench_jax.shapes import param_counts
  config = helpers.tiny_config()
  config_check.validate(config, 1, 1)
  total = param_counts(config.model)["total"]
  config_check.validate(helpers.tiny_config(iso_target_params=total * 1.015), 1, 1)
  with pytest.raises(ConfigError, match="config.iso_target_params"):
    config_check.validate(helpers.tiny_config(iso_target_params=total * 1.03), 1, 1)


@pytest.mark.parametrize("field", ["tensorboard", "skip_nonfinite_steps", "async_checkpointing"])
def test_a_switch_read_from_data_must_be_a_bool(field):
  """A config built from data (a run's config.json, a dict) has no ConfigDict field types: the
  string "false" would be truthy."""
  import ml_collections
  config = ml_collections.ConfigDict({**helpers.tiny_config().to_dict(), field: "false"})
  with pytest.raises(ConfigError, match=f"config.{field}='false'; allowed: True or False"):
    config_check.validate(config, 1, 1)


# End to end: (case, --config file[:arg], extra flags, field named in the error line).
CLI_CASES = [
    ("negative_steps_flag", "configs/base.py", ["--config.steps=-5"], "config.steps"),
    ("mesh_flag_not_device_count", "configs/base.py", ["--config.mesh.data=2"], "config.mesh"),
    ("non_iso_flag", "configs/base.py", ["--config.iso_target_params=1e9"],
     "config.iso_target_params"),
    ("unknown_field_flag", "configs/base.py", ["--config.model.n_head=4"], "n_head"),
    ("ill_typed_flag", "configs/base.py", ["--config.steps=ten"], "config.steps"),
    ("unknown_arch_in_config_arg", "configs/smoke.py:arch=resnet", [], "arch="),
    ("bad_shape_in_config_arg", "configs/smoke.py:shape=4x", [], "shape="),
    ("unknown_key_in_config_arg", "configs/smoke.py:depth=4", [], "depth=4"),
    ("missing_config_file", "configs/no_such_suite.py", [], "--config="),
    # Checked when the data is read, but still before config.json is written.
    ("seq_len_longer_than_the_data", "configs/base.py",
     ["--config.model.max_seq_len=4000000", "--config.data.seq_len=4000000"],
     "config.data.seq_len"),
]


def test_cli_bad_input_exits_nonzero_with_one_error_line_and_touches_nothing(tmp_path):
  """All cases at once (separate processes, run concurrently to keep the test short)."""
  procs = {}
  for case, config, flags, _ in CLI_CASES:
    workdir = str(tmp_path / case)
    os.makedirs(os.path.join(workdir, "checkpoints", "10"))
    with open(os.path.join(workdir, "summary.json"), "w") as f:
      json.dump({"status": "ok", "keep": True}, f)
    with open(os.path.join(workdir, "checkpoints", "10", "marker"), "w") as f:
      f.write("previous results")
    with open(os.path.join(workdir, "checkpoints", "10", "commit_success.txt"), "w") as f:
      f.write("a complete save, as orbax marks one")
    before = helpers.snapshot(workdir)
    cmd = helpers.main_command(workdir, helpers.tiny_flags() + flags, config=config)
    if config.startswith("configs/smoke.py"):
      cmd = helpers.main_command(workdir, flags, config=config)
    procs[case] = (subprocess.Popen(cmd, cwd=helpers.ROOT, env=helpers.subprocess_env(),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
                   workdir, before)
  for case, config, flags, field in CLI_CASES:
    proc, workdir, before = procs[case]
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 2, (case, proc.returncode, err[-2000:])
    lines = [l for l in err.splitlines() if l.startswith("error:")]
    assert len(lines) == 1, (case, err[-2000:])
    assert field in lines[0] and "allowed" in lines[0], (case, lines[0])
    assert "Traceback" not in err, (case, err[-2000:])
    assert helpers.snapshot(workdir) == before, case


def test_a_config_lacking_schema_fields_names_them():
  """Code reads every schema field without a default of its own, so a config not built on
  base.py is refused up front, naming what it lacks (here at the top level and in a group)."""
  config = helpers.tiny_config()
  with config.unlocked():
    del config["tensorboard"]
    del config.divergence["min_steps"]
  with pytest.raises(ConfigError, match=r"^config lacks config.tensorboard; allowed: .*base.py"):
    config_check.validate(config, 1, 1)
  config.tensorboard = True
  with pytest.raises(ConfigError, match=r"^config.divergence lacks config.divergence.min_steps;"):
    config_check.validate(config, 1, 1)
  config.divergence = None
  with pytest.raises(ConfigError, match=r"^config.divergence=None; allowed: a ConfigDict with "
                                        r"the fields max_skipped_steps, min_steps, spike_factor"):
    config_check.validate(config, 1, 1)


def test_an_older_runs_config_reads_todays_defaults_for_fields_added_since(tmp_path):
  """A config.json written before a field existed loads with base.py's default for it; its own
  values, the design's residual fields and a retired field stay as written."""
  from depthbench_jax.train import checkpoint
  saved = helpers.tiny_config(**{"lr": 1e-2, "divergence.spike_factor": 0.0}).to_dict()
  saved["model"]["residual"] = {"name": "hc", "n_streams": 2}
  for field in ("tensorboard", "evals", "grad_accum_steps"):
    del saved[field]
  del saved["model"]["attention_kernel"]
  del saved["divergence"]["min_steps"]
  saved["retired_field"] = 1
  (tmp_path / "config.json").write_text(json.dumps(saved))
  config = checkpoint.load_run_config(str(tmp_path))
  assert (config.tensorboard, config.evals.data_dir, config.grad_accum_steps) == (True, "", 1)
  assert (config.model.attention_kernel, config.divergence.min_steps) == ("xla", 20)
  assert (config.lr, config.divergence.spike_factor, config.retired_field) == (1e-2, 0.0, 1)
  assert config.model.residual.to_dict() == {"name": "hc", "n_streams": 2}


def test_resume_under_another_recipe_is_refused_naming_every_changed_field():
  saved = helpers.tiny_config().to_dict()
  saved["retired_field"] = 1   # a field of an older code version: not compared
  config_check.check_resume(saved, helpers.tiny_config(), "w")
  # Logging, evals, checkpoints, diagnostics, the guards, the mesh, microbatches and data
  # workers may change on a resume (the suites read in 4 workers: a host with fewer may resume).
  config_check.check_resume(saved, helpers.tiny_config(**{
      "log_every": 5, "eval_every": 3, "checkpoint_every": 7, "diagnostics.every": 4,
      "divergence.spike_factor": 0.0, "skip_nonfinite_steps": True, "mesh.fsdp": 2,
      "name": "renamed", "data.cache_dir": "/elsewhere", "data.worker_count": 4,
      "grad_accum_steps": 2}), "w")
  with pytest.raises(ConfigError) as err:
    config_check.check_resume(saved, helpers.tiny_config(
        **{"lr": 1e-2, "model.residual.name": "hc", "log_every": 5}), "w")
  message = str(err.value)
  assert "config.lr=0.01" in message and "config.model.residual.name='hc'" in message
  assert "0.003" in message and "'preln'" in message and "allowed" in message
  assert "log_every=" not in message
  for field, value in (("data.seq_len", 64), ("data.seed", 1), ("data.global_batch_size", 16),
                       ("data.tokenizer", "gpt2"), ("steps", 40), ("warmup_steps", 5)):
    with pytest.raises(ConfigError, match=f"config.{field}="):
      config_check.check_resume(saved, helpers.tiny_config(**{field: value}), "w")


def test_a_field_the_saved_config_lacks_is_compared_as_its_schema_default():
  """A run from before a field existed ran what its default says: resumed under a suite that
  sets it otherwise (budget_design='preln': Pre-LN's parameter budget, fewer steps for MoDA), it
  was not compared and the run's schedule changed mid-run. The same default is no change, and
  a missing guard field is no other divergence rule (it retrained such a diverged run)."""
  from depthbench_jax import recipe
  saved = helpers.tiny_config().to_dict()
  del saved["budget_design"]
  del saved["model"]["stream_dtype"]
  del saved["divergence"]["max_skipped_steps"]
  config_check.check_resume(saved, helpers.tiny_config(), "w")
  for field, value in (("budget_design", "preln"), ("model.stream_dtype", "float32")):
    with pytest.raises(ConfigError, match=f"config.{field}='{value}'"):
      config_check.check_resume(saved, helpers.tiny_config(**{field: value}), "w")
  full = helpers.tiny_config().to_dict()
  assert recipe.guard_changes(saved, full) == []
  full["divergence"]["max_skipped_steps"] += 1
  assert recipe.guard_changes(saved, full) == ["divergence.max_skipped_steps"]


def test_resume_compares_design_options_with_their_defaults():
  """config.json keeps the residual as written: an mHC run trained with sinkhorn_iters=5 and
  resumed without it (the default, 20) compared nothing and trained on other math; the same
  value written out or left to its default is no change. The remat policy may change (the same
  values for less memory)."""
  mhc = lambda **residual: helpers.tiny_config(**{"model.residual": {"name": "mhc", **residual}})
  saved = json.loads(json.dumps(mhc(sinkhorn_iters=5).to_dict()))
  with pytest.raises(ConfigError, match=r"config\.model\.residual\.sinkhorn_iters=20: .* with 5"):
    config_check.check_resume(saved, mhc(), "w")
  default = json.loads(json.dumps(mhc().to_dict()))
  config_check.check_resume(default, mhc(sinkhorn_iters=20), "w")
  config_check.check_resume(default, helpers.tiny_config(**{
      "model.residual": {"name": "mhc"}, "model.remat_policy": "dots_saveable"}), "w")
  # Nor may the kernels that run the same math (a run trained on XLA resumed on a GPU's cuDNN
  # attention and Pallas Sinkhorn was refused, though the sweep took them for finished runs).
  config_check.check_resume(default, helpers.tiny_config(**{
      "model.residual": {"name": "mhc", "sinkhorn_kernel": "pallas"},
      "model.attention_kernel": "fused"}), "w")


def test_every_designs_implementation_switch_is_resumable():
  """``Design.implementation_options`` are how, not what: each is one of
  ``recipe.IMPLEMENTATION_FIELDS``, which resume, sweep and report read."""
  from depthbench_jax import recipe
  from depthbench_jax.residual import registry
  options = {f"model.residual.{o}" for name in registry.names()
             for o in registry.get(name).implementation_options}
  assert options and options <= set(recipe.IMPLEMENTATION_FIELDS)
  assert all(recipe.is_resumable(f) for f in recipe.IMPLEMENTATION_FIELDS)


def test_resume_on_other_train_data_is_refused_naming_both():
  fingerprint = {"shards": 2, "train_tokens": 35363, "shard_keys_sha1": "b4a2bf8d2173"}
  config = helpers.tiny_config(**{"data.source": "parquet", "data.path": "/data/10BT"})
  config_check.check_resume_data(None, fingerprint, config, "w")  # an older checkpoint
  config_check.check_resume_data(dict(fingerprint), fingerprint, config, "w")
  with pytest.raises(ConfigError) as err:
    config_check.check_resume_data(
        fingerprint, {**fingerprint, "shards": 3, "train_tokens": 53153}, config, "w")
  message = str(err.value)
  assert message.startswith("config.data.path='/data/10BT' (config.data.source='parquet')")
  assert "now holds 3 shards, 53,153 train tokens" in message
  assert "trained on 2 shards, 35,363 train tokens" in message
  assert "allowed: the data the run started with" in message and "--workdir" in message


def test_mesh_resolves_one_wildcard_and_refuses_two():
  from depthbench_jax.train import sharding
  assert sharding.mesh_shape({"data": -1, "fsdp": 2, "tensor": 1}, 8) == (4, 2, 1)
  with pytest.raises(ConfigError, match="at most one -1"):
    sharding.mesh_shape({"data": -1, "fsdp": -1, "tensor": 1}, 8)
  # A suite's own mesh without an axis, or with a size that is not a number (KeyError and
  # ValueError tracebacks once).
  for mesh in ({"data": -1, "fsdp": 8}, {"data": -1, "fsdp": "eight", "tensor": 1}):
    with pytest.raises(ConfigError, match=r"config.mesh=.*; allowed: an integer size for each "
                                          r"of data, fsdp, tensor"):
      sharding.mesh_shape(mesh, 8)


def test_sequence_as_long_as_the_model_context_is_valid():
  config_check.validate(helpers.tiny_config(**{"data.seq_len": 64, "model.max_seq_len": 64}), 1, 1)
  with pytest.raises(ConfigError, match="config.data.seq_len"):
    config_check.validate(helpers.tiny_config(**{"data.seq_len": 65, "model.max_seq_len": 64}),
                          1, 1)


def test_cli_resume_with_a_changed_lr_exits_and_keeps_the_run(tmp_path):
  workdir = str(tmp_path / "run")
  os.makedirs(os.path.join(workdir, "checkpoints", "10"))
  with open(os.path.join(workdir, "checkpoints", "10", "marker"), "w") as f:
    f.write("trained at lr 3e-3")
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump(helpers.tiny_config().to_dict(), f)
  before = helpers.snapshot(workdir)
  proc = helpers.run_main(workdir, helpers.tiny_flags() + ["--config.lr=0.01"], check=False,
                          timeout=180)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert len(lines) == 1 and "config.lr=0.01" in lines[0], proc.stderr[-2000:]
  assert helpers.snapshot(workdir) == before


def test_one_slurm_task_per_node_drives_every_gpu_of_its_node(monkeypatch):
  """README's ``srun --nodes=4 --ntasks-per-node=1 --gpus-per-node=8``: JAX's SLURM detection,
  given ``local_device_ids=None``, shows each process GPU ``SLURM_LOCALID`` only, so the pod
  trained on 4 GPUs of 32. One task per node now passes ``[]``, which JAX keeps (no GPU
  restriction, checked against JAX's own detection); 8 tasks per node keep JAX's one GPU each.
  Under SLURM the CPU collectives are gloo too, as for the explicit variables."""
  import jax
  from jax._src import clusters
  from depthbench_jax import main
  calls, updates = [], []
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
  monkeypatch.setattr(jax.config, "update", lambda *a: updates.append(a))
  for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
               "SLURM_NNODES", *SLURM_STEP_VARIABLES):
    monkeypatch.delenv(name, raising=False)
  slurm_step(monkeypatch, ntasks=4, procid=2)   # SLURM_LOCALID=0
  monkeypatch.setenv("SLURM_STEP_NUM_NODES", "4")
  main.initialize_distributed(None, None, None)
  assert calls[-1]["local_device_ids"] == []
  assert ("jax_cpu_collectives_implementation", "gloo") in updates
  detect = clusters.ClusterEnv.auto_detect_unset_distributed_params
  assert detect(None, None, None, [], None, 300) == ("node0:" + str(9 % 2**12 + 61440), 4, 2, [])
  assert detect(None, None, None, None, None, 300)[3] == [0]   # what None gave: GPU 0 alone
  monkeypatch.setenv("SLURM_NTASKS", "32")                     # --ntasks-per-node=8
  monkeypatch.setenv("SLURM_LOCALID", "5")
  main.initialize_distributed(None, None, None)
  assert calls[-1]["local_device_ids"] is None
  assert detect(None, None, None, None, None, 300)[3] == [5]
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "node0:12345")  # the explicit variables in srun
  monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
  monkeypatch.setenv("JAX_PROCESS_ID", "2")
  monkeypatch.setenv("SLURM_NTASKS", "4")
  main.initialize_distributed(None, None, None)
  assert calls[-1]["local_device_ids"] == [] and calls[-1]["num_processes"] == 4


def test_one_mpirun_rank_per_node_drives_every_gpu_of_its_node(monkeypatch):
  """``mpirun -npernode 1`` with the three JAX variables (main.py's advice for other launchers):
  JAX's Open MPI detection still ran (``local_device_ids`` was None) and showed each rank GPU
  ``OMPI_COMM_WORLD_LOCAL_RANK`` alone, 1 of 8 per host, with nothing refusing it. One rank per
  node now passes ``[]``; eight keep JAX's one GPU each; ``JAX_LOCAL_DEVICE_IDS`` (JAX's own
  override) is left to JAX, under SLURM too."""
  import jax
  from jax._src import clusters
  from depthbench_jax import main
  calls = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
  monkeypatch.setattr(jax.config, "update", lambda *a: None)
  for name in ("SLURM_NNODES", "JAX_LOCAL_DEVICE_IDS", *SLURM_STEP_VARIABLES):
    monkeypatch.delenv(name, raising=False)
  for name, value in (("OMPI_MCA_orte_hnp_uri", "4096.0;tcp://10.0.0.1:1"),
                      ("OMPI_COMM_WORLD_SIZE", "2"), ("OMPI_COMM_WORLD_RANK", "1"),
                      ("OMPI_COMM_WORLD_LOCAL_RANK", "0"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "1"),
                      ("JAX_COORDINATOR_ADDRESS", "node0:12345"), ("JAX_NUM_PROCESSES", "2"),
                      ("JAX_PROCESS_ID", "1")):
    monkeypatch.setenv(name, value)
  main.initialize_distributed(None, None, None)
  assert calls[-1]["local_device_ids"] == [] and calls[-1]["process_id"] == 1
  detect = clusters.ClusterEnv.auto_detect_unset_distributed_params
  assert detect("node0:12345", 2, 1, [], None, 300)[3] == []
  assert detect("node0:12345", 2, 1, None, None, 300)[3] == [0]   # what None gave: GPU 0 alone
  monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "8")           # one rank per GPU
  main.initialize_distributed(None, None, None)
  assert calls[-1]["local_device_ids"] is None
  monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1")
  monkeypatch.setenv("JAX_LOCAL_DEVICE_IDS", "0,1,2,3")
  main.initialize_distributed(None, None, None)
  assert calls[-1]["local_device_ids"] is None
  slurm_step(monkeypatch, ntasks=2, procid=1)
  monkeypatch.setenv("SLURM_STEP_NUM_NODES", "2")
  main.initialize_distributed(None, None, None)
  assert calls[-1]["local_device_ids"] is None


def test_distributed_start_only_for_several_processes_and_an_explicit_process_id_wins(
    monkeypatch):
  """jax.distributed starts for a coordinator with more than one process, or a SLURM job of more
  than one task; --process_id=0 is kept over JAX_PROCESS_ID; the timeouts default to 300 s to
  join and 100 s without a heartbeat, each read from its environment variable."""
  import jax
  from depthbench_jax import main
  calls = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
  monkeypatch.setattr(jax.config, "update", lambda *a: None)
  for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_INIT_TIMEOUT_S",
               "JAX_HEARTBEAT_TIMEOUT_S", "SLURM_STEP_NUM_NODES", "SLURM_NNODES",
               *SLURM_STEP_VARIABLES):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv("JAX_PROCESS_ID", "1")
  main.initialize_distributed("host:1234", 1, 0)
  assert calls == []
  main.initialize_distributed("host:1234", 2, 0)
  assert calls == [{"coordinator_address": "host:1234", "num_processes": 2, "process_id": 0,
                    "local_device_ids": None, "initialization_timeout": 300,
                    "heartbeat_timeout_seconds": 100}]
  monkeypatch.setenv("JAX_HEARTBEAT_TIMEOUT_S", "7")
  assert main.distributed_timeouts()["heartbeat_timeout_seconds"] == 7
  monkeypatch.delenv("JAX_PROCESS_ID")  # Alone, it is refused (the next test).
  slurm_step(monkeypatch, ntasks=1)
  main.initialize_distributed(None, None, None)
  assert len(calls) == 1
  monkeypatch.setenv("SLURM_NTASKS", "2")
  main.initialize_distributed(None, None, None)
  assert len(calls) == 2
  # Under SLURM the flags given still reach jax (they were dropped); SLURM fills in the rest.
  main.initialize_distributed("node7:23456", None, 1)
  assert calls[-1] == {"coordinator_address": "node7:23456", "num_processes": None,
                       "process_id": 1, "local_device_ids": None,
                       "initialization_timeout": 300, "heartbeat_timeout_seconds": 7}
  for value in ("5m", "0"):  # once a bare ValueError traceback, or 0 s
    monkeypatch.setenv("JAX_INIT_TIMEOUT_S", value)
    with pytest.raises(ConfigError, match=r"^JAX_INIT_TIMEOUT_S=.*; allowed: a whole number "
                                          r"of seconds >= 1$"):
      main.initialize_distributed(None, None, None)


def test_an_salloc_shell_is_one_process_not_a_cluster(monkeypatch):
  """``salloc -n8`` exports SLURM_JOB_ID and SLURM_NTASKS=8 but no job step (srun sets
  SLURM_STEP_NODELIST, SLURM_PROCID, SLURM_LOCALID): JAX cannot detect a cluster there, and
  every run of a sweep started in it died on "coordinator_address should be defined". It is one
  process now; inside an srun step of 8 tasks, a cluster of 8."""
  import jax
  from depthbench_jax import main
  calls = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
  for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
               *SLURM_STEP_VARIABLES):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv("SLURM_JOB_ID", "9")
  monkeypatch.setenv("SLURM_NTASKS", "8")
  assert (main.slurm_tasks(), main.hosts_expected()) == (1, 1)
  main.initialize_distributed(None, None, None)
  assert calls == []
  slurm_step(monkeypatch, ntasks=8, procid=3)
  assert (main.slurm_tasks(), main.hosts_expected()) == (8, 8)
  main.initialize_distributed(None, None, None)
  assert len(calls) == 1


def test_distributed_settings_refuse_what_cannot_start_or_would_train_alone(monkeypatch):
  """A non-integer or out-of-range id, an address without its port, or a host given an id but
  no process count (it trained alone, as process 0 of 1, into the run dirs the other hosts
  share): one ConfigError naming the variable; SLURM of several tasks fills in the rest."""
  from depthbench_jax import main
  for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
               *SLURM_STEP_VARIABLES):
    monkeypatch.delenv(name, raising=False)
  assert main.distributed_settings() == (None, None, None)
  refused = {("node0:1", "2", "abc"): "JAX_PROCESS_ID='abc'", ("node0:1", "x", "0"):
             "JAX_NUM_PROCESSES='x'", ("node0:1", "2", "2"): "JAX_PROCESS_ID=2",
             ("node0:1", "2", "-1"): "JAX_PROCESS_ID=-1", ("node0", "2", "0"): "'node0'",
             ("", "2", "1"): "JAX_COORDINATOR_ADDRESS is unset with", ("node0:1", "2", ""):
             "JAX_PROCESS_ID is unset", ("", "", "1"): "without JAX_NUM_PROCESSES",
             ("node0:1", "0", "0"): "JAX_NUM_PROCESSES=0"}
  for (coord, num, pid), named in refused.items():
    for name, value in zip(("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"),
                           (coord, num, pid)):
      monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match="allowed") as err:
      main.distributed_settings()
    assert named in str(err.value), (coord, num, pid, err.value)
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "node0:12345")
  monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
  monkeypatch.setenv("JAX_PROCESS_ID", "3")
  assert main.distributed_settings() == ("node0:12345", 4, 3)
  assert main.distributed_settings(None, None, 0) == ("node0:12345", 4, 0)
  # Flags are named as flags (the message named variables the user never set), and
  # --num_processes=0 is refused (it fell back to the variable).
  with pytest.raises(ConfigError, match=r"^--process_id=5 with --num_processes=2; allowed"):
    main.distributed_settings("h:1", 2, 5)
  with pytest.raises(ConfigError, match=r"^--num_processes=0; allowed: an integer >= 1"):
    main.distributed_settings(None, 0, None)
  monkeypatch.setenv("JAX_NUM_PROCESSES", "")
  slurm_step(monkeypatch, ntasks=4)
  assert main.distributed_settings() == ("node0:12345", None, 3)


def test_processes_of_one_run_refuse_other_configs_or_workdirs(monkeypatch, tmp_path):
  """Hosts given other suite files or --results_dirs (or one restarted mid-sweep while the
  others went on) joined one cluster: they trained two recipes as one run, or died at the first
  checkpoint (orbax: FileNotFoundError). Each process now compares its run with every other's
  (``main.gather_text``, here faked in one process; two real ones: test_train_loop) and refuses
  naming the field or the workdir."""
  import jax
  from depthbench_jax import main
  posted = {}

  def gather_text(text):  # What every process posted, in process order.
    posted[jax.process_index()] = text
    return [posted[p] for p in range(jax.process_count())]

  monkeypatch.setattr(main, "gather_text", gather_text)
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  workdir = str(tmp_path / "run")

  def post(process, config, where=workdir):
    monkeypatch.setattr(jax, "process_index", lambda: process)
    main.check_same_run(config, where)

  config = helpers.tiny_config()
  with pytest.raises(KeyError):  # Process 1 has not posted: waits (here: the fake's KeyError).
    post(0, config)
  post(1, config)
  post(0, config)  # Same run: nothing raised.
  with pytest.raises(ConfigError, match=r"process 1 of 2 runs config.warmup_steps=3 "
                                        r"\(process 0: 2\); allowed: .*every host"):
    post(1, helpers.tiny_config(warmup_steps=3))
  with pytest.raises(ConfigError, match=r"--workdir=.*other.*process 0 --workdir=.*run;"):
    post(1, config, str(tmp_path / "other"))
  # Per-host copies at other paths: the path is part of the run (config.json, resumes): said so.
  with pytest.raises(ConfigError, match=r"config.data.path='/nvme1/fineweb-edu' \(process 0: "
                                        r"''\); allowed: the same config.data.path on every host"):
    post(1, helpers.tiny_config(**{"data.path": "/nvme1/fineweb-edu"}))
  four = helpers.tiny_config(warmup_steps=3, seed=7, steps=30, log_every=3)
  with pytest.raises(ConfigError, match=r"runs config.log_every=3 .*config.seed=7 .*and 1 more "
                                        r"fields; allowed"):
    post(1, four)
  # One relative workdir (run_sweep.sh's default results/<suite>/<run>) on hosts that mount a
  # shared checkout at other paths: the same run (check_results_shared tests the folder).
  relative = os.path.join("results", "smoke", "run")
  posted.clear()
  for process, host in ((0, "host0"), (1, "host1"), (0, "host0")):
    os.makedirs(tmp_path / host, exist_ok=True)
    monkeypatch.chdir(tmp_path / host)
    if process == 0 and 1 not in posted:
      with pytest.raises(KeyError):  # waits for process 1 (the fake's KeyError)
        post(process, config, relative)
    else:
      post(process, config, relative)


def test_processes_that_do_not_share_the_results_dir_refuse_alike(monkeypatch, tmp_path):
  """A node-local --results_dir trained each run to its end with the summary on host 0 alone;
  the other hosts' sweeps took that for a preemption. Every process now looks for a file
  process 0 wrote there (by its name, in its own spelling of the folder) and all refuse, naming
  the process that did not see it; the file is gone afterwards. Faked in one process: process
  1's view of the folder is another tmp dir (two real processes sharing one: test_train_loop's
  two-process runs pass this check)."""
  import jax
  from depthbench_jax import main
  host0, host1 = tmp_path / "host0" / "results", tmp_path / "host1" / "results"
  host1.mkdir(parents=True)
  view = {}   # what each process posted; its peer's replies are replayed from the list given
  monkeypatch.setattr(jax, "process_count", lambda: 2)

  def as_process(process, workdir, replies):
    """The gathers in order: the marker's name (or '!' and why process 0 could not write it),
    whether each process saw it."""
    monkeypatch.setattr(jax, "process_index", lambda: process)
    posted = iter(replies)
    def gather_text(text):
      view.setdefault(process, []).append(text)
      return [next(posted) if process else text, text if process else next(posted)]
    monkeypatch.setattr(main, "gather_text", gather_text)
    main.check_results_shared(workdir)

  as_process(0, str(host0 / "run"), ["", "1"])              # process 1 saw it: nothing raised
  name = view[0][0]
  assert name.startswith(".hosts-see-this-")
  assert not os.path.exists(host0 / name)
  refused = (r"process 1 of 2 does not see the file process 0 wrote in .*{}/results .*; allowed: "
             r"a results dir on a filesystem every host sees")
  # A HostsDiffer (exit 4: every host's sweep stops), not a plain ConfigError (exit 2: each
  # host's sweep went on to the next run, into the same unshared folders).
  with pytest.raises(HostsDiffer, match=refused.format("host1")):
    as_process(1, str(host1 / "run"), [name, "1"])         # host 1's disk: no such file
  assert view[1] == ["", "0"]
  # Process 0, told its peer did not see the file, refuses alike (only process 1's side of the
  # refusal was shown: each process judging its own view alone passed).
  with pytest.raises(HostsDiffer, match=refused.format("host0")):
    as_process(0, str(host0 / "run"), ["", "0"])
  assert os.listdir(host0) == [] and os.listdir(host1) == []
  # The same folder mounted at another path on host 1 (a shared checkout, a relative workdir):
  # it looks for the name in its own spelling of the folder, and finds it.
  (host1 / name).write_text("")
  as_process(1, str(host1 / "run"), [name, "1"])
  # Process 0 cannot write there: every process refuses, with process 0's reason (it alone
  # went to its exit while the others waited in the next gather).
  with pytest.raises(ConfigError, match=r"^--workdir=.*: process 0 cannot write in .*; allowed: "
                                        r"a results dir every host can write$"):
    as_process(1, str(host1 / "run"), ["!--workdir=x: process 0 cannot write in /r (Read-only "
                                       "file system); allowed: a results dir every host can "
                                       "write"])
  monkeypatch.setattr(main.os, "makedirs", lambda *a, **k: (_ for _ in ()).throw(
      PermissionError(13, "Permission denied")))
  with pytest.raises(ConfigError, match=r"process 0 cannot write in .* \(Permission denied\)"):
    as_process(0, str(tmp_path / "ro" / "run"), ["!"])
  assert view[0][-1].startswith("!--workdir=")   # what process 0 posted: its refusal


def test_flag_error_keeps_the_config_errors_own_last_line():
  """config_flags wraps a get_config ConfigError (a chained one names it twice): the message is
  the innermost error's text, the last one."""
  from depthbench_jax import main
  text = ("Traceback ...\nConfigError: outer wrapper\nduring handling...\n"
          "ConfigError: config argument arch='x'; allowed: preln, hc")
  assert main.flag_error_message(ValueError(text), ["prog", "--config=configs/smoke.py:arch=x"]) == (
      "config argument arch='x'; allowed: preln, hc")


def test_an_override_before_its_config_file_names_the_order(monkeypatch):
  """``--config.tensorboard=False --config=...``: config_flags refuses the order, and the line
  read 'allowed: a value of type bool' of a valid bool."""
  from absl import flags
  from ml_collections import config_flags
  from depthbench_jax import main
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, flag_values=flag_values)
  argv = ["prog", "--config.tensorboard=False", "--config=configs/smoke.py:arch=hc"]
  monkeypatch.setattr(sys, "argv", argv)
  with pytest.raises(Exception) as err:
    flag_values(argv)
  assert main.flag_error_message(err.value, argv) == (
      "flag --config.tensorboard=False: given before --config=configs/smoke.py:arch=hc; allowed: "
      "--config=FILE first, then its --config.FIELD overrides")


def test_a_field_given_twice_names_the_bad_value(monkeypatch):
  """``--config.steps=200 --config.steps=abc`` (an override added after README's example): the
  line named the valid first value, ``--config.steps=200``, as the bad flag."""
  from absl import flags
  from ml_collections import config_flags
  from depthbench_jax import main
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, flag_values=flag_values)
  argv = ["prog", "--config=configs/smoke.py:arch=hc", "--config.steps=200",
          "--config.steps=abc"]
  monkeypatch.setattr(sys, "argv", argv)
  with pytest.raises(Exception) as err:
    flag_values(argv)
    flag_values["config"].value.get("name")
  assert main.flag_error_message(err.value, argv).startswith(
      "flag --config.steps=abc: invalid literal for int() with base 10: 'abc'; allowed: ")


def test_restore_run_names_what_the_run_dir_lacks_before_orbax_opens_it(tmp_path):
  """Not a run, a run without a complete checkpoint, and a --step it never saved: each one
  ConfigError naming the flag and what is there (once a FileNotFoundError or orbax's own)."""
  from depthbench_jax.train import checkpoint
  workdir = str(tmp_path)
  with pytest.raises(ConfigError, match=r"--workdir=.*: no config\.json; allowed: a run dir"):
    checkpoint.restore_run(workdir)
  (tmp_path / "config.json").write_text("{}")
  (tmp_path / "checkpoints" / "20.orbax-checkpoint-tmp-1").mkdir(parents=True)
  with pytest.raises(ConfigError, match="no complete checkpoint under .*; allowed: a run that"):
    checkpoint.restore_run(workdir)
  for step in ("10", "20"):
    (tmp_path / "checkpoints" / step).mkdir(exist_ok=True)
  with pytest.raises(ConfigError, match=r"--step=15; allowed: 10, 20 \(the checkpoints of "):
    checkpoint.restore_run(workdir, 15)
  # 20 holds nothing, not even orbax's commit marker (a copy cut short): named, with step 10.
  with pytest.raises(ConfigError, match=r"checkpoints/20 has no commit_success.txt.*step 10"):
    checkpoint.restore_run(workdir)


@pytest.mark.parametrize("module", ["diagnose", "evaluate"])
def test_post_hoc_cli_on_a_directory_that_is_not_a_run_is_one_error_line(tmp_path, module):
  """``diagnose``/``evaluate --workdir`` of a mistyped path: one ``error:`` line, exit 2 (once a
  FileNotFoundError traceback), and nothing written there."""
  proc = subprocess.run(
      [sys.executable, "-m", f"depthbench_jax.{module}", f"--workdir={tmp_path}"],
      cwd=helpers.ROOT, env=helpers.subprocess_env(), capture_output=True, text=True,
      timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines() == [
      f"error: --workdir={tmp_path}: no config.json; allowed: a run directory written by "
      "python -m depthbench_jax.main"]
  assert not os.listdir(tmp_path)


def test_cli_value_of_the_wrong_type_in_the_config_file_names_the_line_and_type(tmp_path):
  """config_flags reports an error inside get_config as 'Error whilst parsing config file:'
  and a traceback; the error line names the file's line, the field and its type instead."""
  config = tmp_path / "ill_typed.py"
  config.write_text("from configs import base\n\ndef get_config():\n  c = base.get_config()\n"
                    "  c.lr = '3e-3'\n  return c\n")
  workdir = str(tmp_path / "run")
  proc = subprocess.run(helpers.main_command(workdir, [], config=str(config)), cwd=helpers.ROOT,
                        env=helpers.subprocess_env(), capture_output=True, text=True,
                        timeout=180)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
  assert len(lines) == 1, proc.stderr[-2000:]
  assert f"{config}:5" in lines[0] and "c.lr = '3e-3'" in lines[0], lines[0]
  assert "allowed: a value of type float" in lines[0], lines[0]
  assert not os.path.exists(workdir)


@pytest.mark.parametrize("value, verbose", [("", False), ("0", False), ("1", True),
                                            ("yes", True)])
def test_depthbench_verbose_0_keeps_info_logs_off(monkeypatch, value, verbose):
  """README: INFO logs are off unless DEPTHBENCH_VERBOSE=1; any set value, "0" too, turned them
  on."""
  from absl import logging
  from depthbench_jax import errors
  monkeypatch.setenv("DEPTHBENCH_VERBOSE", value)
  monkeypatch.setattr(logging, "set_verbosity", lambda level: calls.append(level))
  calls = []
  errors.quiet_logs()
  assert calls == ([] if verbose else [logging.WARNING])


def test_main_loads_a_suite_file_given_by_path_from_another_directory(tmp_path):
  """``main --config=/repo/configs/smoke.py:...`` run from elsewhere failed with "No module named
  'configs'" (suite files import ``configs.base``; the other tools put the repo on sys.path).
  Here the config loads and its first check answers: a bad field, named."""
  env = helpers.subprocess_env()
  env.pop("PYTHONPATH")   # The installed package only, as a user's shell has it.
  proc = subprocess.run(
      [sys.executable, "-m", "depthbench_jax.main",
       f"--config={os.path.join(helpers.ROOT, 'configs', 'smoke.py')}:arch=hc,shape=4x128",
       f"--workdir={tmp_path / 'run'}", "--config.model.n_heads=5"],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2 and "No module named" not in proc.stderr, proc.stderr[-2000:]
  assert "error: config.model.n_heads" in proc.stderr, proc.stderr[-2000:]
  assert not (tmp_path / "run").exists()


def test_an_override_that_contradicts_the_run_name_is_refused():
  """``smoke.py:arch=preln,shape=4x128`` with ``--config.model.n_layers=8`` (or another lr, or
  design) trained another model under the name preln_4x128_lr3e-3, which the sweep's plan and
  the report counted as that run. One error names the field and the argument key to use; a
  config renamed too, or one whose name is not a run name (base.py), is free to change."""
  from depthbench_jax import sweep
  module = sweep.load_config_module(os.path.join(helpers.ROOT, "configs", "smoke.py"))
  config_check.validate_name(sweep.config_of(module, "arch=preln,shape=4x128"))
  for field, value, key in (("model.n_layers", 8, "shape"), ("model.d_model", 64, "shape"),
                            ("lr", 1e-3, "lr"), ("model.residual.name", "hc", "arch")):
    config = sweep.config_of(module, "arch=preln,shape=4x128")
    node, leaf = config, field.split(".")
    for part in leaf[:-1]:
      node = node[part]
    node[leaf[-1]] = value
    said = {"shape": "4x128", "lr": "3e-3", "arch": "preln"}[key]
    with pytest.raises(ConfigError, match=rf"^config\.{field}={value!r}, but the run is named "
                                          rf"'preln_4x128_lr3e-3', which says {key}={said}; "
                                          rf"allowed: a run name that matches \({key}= in"):
      config_check.validate_name(config)
    config.name = "my_variant"
    config_check.validate_name(config)
  base = sweep.base_config()
  base.lr = 1.0
  config_check.validate_name(base)
  # A name of the user's own in the run-name form, its first part no design: not a run name.
  base.name = "baseline_2x32_lr3e-3"
  config_check.validate_name(base)


@pytest.mark.parametrize("lr", [math.nan, math.inf, 0.0, -1e-3])
def test_a_bad_lr_on_a_suite_config_names_config_lr(lr):
  """``--config.lr=nan`` beside ``smoke.py:arch=preln,shape=4x128``: the run-name check
  formatted it first (a ValueError traceback, 'not enough values to unpack'), and 0 or a
  negative lr read as a name mismatch; the recipe check now comes first. An lr of 1e999 in a
  name is no run name."""
  from depthbench_jax import sweep
  module = sweep.load_config_module(os.path.join(helpers.ROOT, "configs", "smoke.py"))
  config = sweep.config_of(module, "arch=preln,shape=4x128")
  config.lr = lr
  with pytest.raises(ConfigError, match=rf"^config\.lr={lr!r}; allowed: a positive number"):
    config_check.validate_without_devices(config)
  assert sweep.parse_run_name("preln_4x128_lr1e999") is None


def test_a_workdir_that_is_a_file_is_one_error_line(tmp_path):
  """Once a NotADirectoryError traceback from the checkpoint manager."""
  path = tmp_path / "afile"
  path.write_text("keep me")
  proc = helpers.run_main(str(path), helpers.tiny_flags(), check=False, timeout=120)
  assert proc.returncode == 2
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert lines[-1] == f"error: --workdir={path}: {path} is a file; allowed: a folder there (made " \
                      "if missing)", proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr and path.read_text() == "keep me"
  # A file where the run's checkpoints/ go: it trained to its first save (hours at a suite's
  # checkpoint_every), then two orbax tracebacks.
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "checkpoints").write_text("keep me")
  proc = helpers.run_main(str(workdir), helpers.tiny_flags(), check=False, timeout=120)
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert [l for l in proc.stderr.splitlines() if l.strip()][-1] == (
      f"error: --workdir={workdir}: {workdir / 'checkpoints'} is a file; allowed: a folder "
      f"there (made if missing)")
  assert os.listdir(workdir) == ["checkpoints"]


def test_a_workdir_that_is_a_sweeps_results_folder_is_one_error_line(tmp_path):
  """A run trained into a sweep's results folder wrote config.json, checkpoints/ and
  summary.json beside the sweep's runs, and the report then skipped it without a word. A
  folder of its own, even one holding a report.md alone, is a run's; so is a run's own folder
  (it has config.json) whatever else it holds."""
  from depthbench_jax.train.summary import check_run_folder
  results = tmp_path / "smoke"
  for run in ("preln_4x128_lr3e-3", "hc_4x128_lr3e-3"):
    (results / run).mkdir(parents=True)
    (results / run / "summary.json").write_text("{}")
  before = helpers.snapshot(str(results))
  proc = helpers.run_main(str(results), helpers.tiny_flags(), check=False, timeout=120)
  assert proc.returncode == 2
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert lines[-1] == (f"error: --workdir={results} is a results folder: it holds 2 run folders "
                       f"(hc_4x128_lr3e-3, preln_4x128_lr3e-3) and no run of its own; allowed: "
                       f"a run's own folder, e.g. {results}/<run name>"), proc.stderr[-2000:]
  assert helpers.snapshot(str(results)) == before
  only_report = tmp_path / "reported"
  only_report.mkdir()
  (only_report / "report.md").write_text("# old")
  with pytest.raises(ConfigError, match=r"holds a report.md and no run of its own"):
    check_run_folder(str(only_report))
  (results / "config.json").write_text("{}")   # a run's own folder
  check_run_folder(str(results))
  check_run_folder(str(tmp_path / "new"))     # not there yet
  check_run_folder(str(results / "preln_4x128_lr3e-3"))


def test_a_gpu_host_training_on_the_cpu_unasked_is_warned(monkeypatch, tmp_path, capsys):
  """A CUDA plugin jaxlib skips (a version mismatch) is one Python warning, and the run trains
  on the host's CPU: main says so in one line, unless JAX_PLATFORMS chose the CPU."""
  from depthbench_jax.main import warn_if_gpus_idle
  (tmp_path / "nvidia0").touch()
  nodes = str(tmp_path / "nvidia[0-9]*")
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  warn_if_gpus_idle("cpu", nodes)
  assert "has NVIDIA GPUs but JAX runs on the CPU" in capsys.readouterr().err
  for backend, env, gpu_nodes in (("gpu", None, nodes), ("cpu", "cpu", nodes),
                                  ("cpu", None, str(tmp_path / "none[0-9]*"))):
    if env:
      monkeypatch.setenv("JAX_PLATFORMS", env)
    warn_if_gpus_idle(backend, gpu_nodes)
    assert capsys.readouterr().err == ""


def test_hosts_with_different_device_counts_are_refused():
  """The mesh is jax.devices() reshaped: 2 devices on one host and 6 on another put a batch
  shard across both (a shape error at step 1); the shard check counted devices, not hosts."""
  from depthbench_jax.errors import HostsDiffer
  from depthbench_jax.main import check_even_hosts
  check_even_hosts({0: 4, 1: 4})
  with pytest.raises(HostsDiffer, match=r"\(process 0: 2, process 1: 6\); allowed: the same"):
    check_even_hosts({0: 2, 1: 6})


# The fields a resume may change, as reviewed: adding one (a seed, an optimizer setting) lets a
# resumed run silently mix two recipes in one workdir, so the list is spelled out here too.
REVIEWED_RESUMABLE = {
    "name", "log_every", "tensorboard", "eval_every", "eval_batches", "checkpoint_every",
    "keep_checkpoints", "async_checkpointing", "peak_flops_per_device", "diagnostics.",
    "divergence.", "skip_nonfinite_steps", "debug.", "mesh.", "evals.", "data.cache_dir",
    "data.worker_count", "iso_target_params", "iso_count", "iso_tolerance", "grad_accum_steps",
    "model.remat_policy", "model.attention_kernel", "model.residual.sinkhorn_kernel"}


def test_every_config_field_is_refused_on_resume_unless_listed_resumable():
  """Each of the config's fields changed alone against the trained config.json: refused exactly
  when it is not in RESUMABLE_FIELDS. Only some fields were exercised (lr, steps, data.path):
  adding seed or grad_clip to the resumable list, or dropping tensorboard from it, passed."""
  import ml_collections
  from depthbench_jax import recipe
  from depthbench_jax.train import config_check
  assert set(recipe.RESUMABLE_FIELDS) == REVIEWED_RESUMABLE
  saved = config_check.as_json(helpers.tiny_config())
  bump = lambda v: (not v if isinstance(v, bool) else v + 1 if isinstance(v, int) else
                    v * 2 + 0.5 if isinstance(v, float) else v + "_x" if isinstance(v, str) else
                    [*v, 0.5] if isinstance(v, list) else 7)
  fields = recipe.flatten_fields(saved)
  assert {"seed", "grad_clip", "b2", "tensorboard", "model.dtype", "mesh.fsdp"} <= set(fields)
  for field, value in fields.items():
    if field == "model.residual.name":   # another design: every option differs too
      continue
    changed = json.loads(json.dumps(saved))
    *path, leaf = field.split(".")
    node = changed
    for key in path:
      node = node[key]
    node[leaf] = bump(value)
    refused = [f for f, _, _ in config_check.recipe_changes(
        saved, ml_collections.ConfigDict(changed))]
    assert refused == ([] if recipe.is_resumable(field) else [field]), field


def test_a_refusal_on_several_hosts_names_them_all(monkeypatch):
  """Processes 1 and 3 of 4 refused: the line said "process 1 of 4 only" (the agreed refusal is
  a HostsDiffer naming who refused; all refusing is a plain ConfigError)."""
  from depthbench_jax import hosts
  for said, want in ((["", "no shards", "", "no shards"], HostsDiffer),
                     (["no shards"] * 4, ConfigError)):
    monkeypatch.setattr(hosts, "gather_text", lambda text, said=said: said)
    with pytest.raises(want) as err:
      with hosts.refusals_agreed(4):
        raise ConfigError("no shards")
    assert type(err.value) is want
  assert str(err.value) == "no shards"
  monkeypatch.setattr(hosts, "gather_text", lambda text: ["", "no shards", "", "no shards"])
  with pytest.raises(HostsDiffer, match=r"^processes 1, 3 of 4 only: no shards \(the other "):
    with hosts.refusals_agreed(4):
      pass
