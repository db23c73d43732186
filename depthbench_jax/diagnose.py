"""``python -m depthbench_jax.diagnose --workdir=RUN_DIR``: layer diagnostics of a finished run.

Restores the latest (or ``--step``) checkpoint's params, takes the first
``config.diagnostics.batch_size`` rows of the first held-out batch, runs every diagnostic
(``diagnostics/probes.py``) and writes ``RUN_DIR/diagnostics.json`` and ``RUN_DIR/plots/diag_*.png``
(``--out=PATH``: ``PATH`` and ``plots/`` beside it, named ``<stem>_diag_*.png`` unless PATH is a
``diagnostics.json``). The settings that decide the numbers (held-out
rows and every option but the ``*_chunk`` memory knobs) are recorded as ``options``; an existing
file made with other settings is replaced only with ``--overwrite``, so a debug rerun never
silently replaces a finished result.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Any

# allow_override: diagnose.py and evaluate.py share flag names and may be imported together.
from absl import app, flags, logging

from depthbench_jax.errors import ConfigError, absl_flags_parser, fail, quiet_logs

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory with config.json and checkpoints/.",
                               allow_override=True)
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).",
                              allow_override=True)
_BATCH_SIZE = flags.DEFINE_integer("batch_size", None,
                                   "Held-out rows (default: config.diagnostics.batch_size).",
                                   allow_override=True)
_SET = flags.DEFINE_multi_string("set", [], "KEY=VALUE overrides of config.diagnostics, e.g. "
                                 "--set=permutation_chunk=4 --set=causal_reduction=max.")
_OUT = flags.DEFINE_string("out", None, "Result file (default RUN_DIR/diagnostics.json); its "
                           "plots go to plots/ beside it.", allow_override=True)
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace --out even when it was made with "
                               "other settings.", allow_override=True)
flags.register_validator("batch_size", lambda n: n is None or n >= 1,
                         message="allowed: an integer >= 1 (or unset: the config's)")
USAGE = ("python -m depthbench_jax.diagnose --workdir=RUN_DIR [--step=N] [--batch_size=N] "
         "[--set=KEY=VALUE ...] [--out=PATH] [--overwrite]")


def diagnostics_options(config: Any, overrides: dict | None = None) -> dict:
  """``config.diagnostics`` of the run plus overrides."""
  return {**config.diagnostics, **(overrides or {})}


def result_settings(diag: dict) -> dict:
  """What of ``diag`` (``diagnostics_options``) decides the numbers: the held-out rows and
  ``probes.Options.result_settings`` (not the ``*_chunk`` memory knobs). Recorded as the
  result's ``options``."""
  from depthbench_jax.diagnostics import probes
  return {"batch_size": int(diag["batch_size"]),
          **probes.Options.from_config(diag).result_settings()}


def diagnose(workdir: str, config: Any, params: Any, batch: Any, step: int | None = None,
             overrides: dict | None = None, out: str | None = None) -> dict:
  """Runs the diagnostics and writes ``out`` (default ``workdir/diagnostics.json``) and
  ``plots/*.png`` beside it."""
  from depthbench_jax.diagnostics import plots, probes
  from depthbench_jax.model.config import model_config_from
  from depthbench_jax.train import summary

  diag = diagnostics_options(config, overrides)
  settings = result_settings(diag)
  cfg = model_config_from(config.model)
  tokens = probes.heldout_tokens(batch, settings["batch_size"])
  t0 = time.perf_counter()
  result = probes.Probes(cfg, probes.Options.from_config(diag)).run(params, tokens)
  result["timing"]["total_s"] = time.perf_counter() - t0
  result["step"] = step
  result["name"] = config.name
  result["workdir"] = os.path.abspath(workdir)
  result["options"] = settings
  out = out or os.path.join(workdir, "diagnostics.json")
  # Named after ``out`` unless it is a diagnostics.json: a debug --out beside the run's own
  # (or several in one folder) replaced its plots, which its diagnostics.json still named.
  stem = os.path.splitext(os.path.basename(out))[0]
  pngs = plots.save_pngs(result, os.path.join(os.path.dirname(os.path.abspath(out)), "plots"),
                         prefix="diag_" if stem == "diagnostics" else f"{stem}_diag_")
  result["plots"] = {k: os.path.relpath(v, workdir) for k, v in pngs.items()}
  summary.atomic_write_json(out, result)
  return result


def _parse_overrides(items: list[str]) -> dict:
  """``--set=KEY=VALUE`` items -> ``{KEY: VALUE}`` (JSON values, else the string); a key the
  diagnostics do not read (a typo would be silently ignored) is one ``ConfigError``."""
  from depthbench_jax.diagnostics.probes import Options  # Local: pulls in jax.
  allowed = sorted({f.name for f in dataclasses.fields(Options)} | {"batch_size", "thresholds"})
  out = {}
  for item in items:
    key, eq, value = item.partition("=")
    if not eq or key not in allowed:
      raise ConfigError(f"--set={item}: not KEY=VALUE of a diagnostics option; allowed keys: "
                        f"{', '.join(allowed)}")
    try:
      out[key] = json.loads(value)
    except json.JSONDecodeError:
      out[key] = value
    _check_type(item, key, out[key])
  both = [k for k in ("causal_threshold", "permutation_threshold") if k in out]
  if "thresholds" in out and both:  # the per-field one won, without a word
    raise ConfigError(f"--set=thresholds and --set={both[0]} both set it; allowed: one of them")
  try:
    Options.from_config(out).validate()  # The allowed values of mean/max, all/late, >= 0, ...
  except ConfigError as err:
    raise ConfigError(f"--set: {err}") from None
  return out


