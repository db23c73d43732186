"""Checks the whole config before anything is compiled: one ``ConfigError`` naming the field.

``validate`` covers the recipe, the data and the mesh here, and the model through
``model_config_from``; a bad run fails in milliseconds and touches nothing on disk.
"""

from __future__ import annotations

import json
import math

import ml_collections

from depthbench_jax.errors import ConfigError, HostsDiffer
from depthbench_jax.model.config import ModelConfig, model_config_from
from depthbench_jax.recipe import RESUMABLE_FIELDS, flatten_fields, is_resumable
from depthbench_jax.train import sharding


def _require(ok: bool, message: str) -> None:
  if not ok:
    raise ConfigError(message)


def _number(config, field: str, *, low=None, high=None, low_open=False, allowed: str):
  value = config.get(field)
  ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
  if ok and low is not None:
    ok = value > low if low_open else value >= low
  if ok and high is not None:
    ok = value < high
  _require(ok, f"config.{field}={value!r}; allowed: {allowed}")
  return value


def _switch(config, field: str) -> None:
  """A True/False field. A config built from data (a dict, a run's JSON) has no ConfigDict
  field types, and there the string "false" would be truthy."""
  value = config[field]
  _require(isinstance(value, bool), f"config.{field}={value!r}; allowed: True or False")


RESIDUAL = "model.residual"  # Its fields are the design's, not the schema's.


def _schema() -> ml_collections.ConfigDict:
  from depthbench_jax import sweep  # pylint: disable=g-import-not-at-top
  return sweep.base_config()


def validate_fields(config) -> None:
  """The config has exactly the schema's fields (``configs/base.py``, the single source of
  defaults), so the code reads every field without a default of its own. A misspelt field in a
  config file (``c.data.seqlen = 64``) adds a field nothing reads, and the run would silently
  train with the default of the field meant; a missing one (a config not built on
  ``base.get_config()``) is named too. A design's own ``config.model.residual`` fields are
  checked by the design."""
  _schema_fields(config, _schema(), "config")


def _schema_fields(node, schema, where: str) -> None:
  for key in node.keys():
    _require(key in schema,
             f"{where}.{key}: not a field of the config schema (configs/base.py); allowed: "
             f"{', '.join(sorted(schema.keys()))}")
  missing = [key for key in schema.keys() if key not in node]
  _require(not missing,
           f"{where} lacks {', '.join(f'{where}.{k}' for k in missing)}; allowed: a config "
           f"built on configs/base.py get_config(), which has every field")
  for key in node.keys():
    inner = f"{where}.{key}"
    if isinstance(schema[key], ml_collections.ConfigDict):
      _require(isinstance(node[key], ml_collections.ConfigDict),
               f"{inner}={node[key]!r}; allowed: a ConfigDict with the fields "
               f"{', '.join(schema[key].keys())}")
      if inner != f"config.{RESIDUAL}":
        _schema_fields(node[key], schema[key], inner)


def with_schema_defaults(saved: dict) -> ml_collections.ConfigDict:
  """A run's saved config (``config.json``) with every field of today's schema: a field added
  to ``configs/base.py`` after the run was written reads as its default there, which by the
  schema's rule is what the code did before the field existed (``tensorboard=True``,
  ``grad_accum_steps=1``, ``evals.data_dir=''``). Fields the run has keep its values, and
  ``model.residual`` is kept as saved (the design's own fields)."""
  def fill(node: dict, schema: dict, where: str) -> dict:
    out = dict(node)
    for key, default in schema.items():
      if key not in out:
        out[key] = default
      elif (isinstance(default, dict) and isinstance(out[key], dict)
            and f"{where}{key}" != RESIDUAL):
        out[key] = fill(out[key], default, f"{where}{key}.")
    return out
  return ml_collections.ConfigDict(fill(saved, _schema().to_dict(), ""))


