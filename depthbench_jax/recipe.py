"""What a run's recipe is, as field names of its config (no jax: the report reads it too).

A config's fields fall in three kinds: ``RESUMABLE_FIELDS``, which a resumed run may change
(they do not change what a step computes; the run's name among them); ``RUN_FIELDS``, which a
suite sets per run (its design, shape and LR) or which do not make another recipe (the seeds,
the data's path); and the rest, the recipe, which every run of one suite shares.
"""

from __future__ import annotations

# Fields a resumed run may change: how it is logged, evaluated, checkpointed, diagnosed, guarded,
# laid out on devices or in microbatches, what its backward recomputes (model.remat_policy: the
# same values for less memory), which kernel runs the same math (``IMPLEMENTATION_FIELDS``), and
# how many processes read its data (data.worker_count: the same batches,
# `data/pipeline.TrainIterator`), not what a step computes. Any other field must equal the value
# the run's checkpoints were trained with (``config_check.check_resume``). A prefix names a whole
# group.
# The implementation switches: cuDNN flash or XLA attention, mHC's Pallas or XLA Sinkhorn
# (every ``Design.implementation_options``; a test checks). A run trained on one and resumed,
# swept or compared on the other is the same recipe (equal to fp rounding, as another remat
# policy under bf16): the resume refused them while the sweep's finished runs took them.
IMPLEMENTATION_FIELDS = ("model.attention_kernel", "model.residual.sinkhorn_kernel")
RESUMABLE_FIELDS = ("name", "log_every", "tensorboard", "eval_every", "eval_batches",
                    "checkpoint_every", "keep_checkpoints", "async_checkpointing",
                    "peak_flops_per_device", "diagnostics.", "divergence.",
                    "skip_nonfinite_steps", "debug.", "mesh.", "evals.", "data.cache_dir",
                    "data.worker_count", "iso_target_params", "iso_count", "iso_tolerance",
                    "grad_accum_steps", "model.remat_policy", *IMPLEMENTATION_FIELDS)

# Of the resumable fields, those that decide whether a run diverges (its divergence rules,
# skipping non-finite steps, injected faults): a diverged run resumed under other ones trains on
# (``train/loop._diverged_summary``).
GUARD_FIELDS = ("divergence.", "skip_nonfinite_steps", "debug.")

# What a suite sets per run (``sweep.apply_run``: the design with its options, the shape with
# what it derives, the LR), the seeds (another seed is the same recipe), and ``data.path`` (the
# same shards are spelled differently on another host; the checkpoints fingerprint the data).
RUN_FIELDS = ("lr", "model.residual.", "model.n_layers", "model.d_model", "model.head_dim",
              "model.ffn_dim", "seed", "data.seed", "data.path")
# Of those, the ones that differ from a suite's config for the run's own design, shape and LR
# without making it another run (report.plan.other_recipe_runs): the seeds and the data's path.
# The design's options do count there: a 2-stream HC run in a planned HC folder is no HC run.
OWN_FIELDS = ("seed", "data.seed", "data.path")


def flatten_fields(tree: dict, prefix: str = "") -> dict:
  """``{'model.d_model': 512, ...}``: a nested config dict as dotted field names (the names the
  ``--config.`` flags and every config error use)."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(flatten_fields(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def named_in(field: str, names: tuple[str, ...]) -> bool:
  """``field`` is one of ``names``, or under one ending in '.' (a whole group)."""
  return any(field == f or (f.endswith(".") and field.startswith(f)) for f in names)


def is_resumable(field: str) -> bool:
  return named_in(field, RESUMABLE_FIELDS)


def is_run_field(field: str) -> bool:
  return named_in(field, RUN_FIELDS)


def is_own_field(field: str) -> bool:
  return named_in(field, OWN_FIELDS)


def is_guard_field(field: str) -> bool:
  return named_in(field, GUARD_FIELDS)


def guard_changes(trained: dict, config: dict) -> list[str]:
  """The guard fields (``GUARD_FIELDS``) two nested configs set differently, sorted: a diverged
  run under other ones trains on from its last checkpoint. A field ``trained`` lacks (older
  code) reads as its schema default, as the run ran it: missing, it differed from every value
  and retrained a run diverged under the same rules."""
  from depthbench_jax.train.config_check import with_schema_defaults  # Local: jax, a cycle.
  a, b = flatten_fields(with_schema_defaults(trained).to_dict()), flatten_fields(config)
  return sorted(k for k in a.keys() | b.keys() if is_guard_field(k) and a.get(k) != b.get(k))


def shared_differences(a: dict, b: dict) -> dict[str, tuple]:
  """``{field: (a's value, b's value)}`` for the recipe fields (neither resumable nor a run's
  own) two runs' saved configs both hold and set differently: two runs a best-LR comparison
  may not set side by side. A field on one side only (an older config) is not compared."""
  fa, fb = flatten_fields(a), flatten_fields(b)
  return {f: (fa[f], fb[f]) for f in sorted(fa.keys() & fb.keys())
          if fa[f] != fb[f] and not is_resumable(f) and not is_run_field(f)}