def _check_type(item: str, key: str, value: Any) -> None:
  """``ConfigError`` unless ``value`` has the type of the option's default (an int passes for a
  float); ``batch_size`` an integer >= 1, ``thresholds`` two numbers (causal, permutation)."""
  from depthbench_jax.diagnostics.probes import Options  # Local: pulls in jax.
  number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
  if key == "thresholds":
    ok, allowed = (isinstance(value, list) and len(value) == 2 and all(map(number, value)),
                   "[causal, permutation], two numbers, e.g. [0.45,0.15]")
  elif key == "batch_size":
    ok, allowed = isinstance(value, int) and not isinstance(value, bool) and value >= 1, \
        "an integer >= 1"
  else:
    kind = type(getattr(Options(), key))
    ok = number(value) if kind is float else (
        isinstance(value, kind) and (kind is bool or not isinstance(value, bool)))
    allowed = {float: "a number", int: "an integer", bool: "true, false"}.get(kind, "a string")
  if not ok:
    raise ConfigError(f"--set={item}; allowed: {allowed}")


def headline(result: dict) -> str:
  """The result in one line: the late layers' mean consecutive angular distance, the causal and
  permutation shares that were measured, and where the design has them the effective rank of
  the late residual map (HC, mHC) and the dead prefix (Block AttnRes). With both probes off the
  line was empty while the JSON held a result."""
  percent = lambda x: "n/a (no late pairs)" if x is None else f"{100 * x:.1f}%"
  late = result["angular"]["late_consecutive_mean"]
  parts = [f"late angular distance {'n/a' if late is None else f'{late:.3f}'}"]
  parts += [f"{k} share {percent(result[k]['share'])} (late pairs above "
            f"{result[k]['threshold']:g})" for k in ("causal", "permutation") if k in result]
  if "mixing" in result:
    parts.append(f"late residual map erank {result['mixing']['erank_late']:.2f}")
  if "dead_prefix" in result:
    dead = result["dead_prefix"]
    parts.append(f"dead prefix {dead['dead_prefix']} layers (own-block weight below "
                 f"{dead['threshold']:g})")
  return ", ".join(parts)


def main(argv):
  del argv
  quiet_logs()
  from depthbench_jax.data import pipeline
  from depthbench_jax.train import checkpoint, config_check, summary

  workdir = _WORKDIR.value
  out = _OUT.value or os.path.join(workdir, "diagnostics.json")
  try:
    overrides = _parse_overrides(_SET.value)  # Bad input fails before the checkpoint loads.
    if _BATCH_SIZE.value is not None:
      if "batch_size" in overrides:  # the flag won, without a word
        raise ConfigError(f"--batch_size={_BATCH_SIZE.value} and --set=batch_size="
                          f"{overrides['batch_size']}; allowed: one of them")
      overrides["batch_size"] = _BATCH_SIZE.value
    config, params, step = checkpoint.restore_run(workdir, _STEP.value)
    # The run's own config.diagnostics.batch_size is checked here too: training checks it only
    # when it diagnoses (diagnostics.every > 0).
    config_check.check_heldout_rows(
        overrides.get("batch_size", config.diagnostics.batch_size), config,
        "--batch_size" if _BATCH_SIZE.value is not None else "--set=batch_size"
        if "batch_size" in overrides else "config.diagnostics.batch_size",
        "" if "batch_size" in overrides else ", set by --batch_size=N")
    summary.check_replaceable(  # Before the probes run: a finished result is never lost.
        out, result_settings(diagnostics_options(config, overrides)), _OVERWRITE.value,
        lambda key: "--batch_size" if key == "batch_size" else f"--set={key}", step=step,
        workdir=workdir, kind=("diagnostics", "angular"))
    # The plots go beside the result: a file there lost the result after every probe ran.
    summary.check_folder(os.path.join(os.path.dirname(os.path.abspath(out)), "plots"),
                         f"--out={_OUT.value}" if _OUT.value else f"--workdir={workdir}")
    # The run's own data (config.data.path may name shards this host does not have).
    val = pipeline.make_val_batches(config, process_index=0, process_count=1)
  except ConfigError as err:
    fail(str(err))
  if not val:
    fail(f"--workdir={workdir}: config.data.val_batches=0, no held-out batch to diagnose; "
         "allowed: a run with config.data.val_batches >= 1")
  result = diagnose(workdir, config, params, val[0], step=step, overrides=overrides, out=out)
  logging.info("diagnostics of %s (%s, L=%d) in %.1fs -> %s", workdir, result["design"],
               result["n_layers"], result["timing"]["total_s"], out)
  print(f"diagnostics at step {step} -> {out} (plots beside it): {headline(result)}",
        file=sys.stderr)
  print(json.dumps({k: result[k]["share"] for k in ("causal", "permutation") if k in result}))


if __name__ == "__main__":
  flags.mark_flags_as_required(["workdir"])
  app.run(main, flags_parser=absl_flags_parser(USAGE))