def validate_recipe(config) -> None:
  steps = config.get("steps")
  _require(isinstance(steps, int) and (steps > 0 or steps == -1),
           f"config.steps={steps!r}; allowed: a positive integer, or -1 for the "
           f"tokens_per_param budget")
  _number(config, "lr", low=0, low_open=True, allowed="a positive number")
  # PRNGKey keeps a seed's low 32 bits without jax_enable_x64 (2**32 + 7 trained as 7), and
  # 2**63 and up raised OverflowError at init, after config.json.
  seed = config.get("seed")
  _require(isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2**32,
           f"config.seed={seed!r}; allowed: an integer in [0, 2**32)")
  _number(config, "tokens_per_param", low=0, low_open=True, allowed="a positive number")
  budget = config.get("budget_design") or ""
  from depthbench_jax.residual import registry  # pylint: disable=g-import-not-at-top
  _require(budget in ("",) + registry.names(),
           f"config.budget_design={budget!r}; allowed: '' (the run's own parameters) or a "
           f"design whose parameters at the run's shape set the budget: "
           f"{', '.join(registry.names())}")
  warmup_allowed = "an int >= 0, or a fraction in (0, 1)"
  warmup = _number(config, "warmup_steps", low=0, allowed=warmup_allowed)
  _require(float(warmup).is_integer() or warmup < 1,  # 1.5 would be read as 1 step.
           f"config.warmup_steps={warmup!r}; allowed: {warmup_allowed}")
  _number(config, "min_lr_ratio", low=0, high=1.0000001, allowed="a number in [0, 1]")
  _number(config, "b1", low=0, high=1, allowed="a number in [0, 1)")
  _number(config, "b2", low=0, high=1, allowed="a number in [0, 1)")
  _number(config, "weight_decay", low=0, allowed="a number >= 0")
  _number(config, "grad_clip", low=0, allowed="a number >= 0 (0 = no clipping)")
  _number(config, "peak_flops_per_device", low=0,
          allowed="FLOP/s per device > 0 for MFU, or 0 (by device kind)")
  for field in ("log_every", "checkpoint_every", "keep_checkpoints", "grad_accum_steps"):
    value = config.get(field)
    _require(isinstance(value, int) and value > 0,
             f"config.{field}={value!r}; allowed: a positive integer")
  value = config.get("eval_every")
  _require(isinstance(value, int) and value >= 0,
           f"config.eval_every={value!r}; allowed: an integer >= 0 (0 = the final eval only)")
  value = config.get("eval_batches")
  _require(isinstance(value, int) and value >= 0,
           f"config.eval_batches={value!r}; allowed: an integer >= 0 (validation batches per "
           f"periodic eval; 0 = all config.data.val_batches)")
  _switch(config, "tensorboard")
  _switch(config, "async_checkpointing")
  if steps > 0:   # Known here (-1 is resolved by the trainer): refused before main.py writes.
    check_warmup(config, steps)


def validate_guards(config) -> None:
  """``config.divergence``, ``skip_nonfinite_steps``, ``diagnostics`` and ``debug``."""
  # A spike factor in (0, 1] flagged every step that was no new best: every run 'diverged'.
  for field, allowed in (("spike_factor", "0 (no spike check) or a number > 1"),
                         ("min_steps", "an integer >= 0"),
                         ("max_skipped_steps", "an integer >= 0")):
    value = config.divergence[field]
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
    if field == "spike_factor":
      ok = ok and (value == 0 or value > 1)
    else:
      ok = ok and isinstance(value, int)
    _require(ok, f"config.divergence.{field}={value!r}; allowed: {allowed}")
  _switch(config, "skip_nonfinite_steps")
  every = config.diagnostics.every
  _require(isinstance(every, int) and not isinstance(every, bool) and every >= 0,
           f"config.diagnostics.every={every!r}; allowed: an integer >= 0 (0 = off)")
  _require(not every or config.data.val_batches > 0,
           f"config.diagnostics.every={every} reads a validation batch but "
           f"config.data.val_batches=0; allowed: data.val_batches >= 1, or diagnostics.every=0")
  nan_at = config.debug.nan_at_step
  _require(isinstance(nan_at, int) and nan_at >= 0,
           f"config.debug.nan_at_step={nan_at!r}; allowed: an integer >= 0 (0 = off)")
  validate_diagnostics(config.diagnostics)
  if every:  # Off, its rows are the post-hoc diagnose's to check (a 1-row batch trains).
    check_heldout_rows(config.diagnostics.batch_size, config, "config.diagnostics.batch_size")


def check_heldout_rows(batch_size: int, config, name: str, other: str = "") -> None:
  """The diagnostics read ``batch_size`` rows of one validation batch, which holds
  ``config.data.global_batch_size``: more were cut silently and recorded as asked. ``other``:
  how else to set it (diagnose names --batch_size for a run's own value)."""
  rows = config.data.global_batch_size
  _require(batch_size <= rows, f"{name}={batch_size}; allowed: 1..{rows} (the rows of a "
                               f"validation batch, config.data.global_batch_size){other}")


def validate_diagnostics(diag) -> None:
  """``config.diagnostics``' knobs, before anything is written (they were checked only when the
  training hook was built, after the run's config.json, or not at all)."""
  number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0
  thresholds = diag.thresholds
  _require(isinstance(thresholds, (tuple, list)) and len(thresholds) == 2
           and all(number(t) for t in thresholds),
           f"config.diagnostics.thresholds={thresholds!r}; allowed: (causal, permutation), two "
           f"numbers >= 0 (the paper's (0.45, 0.15))")
  _require(number(diag.dead_threshold) and diag.dead_threshold <= 1,
           f"config.diagnostics.dead_threshold={diag.dead_threshold!r}; allowed: a weight in "
           f"[0, 1]")
  _require(isinstance(diag.batch_size, int) and not isinstance(diag.batch_size, bool)
           and diag.batch_size >= 1,
           f"config.diagnostics.batch_size={diag.batch_size!r}; allowed: an integer >= 1 (rows "
           f"of the first validation batch)")
  from depthbench_jax.diagnostics.probes import Options  # Local: the probes import the model.
  Options.from_config(diag).validate()


def validate_iso(config) -> None:
  """With ``config.iso_target_params`` > 0, the shape's parameter count must be within
  ``iso_tolerance`` of it. Counted like ``shapes.iso_param_width`` counts: the Pre-LN backbone at
  this shape (``jax.eval_shape``, nothing allocated), so every design of one shape agrees."""
  target = config.iso_target_params
  if not target:
    return
  from depthbench_jax import shapes  # Local: counting pulls in the model.
  _number(config, "iso_target_params", low=0, low_open=True,
          allowed="a positive parameter count (0 = no iso check)")
  count = config.iso_count
  _require(count in shapes.COUNTS,
           f"config.iso_count={count!r}; allowed: {', '.join(shapes.COUNTS)}")
  tolerance = _number(config, "iso_tolerance", low=0, low_open=True,
                      allowed="a relative tolerance > 0, e.g. 0.02")
  backbone = ml_collections.ConfigDict(config.model.to_dict())
  backbone.residual = ml_collections.ConfigDict({"name": "preln"})
  achieved = shapes.param_counts(backbone)[count]
  error = achieved / target - 1.0
  model = config.model
  _require(abs(error) <= tolerance,
           f"config.model shape {model.n_layers}x{model.d_model} has {achieved:,} {count} "
           f"parameters, {error:+.2%} off config.iso_target_params={target:.6g}; allowed: within "
           f"config.iso_tolerance={tolerance:g}, e.g. the width shapes.iso_param_width picks "
           f"for {model.n_layers} layers")


def validate_data_fields(data, model) -> None:
  """The data checks that need neither the devices nor the data files: config.data's own fields
  (``data.checks.check_data_config``, which the pipeline runs too: source, tokenizer, sizes,
  seed, val_batches, worker_count; once checked only when the iterators were built, after every
  uncached shard was tokenized), then against the model: ``seq_len <= model.max_seq_len`` and
  the vocabulary holding the tokenizer's."""
  from depthbench_jax.data.checks import check_data_config
  check_data_config(data)
  _require(data.seq_len <= model.max_seq_len,
           f"config.data.seq_len={data.seq_len} exceeds config.model.max_seq_len="
           f"{model.max_seq_len}; allowed: <= {model.max_seq_len} (raise max_seq_len to train "
           f"longer contexts)")
  from depthbench_jax.data.tokenizer import vocab_size_of
  vocab = vocab_size_of(data.tokenizer)   # no merge table: the data path reads that
  _require(model.vocab_size >= vocab,
           f"config.model.vocab_size={model.vocab_size} is smaller than tokenizer "
           f"{data.tokenizer!r}'s {vocab}; allowed: >= {vocab}")


def validate_devices(config, device_count: int, process_count: int) -> None:
  """The checks that need the devices alone: ``config.mesh`` fits ``device_count`` and the batch
  splits over its batch shards, the microbatches and the processes (``validate_batch_split``);
  the sweep makes them for LOCAL_PROCESSES before any run starts."""
  mesh = sharding.mesh_shape(config.mesh, device_count)
  validate_batch_split(config.data, process_count, data_parallel=mesh[0] * mesh[1],
                       microbatches=config.grad_accum_steps)


def validate_batch_split(data, process_count: int, data_parallel: int,
                         microbatches: int = 1) -> None:
  """The batch splits over the batch shards (data x fsdp), the microbatches and the processes,
  each process's rows within its own shards."""
  batch = data.global_batch_size
  _require(batch % data_parallel == 0,
           f"config.data.global_batch_size={batch} is not divisible by the data-parallel size "
           f"{data_parallel} (mesh data x fsdp); allowed: a multiple of {data_parallel}, or a "
           f"mesh (or device count) whose data x fsdp divides {batch}")
  rows = batch // data_parallel
  _require(rows % microbatches == 0,
           f"config.grad_accum_steps={microbatches} does not divide the {rows} rows each batch "
           f"shard holds (config.data.global_batch_size={batch} / {data_parallel}, mesh data x "
           f"fsdp); allowed: a divisor of {rows}")
  _require(batch % process_count == 0,
           f"config.data.global_batch_size={batch} is not divisible by the {process_count} "
           f"processes; allowed: a multiple of {process_count}")
  # Each process feeds its own rows, so every batch shard (a data x fsdp cell, its tensor-axis
  # devices holding copies) must lie within one process: a tensor axis across hosts would give
  # copies of one shard different rows.
  _require(data_parallel % process_count == 0,
           f"config.mesh has {data_parallel} batch shards (data x fsdp) for {process_count} "
           f"processes: a shard's devices would span processes; allowed: data x fsdp a multiple "
           f"of {process_count} (keep config.mesh.tensor within one host)")


def validate_name(config) -> None:
  """A run named ``<design>_<L>x<d>_lr<lr>`` (a suite's config argument, ``sweep.run_name``)
  must train that design, shape and LR: ``--config.model.n_layers=8`` or ``--config.lr=1e-3``
  beside ``smoke.py:arch=preln,shape=4x128`` trained another model under the argument's name,
  which the sweep's plan and the report then counted as the run the name says."""
  from depthbench_jax import sweep  # Local, as the sweep's own import of this module is.
  from depthbench_jax.residual import registry  # pylint: disable=g-import-not-at-top
  parsed = sweep.parse_run_name(str(config.name))
  if parsed is None or parsed[0] not in registry.names():  # 'mytest_4x128_lr3e-3': the user's
    return
  design, shape, lr = parsed
  model = config.model
  named = {"model.residual.name": (model.residual.name, design, "arch"),
           "model.n_layers": (model.n_layers, shape.n_layers, "shape"),
           "model.d_model": (model.d_model, shape.d_model, "shape"),
           "lr": (sweep.format_lr(config.lr), sweep.format_lr(lr), "lr")}  # As the name has it.
  said = {"arch": design, "shape": f"{shape.n_layers}x{shape.d_model}",
          "lr": sweep.format_lr(lr)}
  for field, (value, says, key) in named.items():
    if value != says:
      value = config.lr if field == "lr" else value
      raise ConfigError(
          f"config.{field}={value!r}, but the run is named {config.name!r}, which says "
          f"{key}={said[key]}; allowed: a run name that matches ({key}= in a suite's --config "
          f"argument names the run), or another --config.name")


def validate_without_devices(config) -> ModelConfig:
  """The checks that need neither the devices nor the data (fields, model, recipe, guards, the
  data fields: a seq_len over max_seq_len too), as ``--dry_run`` plans a suite; returns the
  ``ModelConfig`` or raises the first ``ConfigError``."""
  validate_fields(config)
  model_cfg = model_config_from(config.model)
  validate_recipe(config)   # before the name, which formats config.lr (nan has no run name)
  validate_name(config)
  validate_data_fields(config.data, config.model)   # before the guards, which read val_batches
  validate_guards(config)
  return model_cfg


def validate(config, device_count: int, process_count: int | None = None) -> ModelConfig:
  """Returns the model's ``ModelConfig`` or raises the first ``ConfigError``."""
  import jax
  process_count = jax.process_count() if process_count is None else process_count
  model_cfg = validate_without_devices(config)
  if config.data.source == "parquet":   # As the loader reads it: '~' expanded, '**' recursive.
    from depthbench_jax.data.sources import parquet_files
    parquet_files(config.data.path)
  validate_devices(config, device_count, process_count)
  validate_iso(config)
  return model_cfg


def as_json(config) -> dict:
  """``config`` as config.json holds it: plain JSON values (tuples as lists)."""
  return json.loads(json.dumps(config.to_dict()))


def _with_design_defaults(tree: dict) -> dict:
  """``tree`` with ``model.residual`` filled from its design's ``Design.defaults``, as the model
  reads it: config.json keeps the residual as written, so a design option given on one side
  only (``sinkhorn_iters=5`` when trained, left out on resume, i.e. 20) was never compared."""
  from depthbench_jax.residual import registry  # pylint: disable=g-import-not-at-top
  residual = (tree.get("model") or {}).get("residual") or {}
  if residual.get("name") not in registry.names():
    return tree
  model = {**tree["model"], "residual": {**registry.get(residual["name"]).defaults, **residual}}
  return {**tree, "model": model}


def recipe_changes(saved: dict, config) -> list[tuple[str, object, object]]:
  """``[(field, saved value, config's value)]`` for every field outside ``RESUMABLE_FIELDS``
  that differs, design options with their defaults, and a field the saved config lacks (added
  to the schema after it was written) as its schema default (``with_schema_defaults``: what the
  code did before the field existed); a retired field, on the saved side only, is not compared.
  A run from before ``budget_design`` resumed under a suite setting it passed, and its step
  count (its LR schedule) changed mid-run."""
  old = flatten_fields(_with_design_defaults(with_schema_defaults(saved).to_dict()))
  new = flatten_fields(_with_design_defaults(as_json(config)))
  return [(f, old[f], new[f]) for f in sorted(old.keys() & new.keys())
          if old[f] != new[f] and not is_resumable(f)]


def describe_changes(changed: list[tuple[str, object, object]]) -> tuple[str, str]:
  """``recipe_changes`` as two phrases: ``'config.f=new, ...'`` and the old values
  ``'old, ...'``."""
  return (", ".join(f"config.{f}={new!r}" for f, _, new in changed),
          ", ".join(repr(old) for _, old, _ in changed))


def check_resume(saved: dict, config, workdir: str) -> None:
  """Raises one ``ConfigError`` naming every field whose value differs from ``saved`` (the
  run's ``config.json``, written when its checkpoints were trained) other than the
  ``RESUMABLE_FIELDS``: a resume under another recipe would silently mix two runs in one
  workdir (and ``config.json`` would no longer say how the checkpoints were made). A field
  the saved config lacks reads as its schema default (``recipe_changes``)."""
  changed = recipe_changes(saved, config)
  now, trained = describe_changes(changed)
  _require(not changed,
           f"{now}: the checkpoints in {workdir} were trained with {trained}, and a "
           f"resumed run keeps every field that changes what a step computes; allowed: the "
           f"same values, a new --workdir, or changes only to "
           f"{', '.join(f.rstrip('.') for f in RESUMABLE_FIELDS)}")


def check_warmup(config, steps: int) -> None:
  """One ``ConfigError`` when the warmup (``optimizer.warmup_steps_of``) is not below the run's
  ``steps`` (``config.steps``, or the budget's for -1): the LR never reached config.lr nor
  decayed, and the run finished 'ok' (a suite's warmup of 12 under ``--config.steps=10`` ended
  at 0.75 lr)."""
  from depthbench_jax.train.optimizer import warmup_steps_of
  # As lr_schedule takes it: at least one step, the first at LR 0 (a 1-step run of warmup 0
  # trained nothing, 'ok').
  warmup = max(warmup_steps_of(config, steps), 1)
  _require(warmup < steps,
           f"config.warmup_steps={config.warmup_steps!r} is {warmup} of the run's {steps} steps "
           f"(config.steps={config.steps}): the LR would never reach config.lr nor decay; "
           f"allowed: a warmup (steps, or a fraction in (0, 1)) below the run's steps")


def check_resume_data(saved: dict | None, now: dict, config, workdir: str) -> None:
  """Raises one ``ConfigError`` when the train data's fingerprint (``pipeline.train_fingerprint``)
  differs from ``saved``, the one the run's latest checkpoint recorded: shards added to or
  removed from config.data.path between a preemption and the resume give another window
  permutation, and the restored iterator position would silently repeat some windows and skip
  others. ``saved`` None (a checkpoint from before fingerprints were recorded) is accepted."""
  if saved is None or saved == now:
    return
  raise ConfigError(
      f"{_data_where(config)} now holds {_data_held(now)}, but the checkpoints in {workdir} "
      f"were trained on {_data_held(saved)}: resumed on other data, the run would repeat some "
      f"windows and skip others; allowed: the data the run started with (restore its shards), "
      f"or a new --workdir")


def check_same_data(now: dict, config) -> None:
  """Raises one ``HostsDiffer`` on every process when the processes' train data fingerprints
  (``pipeline.train_fingerprint``, gathered over JAX's collectives) differ, at a fresh start as
  on a resume. Each process cuts its rows ``p::P`` of every global batch from its own copy of
  the stream; a host whose copy of config.data.path lacks a shard (an interrupted rsync) has
  another window count and permutation, so the global batch repeats some windows and skips
  others, while the checkpoints record process 0's fingerprint alone."""
  import jax
  if jax.process_count() == 1:
    return
  from depthbench_jax.hosts import gather_text
  text = json.dumps(now, sort_keys=True)
  for other, theirs in enumerate(gather_text(text)):
    if theirs != text:
      raise HostsDiffer(
          f"{_data_where(config)}: process {jax.process_index()} of {jax.process_count()} reads "
          f"{_data_held(now)}, process {other} {_data_held(json.loads(theirs))}: the global "
          f"batch would repeat some windows and skip others; allowed: the same shards on every "
          f"host (one shared path, or identical copies at that path)")


def _data_where(config) -> str:
  data = config.data
  where = f"config.data.path={data.get('path')!r} (config.data.source={data.source!r}"
  return where + (f", config.data.tfds_name={data.tfds_name!r})" if data.source == "tfds" else ")")


def _data_held(fingerprint: dict) -> str:
  f = fingerprint
  return (f"{f.get('shards')} shards, {f.get('train_tokens'):,} train tokens (shard keys sha1 "
          f"{f.get('shard_keys_sha1')})")
