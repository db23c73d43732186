"""Sweeps: list a suite's runs, skip finished ones, print the plan, launch the rest, pick best LRs.

A suite is a config file (``configs/suite_400m.py``) with ``get_config(arg)`` taking
``arch=...,shape=LxD,lr=...`` and a ``sweep()`` listing every run as such a dict; ``NAME`` names
the results folder (``results/<NAME>/<design>_<L>x<d>_lr<lr>/``).

    python -m depthbench_jax.sweep configs/suite_400m.py --dry_run   # the plan, nothing runs
    python -m depthbench_jax.sweep configs/smoke.py                  # runs what is missing

A run is finished when its ``summary.json`` exists with a final status ('ok' or 'diverged'); an
unfinished run is launched again with the same workdir, and ``main.py`` resumes it from
``WORKDIR/checkpoints``. A finished or started run whose recipe the suite has since changed is
refused (``check_recipes``). Runs go one after another. ``LOCAL_PROCESSES=N`` starts each run as N
local JAX processes (coordinator on a free localhost port). On a multi-host pod, start this
once per host (``srun``, or ``JAX_COORDINATOR_ADDRESS/JAX_NUM_PROCESSES/JAX_PROCESS_ID``); every
host walks the same list, so the results dir must be on a filesystem all hosts share.
A run that crashes or diverges is recorded and the sweep goes on; one whose hosts were given
different runs (``main.check_same_run``: a host restarted mid-sweep) stops it on every host,
and so does one whose hosts did not all join (JAX aborts after ``JAX_INIT_TIMEOUT_S``).

Plan FLOPs are ``systems.flops.train_flops_per_token`` (PaLM convention: 6 N_matmul per token
plus the causal attention term, forward + backward) times tokens; device-hours assume
``--mfu`` of ``--peak_flops`` per device (defaults 0.4 of 989e12, H100 dense bf16).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib.util
import inspect
import json
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import traceback
from typing import Any, Iterable, Sequence

import ml_collections

from depthbench_jax import recipe
from depthbench_jax.errors import ConfigError, HOSTS_DIFFER, OneLineParser, is_positive_number
from depthbench_jax.shapes import FFNRule, Shape, parse_shape, shaped_model
from depthbench_jax.train.summary import CONFIG, SUMMARY, check_folder, checkpoint_steps
from depthbench_jax.train.workdir_lock import is_lock_file

FINAL_STATUSES = ("ok", "diverged")
DEFAULT_MFU = 0.4
DEFAULT_PEAK_FLOPS = 989e12  # H100 SXM dense bf16 FLOP/s.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------------
# Run arguments and names (used by every suite's get_config).
# ---------------------------------------------------------------------------------------------

def format_lr(lr: float) -> str:
  """Shortest mantissa-exponent form: 3e-4 -> '3e-4', 0.0012 -> '1.2e-3'."""
  mantissa, exponent = f"{float(lr):.6e}".split("e")
  mantissa = mantissa.rstrip("0").rstrip(".")
  return f"{mantissa}e{int(exponent)}"


def run_name(design: str, shape: Shape, lr: float) -> str:
  """``<design>_<L>x<d>_lr<lr>``, e.g. ``hc_16x1216_lr3e-4``."""
  return f"{design}_{shape.name}_lr{format_lr(lr)}"


def parse_run_name(name: str) -> tuple[str, Shape, float] | None:
  """``run_name``'s inverse, ``(design, shape, lr)``; None for a name of another form (an lr
  that does not parse, or is not finite: 'lr1e999' has no run name)."""
  match = re.fullmatch(r"(.+)_(\d+)x(\d+)_lr([0-9.eE+-]+)", name)
  try:
    lr = float(match[4]) if match else math.nan
  except ValueError:  # An lr like '1e-3e-4'.
    return None
  return (match[1], Shape(int(match[2]), int(match[3])), lr) if math.isfinite(lr) else None


def parse_run_arg(arg: str | None, defaults: dict[str, Any]) -> dict[str, Any]:
  """``'arch=hc,shape=16x1216,lr=3e-4'`` -> ``{'arch': 'hc', 'shape': Shape(16,1216), 'lr':
  3e-4, ...}`` over ``defaults``; unknown keys are a ConfigError naming the allowed ones.

  ``defaults['lr']`` may be a function of the design, ``lr(arch) -> float``: a suite whose
  designs need different peak LRs gives each its own when the argument names none."""
  out = dict(defaults)
  for item in (arg or "").split(","):
    item = item.strip()
    if not item:
      continue
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or key not in defaults:
      raise ConfigError(f"config argument {item!r}; allowed: key=value with key in "
                        f"{', '.join(sorted(defaults))}")
    out[key] = value.strip()
  if isinstance(out.get("shape"), str):
    out["shape"] = parse_shape(out["shape"])
  if callable(out.get("lr")):
    out["lr"] = out["lr"](out["arch"])
  try:
    lr = float(out["lr"])
  except (TypeError, ValueError):
    lr = math.nan
  if not (math.isfinite(lr) and lr > 0):  # inf and nan have no run name (format_lr).
    raise ConfigError(f"config argument lr={out['lr']!r}; allowed: a positive number")
  out["lr"] = lr
  return out


def arg_string(entry: dict[str, Any]) -> str:
  """A sweep entry dict -> the ``get_config`` argument string (``arch=..,shape=..,lr=..``)."""
  parts = []
  for key, value in entry.items():
    if isinstance(value, Shape):
      value = value.name
    elif key == "lr" and isinstance(value, (int, float)) and math.isfinite(value):
      value = format_lr(value)   # Anything else (nan, inf) parse_run_arg reads, and refuses.
    parts.append(f"{key}={value}")
  return ",".join(parts)


# What ``apply_run`` replaces that the run's argument does not name: the design's options (set
# to its defaults), the LR, and what the shape derives (head_dim, the FFN by the suite's rule).
# The shape itself and the name come from the argument, visibly.
OVERWRITTEN_FIELDS = ("model.residual.", "model.head_dim", "model.ffn_dim",
                      "model.ffn_multiple_of", "lr")


def check_not_overwritten(before: dict, config: ml_collections.ConfigDict) -> None:
  """A suite's ``get_config`` that set one of ``OVERWRITTEN_FIELDS`` before ``apply_run``
  (``before``: its flattened config then) lost it without a word (a 2-stream HC trained 4
  streams). Refused, naming the field, where the value was not base.py's and ``apply_run``
  changed it."""
  base, after = _base_fields(), recipe.flatten_fields(config.to_dict())
  for field in sorted(before.keys() | after.keys()):
    if (recipe.named_in(field, OVERWRITTEN_FIELDS)
        and before.get(field) != base.get(field) and before.get(field) != after.get(field)):
      raise ConfigError(
          f"config.{field}={before.get(field)!r} is set before sweep.apply_run, which sets the "
          f"run's design (with its defaults), shape, FFN and LR and made it "
          f"{after.get(field)!r}; allowed: "
          + ("the suite's LR grid (sweep()'s lr=, which names the run)" if field == "lr" else
             f"set it after apply_run (c = sweep_lib.apply_run(c, run, ...); c.{field} = ...), "
             f"or --config.{field}=... on the command line"))


def apply_run(config: ml_collections.ConfigDict, run: dict[str, Any],
              ffn: FFNRule | None = None) -> ml_collections.ConfigDict:
  """Sets the shape (via ``shapes.shaped_model``), the design with its default hyperparameters,
  the LR and the run name on a suite's base config."""
  from depthbench_jax.residual import registry  # Local: pulls in jax/flax.
  if run["arch"] not in registry.names():
    raise ConfigError(f"config argument arch={run['arch']!r}; allowed: "
                      f"{', '.join(registry.names())}")
  design = registry.get(run["arch"])
  before = recipe.flatten_fields(config.to_dict())
  model = shaped_model(config.model, run["shape"], ffn)
  # A None default (KEEL's alpha = 2L) as an untyped reference: config_flags refuses to
  # override a None field; the design's check reads whatever the flag gives.
  model.residual = ml_collections.ConfigDict(
      {**{k: ml_collections.FieldReference(None, field_type=object) if v is None else v
          for k, v in design.defaults.items()}, "name": run["arch"]})
  config.model = model
  config.lr = run["lr"]
  config.name = run_name(run["arch"], run["shape"], run["lr"])
  check_not_overwritten(before, config)
  return config


# ---------------------------------------------------------------------------------------------
# Listing runs and their state.
# ---------------------------------------------------------------------------------------------

def put_repo_on_path() -> None:
  """The repo root on ``sys.path``, so a suite file's ``from configs import base`` works from
  any working directory."""
  if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)


def load_config_module(path: str):
  """Imports a config file by path (``put_repo_on_path`` first)."""
  put_repo_on_path()
  if not os.path.exists(path):
    raise ConfigError(f"config file {path!r} does not exist; allowed: a configs/*.py file")
  name = "depthbench_suite_" + os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  if spec is None or spec.loader is None:   # not a .py file
    raise ConfigError(f"config file {path!r} is no Python module; allowed: a configs/*.py file")
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except ConfigError:
    raise
  except Exception as err:  # pylint: disable=broad-except  # SyntaxError, ImportError, ...
    # One error line, not the file's traceback (sweep, systems and shapes showed one).
    raise ConfigError(f"config file {path!r} does not load: {type(err).__name__}: {err}; "
                      f"allowed: a config file that imports and runs") from None
  return module


def base_config() -> ml_collections.ConfigDict:
  """A fresh ``configs/base.py`` config: the schema and single source of defaults."""
  return load_config_module(os.path.join(REPO_ROOT, "configs", "base.py")).get_config()


@functools.lru_cache(maxsize=1)
def _base_fields() -> dict:
  return recipe.flatten_fields(base_config().to_dict())


def config_of(module, arg: str | None = None) -> ml_collections.ConfigDict:
  """``module.get_config(arg)`` (no argument when ``arg`` is empty). A mistake ConfigDict
  catches in the file, a value of the wrong type for a field (``c.steps = 1e3``) or a field
  it lacks (``c.modle``), is one ConfigError naming the file's line, not a traceback."""
  try:
    return module.get_config(arg) if arg else module.get_config()
  except ConfigError:
    raise
  except Exception as err:  # pylint: disable=broad-except  # a NameError too: one line
    library = os.path.dirname(ml_collections.__file__)
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if not f.filename.startswith(library) and f.filename != __file__]
    if not frames:  # Raised by the call itself: get_config takes no such argument.
      raise ConfigError(f"{module.__file__}:{arg}: {err}; allowed: the file alone, or a suite "
                        f"config taking arch=..,shape=..,lr=.. (e.g. configs/smoke.py:arch=hc)"
                        ) from None
    where = f"{frames[-1].filename}:{frames[-1].lineno} ({frames[-1].line})"
    typed = re.search(r"cannot be casted to type <class '(\w+)'>", str(err))
    allowed = (f"a value of type {typed.group(1)}" if typed else
               "the fields of configs/base.py, each with a value of its type"
               if isinstance(err, (TypeError, AttributeError, KeyError)) else
               "a get_config that runs")
    inner = err  # ConfigDict's AttributeError wraps a KeyError whose text is the message.
    while inner.args and isinstance(inner.args[0], BaseException):
      inner = inner.args[0]
    text = " ".join(str(inner.args[0] if inner.args else inner).split())
    raise ConfigError(f"{where}: {type(err).__name__}: {text}; allowed: {allowed}") from None


@dataclasses.dataclass(frozen=True)
class Run:
  name: str
  arg: str
  design: str
  shape: Shape
  lr: float
  workdir: str


def suite_name(module) -> str:
  return getattr(module, "NAME", None) or os.path.splitext(os.path.basename(module.__file__))[0]


def list_runs(config_path: str, results_dir: str | None = None) -> list[Run]:
  """Every entry of the config file's ``sweep`` (a list or a function returning one). Entries
  equal once parsed (``lr=1e-3`` and ``0.001``) are one run; entries that differ in a key the
  run name leaves out (a suite's own ``n_streams=``) would share one workdir: refused."""
  module = load_config_module(config_path)
  if not hasattr(module, "sweep"):
    raise ConfigError(f"{config_path} has no `sweep`; allowed: a suite config listing its runs")
  try:
    entries = module.sweep() if callable(module.sweep) else module.sweep
  except ConfigError:
    raise
  except Exception as err:  # pylint: disable=broad-except  # a NameError in sweep()
    raise ConfigError(f"{config_path}: sweep() raised {type(err).__name__}: {err}; allowed: a "
                      f"sweep() that lists the suite's runs") from None
  check_lr_tables(module, config_path)
  results_dir = results_dir or os.path.join("results", suite_name(module))
  example = "{'arch': 'preln', 'shape': '16x1216', 'lr': 1e-3}"
  if isinstance(entries, (str, bytes, dict)) or not hasattr(entries, "__iter__"):
    raise ConfigError(f"{config_path}: sweep gave {type(entries).__name__}; allowed: a list of "
                      f"run entries, e.g. [{example}]")   # None: a TypeError traceback once
  runs, seen = [], {}
  for entry in entries:
    if not (isinstance(entry, dict) and {"arch", "shape", "lr"} <= set(entry)):
      raise ConfigError(f"{config_path}: sweep entry {entry!r}; allowed: a dict with arch, "
                        f"shape and lr, e.g. {example}")   # KeyError/AttributeError once
    try:   # a list lr or a tuple shape reached the parser as 'config argument 0.002]'
      parsed = parse_run_arg(arg_string(entry), {k: None for k in entry})
    except ConfigError as err:
      raise ConfigError(f"{config_path}: sweep entry {entry!r}: {err}") from None
    name = run_name(parsed["arch"], parsed["shape"], parsed["lr"])
    if name in seen:
      if seen[name][0] != parsed:
        raise ConfigError(f"sweep entries {seen[name][1]} and {arg_string(entry)} are both run "
                          f"{name} (one workdir); allowed: entries that differ in arch, shape "
                          f"or lr, or a suite per value of the other keys")
      continue
    seen[name] = (parsed, arg_string(entry))
    runs.append(Run(name=name, arg=arg_string(entry), design=parsed["arch"],
                    shape=parsed["shape"], lr=parsed["lr"],
                    workdir=os.path.join(results_dir, name)))
  return runs


def check_lr_grid(grid, where: str) -> None:
  """One ConfigError naming ``where`` unless ``grid`` is a non-empty sequence of positive LRs
  (a numpy array is one): a grid typed as a string was read one character at a time, an error
  about lr='e' (or lr=1.0 from '1e-3', a run)."""
  if not (not isinstance(grid, (str, bytes, dict)) and hasattr(grid, "__len__")
          and len(grid) > 0 and all(map(is_positive_number, grid))):
    raise ConfigError(f"{where}={grid!r}; allowed: a tuple of positive LRs, e.g. (5e-4, 1e-3)")


def check_lr_tables(module, config_path: str) -> None:
  """A suite's LR tables (``LR_GRID``, ``LR_BY_ARCH``: design -> its LRs; ``DEFAULT_LRS``,
  each by ``check_lr_grid``): a misspelt design key fell back to the default grid silently."""
  from depthbench_jax.residual import registry  # Local: pulls in jax/flax.
  lrs_for = getattr(module, "lrs_for", None)
  read = getattr(inspect.unwrap(lrs_for), "__globals__", None) if callable(lrs_for) else None
  unread = [t for t in ("DEFAULT_LRS", "LR_GRID")
            if read is not None and hasattr(module, t) and read.get(t) is not getattr(module, t)]
  if unread:
    # A control suite's copy borrows suite_400m's lrs_for: its own tables were checked and
    # then never read (its dry run planned the 400M grid). Tables imported with it are its own.
    raise ConfigError(
        f"{config_path}: {' and '.join(unread)} are read by no lrs_for: this file's lrs_for is "
        f"{getattr(lrs_for, '__module__', '?')}.{getattr(lrs_for, '__qualname__', 'lrs_for')}, "
        f"which reads its own; allowed: a lrs_for of this file's (def lrs_for(design): return "
        f"LR_GRID.get(design, DEFAULT_LRS)), or no table here")
  if hasattr(module, "DEFAULT_LRS"):
    check_lr_grid(module.DEFAULT_LRS, f"{config_path}: DEFAULT_LRS")
  for table in ("LR_GRID", "LR_BY_ARCH"):
    for key, value in (getattr(module, table, None) or {}).items():
      if key not in registry.names():
        raise ConfigError(f"{config_path}: {table} key {key!r}; allowed: "
                          f"{', '.join(registry.names())}")
      if table == "LR_GRID":
        check_lr_grid(value, f"{config_path}: {table}[{key!r}]")
      elif not is_positive_number(value):
        raise ConfigError(f"{config_path}: {table}[{key!r}]={value!r}; allowed: a positive LR")


def read_summary(workdir: str) -> dict | None:
  """The run's summary.json, or None where there is none to read: missing, torn, not UTF-8
  or not an object (as the trainer reads it; ``[]`` raised AttributeError in run_state), or an
  object no trainer wrote, without a final status, a shape or an LR (``{}`` read 'done': the
  sweep never relaunched it, though the trainer resumes it, and the report dropped it)."""
  path = os.path.join(workdir, SUMMARY)
  try:
    with open(path) as f:
      data = json.load(f)
  except (OSError, ValueError):
    return None
  if not isinstance(data, dict) or data.get("status") not in FINAL_STATUSES:
    return None
  try:
    design, _, _ = shape_key(data)
    record_lr(data)
  except (TypeError, ValueError, KeyError, AttributeError):  # AttributeError: a list config.
    return None
  return data if design != "None" else None   # shape_key's str() of a missing design


def run_state(workdir: str, config: ml_collections.ConfigDict | None = None) -> str:
  """'done' (summary with a final status), 'partial' (started, e.g. checkpoints) or 'new' (no
  folder, or one holding only the sweep's own ``process_<i>.log`` or a trainer's lock file: a run
  refused at its start under LOCAL_PROCESSES, or a folder emptied by ``rm -rf RUN/*`` (which
  leaves the dot-file lock), read as 'started without a summary (training...)' in the report).

  Given the suite's ``config`` for the run, a run that diverged under other divergence rules
  (``recipe.guard_changes``: a suite edited to skip non-finite steps) is 'partial': the trainer
  resumes it from its last checkpoint, and one LR grid is not judged under two sets of rules."""
  summary = read_summary(workdir)
  if summary is not None:
    trained = summary.get("config")
    if (config is not None and summary.get("status") == "diverged"
        and isinstance(trained, dict) and recipe.guard_changes(trained, config.to_dict())):
      return "partial"
    return "done"
  started = os.path.isdir(workdir) and any(
      not (re.fullmatch(r"process_\d+\.log", name) or is_lock_file(name))
      for name in os.listdir(workdir))
  return "partial" if started else "new"


def trained_config(workdir: str) -> dict | None:
  """The config a run's steps were trained with: its summary's when finished, else the
  ``config.json`` of a started run with a checkpoint; None otherwise (a run that wrote its
  config.json and crashed before its first checkpoint trains afresh, as the trainer does)."""
  if run_state(workdir) == "done":
    config = read_summary(workdir).get("config")
    return config if isinstance(config, dict) else None
  if not checkpoint_steps(workdir):
    return None
  try:
    with open(os.path.join(workdir, CONFIG)) as f:
      saved = json.load(f)
  except (OSError, json.JSONDecodeError):
    return None
  return saved if isinstance(saved, dict) else None


def recipe_edits(config_path: str, runs: Sequence[Run]) -> list[tuple[Run, list]]:
  """``[(run, config_check.recipe_changes)]`` of the runs whose trained config (finished or
  started: ``trained_config``) the suite now gives another recipe (steps, data, schedule, ...).
  A finished run's own fields (``recipe.OWN_FIELDS``: data.path, the seeds) are not compared,
  as the report's ``other_recipe_runs`` does not: the same shards spelled otherwise (another
  mount) are the same run. A started one's resume compares them as written, so there they
  count."""
  from depthbench_jax.train import config_check  # Local: pulls in jax.
  module = load_config_module(config_path)
  out = []
  for run in runs:
    trained = trained_config(run.workdir)
    if trained is not None:
      config = config_of(module, run.arg)
      changed = config_check.recipe_changes(trained, config)   # no implementation switch
      if run_state(run.workdir, config) == "done":   # not one the sweep relaunches
        changed = [c for c in changed if not recipe.is_own_field(c[0])]
      if changed:
        out.append((run, changed))
  return out


def check_recipes(config_path: str, runs: Sequence[Run]) -> None:
  """A run is kept only if the suite still gives it the recipe it trained with (a finished run's
  summary, a started one's config.json): a suite edited since (steps, data, schedule, ...)
  would otherwise put two recipes in one best-LR comparison, or, for a run stopped midway,
  train the others under the edit while its own resume was refused, run after run. The first
  such run is one ``ConfigError``, before anything trains (and in a dry run)."""
  from depthbench_jax.train import config_check  # Local: pulls in jax.
  stale = recipe_edits(config_path, runs)
  if stale:
    run, changed = stale[0]
    now, trained = config_check.describe_changes(changed)
    more = f" (and {len(stale) - 1} more runs)" if len(stale) > 1 else ""
    state = "finished" if run_state(run.workdir) == "done" else "was trained"
    raise ConfigError(
        f"{now} in {config_path}: {run.workdir}{more} {state} with {trained}, "
        f"and a sweep's results keep one recipe per run; allowed: the values it trained with, "
        f"a new --results_dir, or moving the run out of the results dir")


# ---------------------------------------------------------------------------------------------
# The plan (--dry_run).
# ---------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _naming(run: Run):
  """A ConfigError raised inside, with the run's name in front."""
  try:
    yield
  except ConfigError as err:
    raise ConfigError(f"run {run.name}: {err}") from None


def checked_config(module, run: Run) -> ml_collections.ConfigDict:
  """``run``'s config, checked as main.py will check it except for what depends on the devices
  and the data (mesh, batch split, data path); under steps=-1 the warmup against the budget's
  steps too, which the trainer checks only once it has counted them (the dry run refused such a
  suite, the sweep launched every run to be refused); a ConfigError names the run. The dry
  run and the sweep both check every run of the suite, done or not, before the first trains: a
  suite entry's typo (``arch='hcc'``) stopped only the dry run, the sweep trained every run
  before it; and with every run done, a design option's typo stopped the dry run while the
  sweep exited 0 and reported that suite."""
  from depthbench_jax.train import config_check  # Local: pulls in jax.
  with _naming(run):
    config = config_of(module, run.arg)
    if config.name != run.name:   # validate_name reads the name: a renamed run passed it
      raise ConfigError(
          f"config.name={config.name!r}: get_config renamed the run the sweep trains in "
          f"{run.workdir} (with an LR set beside it, every LR of the grid trained that one under "
          f"its own name); allowed: the name apply_run gives, with the LR in the suite's LR "
          f"grid (sweep()'s lr=)")
    config_check.validate_without_devices(config)   # a fixed steps' warmup included
    config_check.validate_iso(config)
    if config.steps <= 0:
      config_check.check_warmup(config, budget_steps(config))
  return config


def budget_steps(config: ml_collections.ConfigDict) -> int:
  """The steps the trainer will run (``loop.total_steps_of``: steps=-1 resolved)."""
  from depthbench_jax.shapes import param_counts  # Local: pulls in jax.
  from depthbench_jax.train.loop import total_steps_of
  return total_steps_of(config, param_counts(config.model)["total"])


def check_local_processes(config: ml_collections.ConfigDict, n: int, run: Run) -> None:
  """The mesh and batch checks main.py makes on its devices, for ``n`` local processes of one
  device each (LOCAL_PROCESSES): a count that does not split the batch failed every run of
  the suite in turn, each error naming the batch, not the setting that changed."""
  from depthbench_jax.train import config_check  # Local: pulls in jax.
  try:   # (not the data path, which the trainer checks, whatever the process count)
    config_check.validate_devices(config, n, n)
  except ConfigError as err:
    raise ConfigError(f"--local_processes (LOCAL_PROCESSES)={n} ({n} processes of one device "
                      f"each), run {run.name}: {err}") from None


def plan_rows(config_path: str, runs: Sequence[Run], mfu: float = DEFAULT_MFU,
              peak_flops: float = DEFAULT_PEAK_FLOPS, configs: dict | None = None) -> list[dict]:
  """One row per run: params (the design's own, eval_shape), steps, tokens, FLOPs, hours.
  Each run's config is checked as main.py will check it (``checked_config``), unless
  ``configs`` (run name -> config) holds it checked already."""
  from depthbench_jax.model.config import model_config_from
  from depthbench_jax.shapes import param_counts
  from depthbench_jax.systems.flops import train_flops_per_token
  module = load_config_module(config_path)
  rows, flops_cache = [], {}
  for run in runs:
    config = configs[run.name] if configs else checked_config(module, run)
    counts = param_counts(config.model)
    steps = budget_steps(config)   # the trainer's own budget rule
    tokens = steps * config.data.global_batch_size * config.data.seq_len
    key = json.dumps(config.model.to_dict(), sort_keys=True, default=str)
    if key not in flops_cache:
      flops_cache[key] = train_flops_per_token(model_config_from(config.model),
                                               config.data.seq_len)
    flops = flops_cache[key] * tokens
    rows.append({"name": run.name, "design": run.design, "shape": run.shape.name,
                 "aspect_ratio": run.shape.aspect_ratio, "lr": run.lr,
                 "params_total": counts["total"], "params_non_embedding": counts["non_embedding"],
                 "steps": steps, "tokens": tokens, "flops": flops,
                 "device_hours": flops / (mfu * peak_flops) / 3600.0,
                 "state": run_state(run.workdir, config), "workdir": run.workdir,
                 # What an interrupted run has trained: it resumes from its latest checkpoint.
                 "steps_done": min(steps, (checkpoint_steps(run.workdir) or [0])[-1])})
  return rows


def off_target_shapes(config_path: str, module) -> list[str]:
  """One warning per shape a suite's ``SHAPE_SETS`` lists whose Pre-LN count is off the set's
  target: ``|count / target - 1| > tolerance``. Counted on the model the sweep trains
  (``get_config('arch=preln,shape=..')``, ``jax.eval_shape``), and said when that is not the
  model ``solver_model(key)`` (FFN by ``ffn_rule(key)``) solved the widths on: a field
  ``get_config`` set apart from it (tied embeddings, a GPT-2 vocab) trained a suite 7-15% off
  its target without a word. A typed-in width nothing else checks would otherwise train the
  whole grid at the wrong size; a file without the three names: none."""
  from depthbench_jax.shapes import SOLVER_NAMES, Solution, param_counts
  if not all(hasattr(module, n) for n in SOLVER_NAMES):
    return []
  out = []
  for key, shape_set in module.SHAPE_SETS.items():
    model, ffn = module.solver_model(key), module.ffn_rule(key)
    for shape in shape_set.parsed():
      try:
        built = param_counts(config_of(module, f"arch=preln,shape={shape.name}").model)
      except ConfigError:   # a get_config that needs an lr= or builds no Pre-LN: the solver's
        built = None
      try:   # a width the heads do not divide said only 'does not divide d_model=950'
        solved = param_counts(shaped_model(model, shape, ffn))
      except ConfigError as err:
        if built is None:   # get_config may build it (an explicit head_dim, as the error says)
          raise ConfigError(f"{config_path}: SHAPE_SETS[{key!r}] shape {shape.name}: {err}"
                            ) from None
        solved = built
      built = built or solved
      listed = Solution(shape, shape_set.target, shape_set.count, built, None)
      if abs(listed.rel_error) > shape_set.tolerance:
        apart = built != solved
        # The shapes tool solves on solver_model: where get_config builds another model, its
        # widths are the listed ones again; the fix is solver_model's.
        out.append(f"warning: SHAPE_SETS[{key!r}] shape {shape.name} has "
                   f"{human(listed.achieved, 4)} {shape_set.count} Pre-LN parameters"
                   + (f" as get_config builds it (solver_model({key!r}) counts "
                      f"{human(solved[shape_set.count], 4)})" if apart else "")
                   + f", {listed.rel_error:+.2%} off its target {human(shape_set.target, 4)} "
                   f"(tolerance {shape_set.tolerance:.2%}); "
                   + (f"give solver_model({key!r}) the model fields get_config sets, then "
                      if apart else "")
                   + f"the solver's widths: python -m depthbench_jax.shapes {config_path}")
  return out


MIN_PEAK_FLOPS = 1e9


def check_device_hours_inputs(mfu: float, peak_flops: float) -> None:
  """One ``ConfigError`` naming ``--mfu`` or ``--peak_flops`` (the plan's and the systems
  table's): device-hours divide by ``mfu * peak_flops``, so zero is a ZeroDivisionError, and an
  MFU over 1, nan or an infinite peak give hours no device reaches; so does a peak in the wrong
  unit (989 for an H100's 989 TFLOP/s printed 6.9e15 device-hours), hence a floor of 1 GFLOP/s."""
  if not 0 < mfu <= 1:
    raise ConfigError(f"--mfu={mfu}; allowed: a fraction in (0, 1]")
  if not MIN_PEAK_FLOPS <= peak_flops < math.inf:
    raise ConfigError(f"--peak_flops={peak_flops}; allowed: FLOP/s per device, >= "
                      f"{MIN_PEAK_FLOPS:.0e} (an H100's bf16 dense peak is 989e12)")


def human(x: float, digits: int = 3) -> str:
  """1234567 -> '1.23M' (K, M, B, T; ``digits`` significant figures)."""
  for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
    if abs(x) >= scale:
      return f"{x / scale:.{digits}g}{unit}"
  return f"{x:.{digits}g}"


def format_duration(seconds: float) -> str:
  """52 -> '52s', 3125 -> '52m05s', 45000 -> '12h30m'; '?' for inf or nan. Rounded to the
  unit shown (it truncated: 32.9 s read 32s beside the 0.00913 device-hours of 32.9 s)."""
  if not math.isfinite(seconds):
    return "?"
  whole = round(seconds)
  if whole < 60:
    return f"{whole}s"
  if whole < 3600:
    return f"{whole // 60}m{whole % 60:02d}s"
  minutes = round(seconds / 60)
  return f"{minutes // 60}h{minutes % 60:02d}m"


def format_plan(rows: Sequence[dict], mfu: float, peak_flops: float) -> str:
  header = (f"{'run':<36} {'state':<8} {'AR':>6} {'params':>9} {'non-emb':>9} {'steps':>8} "
            f"{'tokens':>9} {'FLOPs':>9} {'dev-h':>9}")
  lines = [header, "-" * len(header)]
  for r in rows:
    lines.append(f"{r['name']:<36} {r['state']:<8} {r['aspect_ratio']:>6.1f} "
                 f"{human(r['params_total']):>9} {human(r['params_non_embedding']):>9} "
                 f"{r['steps']:>8d} {human(r['tokens']):>9} {r['flops']:>9.2e} "
                 f"{r['device_hours']:>9.3g}")
  todo = [r for r in rows if r["state"] != "done"]
  # An interrupted run counts what is left after its latest checkpoint, not its whole budget.
  left = lambda r, key: r[key] * (1 - r.get("steps_done", 0) / r["steps"])
  lines.append("-" * len(header))
  lines.append(f"{len(rows)} runs ({len(rows) - len(todo)} done, {len(todo)} to run); "
               f"to run: {human(sum(left(r, 'tokens') for r in todo))} tokens, "
               f"{sum(left(r, 'flops') for r in todo):.3e} FLOPs, "
               f"{sum(left(r, 'device_hours') for r in todo):.1f} device-hours at MFU {mfu:g} of "
               f"{peak_flops:.3g} FLOP/s (all runs: "
               f"{sum(r['device_hours'] for r in rows):.1f} device-hours)")
  return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Executing.
# ---------------------------------------------------------------------------------------------

def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _without_fake_devices(xla_flags: str) -> str:
  return " ".join(f for f in xla_flags.split()
                  if not f.startswith("--xla_force_host_platform_device_count"))


class _Stop:
  """SIGTERM to the sweep: passed on to the training processes running (each saves a checkpoint
  and exits, ``train/loop.py``), and no further run starts."""

  def __init__(self):
    self.requested, self.children = False, []
    self._previous = None

  def __enter__(self):
    try:
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    except ValueError:  # Not the main thread: no handler.
      self._previous = None
    return self

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)

  def _handle(self, signum, frame):
    if not self.requested:  # A process group's SIGTERM arrives twice (run_sweep.sh forwards it).
      print("[sweep] SIGTERM: passing it to the running training job, then stopping", flush=True)
    self.requested = True
    for proc in self.children:
      if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)


_STOP = _Stop()


def _start(cmd: Sequence[str], **kwargs) -> subprocess.Popen:
  proc = subprocess.Popen(list(cmd), **kwargs)
  _STOP.children.append(proc)
  return proc


def launch(run: Run, config_path: str, main_cmd: Sequence[str], local_processes: int = 0,
           env: dict | None = None) -> int:
  """Runs one training job; returns its exit status (the largest over local processes)."""
  cmd = list(main_cmd) + [f"--config={config_path}:{run.arg}", f"--workdir={run.workdir}"]
  env = dict(os.environ if env is None else env)
  os.makedirs(run.workdir, exist_ok=True)
  _STOP.children = []
  if local_processes <= 1:
    return _start(cmd, env=env).wait()
  port = free_port()
  procs, logs = [], []
  try:
    for i in range(local_processes):
      penv = dict(env, JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
                  JAX_NUM_PROCESSES=str(local_processes), JAX_PROCESS_ID=str(i))
      penv["XLA_FLAGS"] = _without_fake_devices(penv.get("XLA_FLAGS", ""))
      # One CPU device each, also on a GPU machine: there every process would claim every GPU
      # (and its memory) and the second would fail at its start. JAX_PLATFORMS set wins.
      penv["JAX_PLATFORMS"] = penv.get("JAX_PLATFORMS") or "cpu"
      if i == 0:
        procs.append(_start(cmd, env=penv))
      else:  # Other processes log to the run dir, so the terminal shows one stream.
        log = open(os.path.join(run.workdir, f"process_{i}.log"), "a")
        logs.append(log)
        procs.append(_start(cmd, env=penv, stdout=log, stderr=subprocess.STDOUT))
    codes = wait_together(procs)
  except OSError:   # process i could not start: the ones started would wait 300 s for it
    for proc in procs:
      proc.kill()
      proc.wait()
    raise
  finally:
    for log in logs:
      log.close()
  return max(codes, key=abs)


SIBLING_GRACE_S = 60.0   # after one local process failed, the others' time to follow it


def wait_together(procs: Sequence[subprocess.Popen], poll_s: float = 0.2) -> list[int]:
  """The exit codes of a run's local processes. Once one fails (a nonzero code or a signal),
  the others have ``SIBLING_GRACE_S`` to follow it, then are killed and given its code: a
  process whose coordinator died (a SIGTERM before process 0 had its handler) waited
  JAX_INIT_TIMEOUT_S (300 s) for it while the sweep waited on it in turn."""
  failed_at, failure = None, 0
  while True:
    codes = [p.poll() for p in procs]
    if all(code is not None for code in codes):
      return codes
    if failed_at is None and any(code not in (None, 0) for code in codes):
      failed_at = time.monotonic()
      failure = next(code for code in codes if code not in (None, 0))
    if failed_at is not None and time.monotonic() - failed_at > SIBLING_GRACE_S:
      for p, code in zip(procs, codes):
        if code is None:
          p.kill()
          p.wait()
      return [failure if code is None else code for code in codes]
    time.sleep(poll_s)


def execute(config_path: str, runs: Sequence[Run], main_cmd: Sequence[str],
            local_processes: int = 0) -> dict[str, list[str]]:
  """Launches every unfinished run in order; never stops on a failure, stops on SIGTERM (the
  running job gets it and saves; ``outcome['stopped']`` lists the started runs left unfinished,
  ``outcome['not started']`` the others). Returns the outcome."""
  with _STOP:
    _STOP.requested = False
    return _execute(config_path, runs, main_cmd, local_processes)


def _execute(config_path, runs, main_cmd, local_processes) -> dict[str, list[str]]:
  outcome = {"skipped": [], "ok": [], "diverged": [], "failed": [], "stopped": [],
             "not started": []}
  from depthbench_jax.main import hosts_expected  # Local: defines main's flags.
  pod = local_processes <= 1 and hosts_expected() > 1
  module = load_config_module(config_path)
  suite = {run.name: config_of(module, run.arg) for run in runs}
  state = lambda run: run_state(run.workdir, suite[run.name])
  todo, launched, cut_short = [], set(), False
  for run in runs:
    (outcome["skipped"] if state(run) == "done" else todo).append(run)
  for i, run in enumerate(todo):
    if _STOP.requested:  # A SIGTERM between two runs.
      break
    print(f"[sweep] {i + 1}/{len(todo)} {run.name} ({state(run)}) -> {run.workdir}",
          flush=True)
    start = time.time()
    launched.add(run.name)
    try:
      code = launch(run, config_path, main_cmd, local_processes)
    except OSError as e:  # e.g. main_cmd not found: record and go on.
      print(f"[sweep] {run.name}: could not start: {e}", flush=True)
      code = -1
    # The summary of this launch only: a relaunched diverged run (other guard rules) keeps its
    # old diverged summary until the trainer sets it aside, so a launch that failed before
    # then read 'diverged' (exit 0 for the sweep, and the same failure hidden every time).
    summary = read_summary(run.workdir) if state(run) == "done" else None
    status = (summary or {}).get("status")
    # Saved and stopped without a SIGTERM here: on a pod another host's process was signalled
    # (JAX's preemption service stops them all) and that host's sweep stops; so does this one.
    elsewhere = code == 0 and not summary and not _STOP.requested
    _STOP.requested = _STOP.requested or elsewhere
    if _STOP.requested and not summary:
      why = ("a process of the run was preempted" if elsewhere else
             f"stopped by SIGTERM (exit {code})")
      after = ("resumes it from its checkpoint" if checkpoint_steps(run.workdir) else
               "starts it afresh (it had saved no checkpoint)")
      print(f"[sweep] {run.name}: {why}; the next sweep {after}", flush=True)
      break
    if code == HOSTS_DIFFER:  # Every later run would differ too: all hosts stop, to restart.
      outcome["failed"].append(run.name)
      print(f"[sweep] {run.name}: the hosts were given different runs, or do not share the "
            f"results dir (the error: line above says which); stopping. Restart run_sweep.sh "
            f"on every host", flush=True)
      cut_short = True
      break
    if code == -signal.SIGABRT and pod:  # JAX's coordination service gave up on a host.
      outcome["failed"].append(run.name)
      print(f"[sweep] {run.name}: the processes did not all join (or one was lost) within "
            f"JAX_INIT_TIMEOUT_S / JAX_HEARTBEAT_TIMEOUT_S; stopping, as every later run would "
            f"wait as long. Start run_sweep.sh on every host", flush=True)
      cut_short = True
      break
    # A failed exit is a failed run whatever summary.json holds: one written before the failure,
    # or another trainer's (a second sweep, refused by the workdir lock, read the summary the
    # first wrote meanwhile and printed the run both 'ok' and failed).
    if code == 0 and status in ("ok", "diverged"):
      outcome[status].append(run.name)
      result = status
    else:
      outcome["failed"].append(run.name)
      result = f"failed (exit {code}" + (f", status {status!r})" if code == 0 else ")")
      print(f"[sweep] {run.name}: {result}; continuing", flush=True)
    print(f"[sweep] {run.name}: {result} in {format_duration(time.time() - start)}", flush=True)
    if _STOP.requested:
      break
  # The job cut short (a SIGTERM, or a host error after which every run would fail: those
  # runs went uncounted, "not started 0") and those never started: the next sweep runs them.
  if _STOP.requested or cut_short:
    left = [r for r in todo if state(r) != "done" and r.name not in outcome["failed"]]
    for run in left:   # "stopped 5" once counted the 4 runs that had not started.
      begun = run.name in launched or state(run) == "partial"
      outcome["stopped" if begun else "not started"].append(run.name)
  print("[sweep] done: " + ", ".join(f"{k} {len(v)}" for k, v in outcome.items()), flush=True)
  for key in ("diverged", "failed"):
    if outcome[key]:
      print(f"[sweep] {key}: {' '.join(outcome[key])}", flush=True)
  return outcome


# ---------------------------------------------------------------------------------------------
# Best LR per (design, shape).
# ---------------------------------------------------------------------------------------------

def is_usable(record: dict) -> bool:
  """Finished, not diverged, with a finite final val loss."""
  loss = record.get("final_val_loss")
  return (record.get("status") == "ok" and isinstance(loss, (int, float))
          and math.isfinite(loss))


def shape_key(record: dict) -> tuple[str, int, int]:
  """``(design, n_layers, d_model)`` of a summary (from its own keys, else its config)."""
  model = (record.get("config") or {}).get("model", {})
  design = record.get("design") or model.get("residual", {}).get("name")
  n_layers = record.get("n_layers") or model.get("n_layers")
  d_model = record.get("d_model") or model.get("d_model")
  return str(design), int(n_layers), int(d_model)


def design_label(record: dict) -> str:
  """The design as the report tells runs apart: the residual's name, with each option the run
  set away from its design's defaults (``hc(n_streams=2)``). README's one-run example with
  ``--config.model.residual.n_streams=2`` beside the suite's HC runs joined their best-LR choice
  and depth trend as 'hc'. Options the design no longer has, and implementation switches
  (``Design.implementation_options``: mHC's Pallas Sinkhorn), are not named."""
  residual = ((record.get("config") or {}).get("model") or {}).get("residual") or {}
  name = str(record.get("design") or residual.get("name"))
  try:
    from depthbench_jax.residual import registry  # Local: pulls in jax/flax.
    design = registry.get(name)
  except Exception:  # pylint: disable=broad-except  # a design not registered here
    return name
  changed = [f"{k}={v}" for k, v in sorted(residual.items())
             if k in design.defaults and v != design.defaults[k]
             and k not in design.implementation_options]
  return f"{name}({','.join(changed)})" if changed else name


def design_name(label: str) -> str:
  """The registered design of a ``design_label``: ``hc(n_streams=2)`` -> ``hc``."""
  return label.split("(", 1)[0]


def record_lr(record: dict) -> float:
  lr = record.get("lr")
  return float(lr if lr is not None else (record.get("config") or {}).get("lr"))


def select_best_lr(records: Iterable[dict]) -> dict[tuple[str, int, int], dict]:
  """``{(design, L, d): {'best': record | None, 'runs': [...], 'excluded': [...],
  'lr_at_edge': bool, 'lr_untuned': bool, 'copies': int}}``: the lowest final val loss among
  usable runs; ``copies`` counts the usable runs at the best LR (other seeds or copies: the
  best is then their minimum, not one run's loss).

  Diverged, unfinished or non-finite runs are excluded (listed, never chosen); a group with
  none usable has ``best=None``. ``lr_at_edge`` flags a best LR at either end of the grid
  tried (the optimum may lie outside it), ``lr_untuned`` a shape tried at one LR only. The
  runs are taken as one recipe's (the report sets other recipes' aside first:
  ``report.scorecard.set_aside_other_recipes``).
  """
  groups: dict[tuple[str, int, int], dict] = {}
  for record in records:
    group = groups.setdefault(shape_key(record), {"runs": [], "excluded": []})
    group["runs"].append(record)
    if not is_usable(record):
      group["excluded"].append(record)
  for group in groups.values():
    usable = [r for r in group["runs"] if is_usable(r)]
    group["best"] = min(usable, key=lambda r: (r["final_val_loss"], record_lr(r)),
                        default=None)
    lrs = sorted({record_lr(r) for r in group["runs"]})
    group["lr_at_edge"] = bool(group["best"] is not None and len(lrs) > 1
                               and record_lr(group["best"]) in (lrs[0], lrs[-1]))
    group["lr_untuned"] = bool(group["best"] is not None and len(lrs) == 1)  # one LR tried
    group["copies"] = (sum(record_lr(r) == record_lr(group["best"]) for r in usable)
                       if group["best"] is not None else 0)
  return groups


def best_lr_runs(records: Sequence[dict]) -> list[dict]:
  """The best-LR run of every (design, shape) (``select_best_lr``), in the records' order: what
  the report's trends read, so other LRs and diverged runs do not move them."""
  best = [g["best"] for g in select_best_lr(records).values() if g["best"] is not None]
  return [r for r in records if any(r is b for b in best)]


# ---------------------------------------------------------------------------------------------
# CLI (launch/run_sweep.sh calls this).
# ---------------------------------------------------------------------------------------------

def check_launch_settings(local_processes: int, runs: Sequence[Run], configs: dict) -> None:
  """The JAX_* settings (the timeouts too, where the runs join several processes), or
  ``local_processes`` against every run's mesh and batch and against a pod's settings: one
  ConfigError here, not a failure per run."""
  from depthbench_jax.main import (  # Local: defines main's flags.
      distributed_settings, distributed_timeouts, hosts_expected, slurm_tasks)
  if local_processes > 1 or hosts_expected() > 1:
    distributed_timeouts()   # JAX_HEARTBEAT_TIMEOUT_S=abc failed every run, 'continuing'
  if local_processes <= 1:  # A bad JAX_* set fails once here, not once per run.
    distributed_settings()
  else:  # Each host would run its own local cluster, every run, into the shared run dirs.
    # JAX_PROCESS_ID too: run_sweep.sh reads it for the report's host, and a leftover id
    # of 1 skipped the report without a word (an older report.md then read as this one's).
    pod = [f"{k}={os.environ[k]}" for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES",
                                            "JAX_PROCESS_ID") if os.environ.get(k)]
    if not pod and slurm_tasks() > 1:   # README's srun launch sets no JAX_* variable
      pod = [f"an srun step of SLURM_NTASKS={slurm_tasks()}"]
    if pod:
      raise ConfigError(f"--local_processes (LOCAL_PROCESSES)={local_processes} with "
                        f"{' '.join(pod)}: it replaces them; allowed: LOCAL_PROCESSES on one "
                        f"machine, or the JAX_* variables on a pod, not both")
    for run in runs:   # its processes of one device each: once here, not a failure per run
      check_local_processes(configs[run.name], local_processes, run)


def main(argv: Sequence[str] | None = None) -> int:
  p = OneLineParser(prog="python -m depthbench_jax.sweep", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("config", nargs="?", help="suite config file, e.g. configs/suite_400m.py")
  # The spelling main.py, systems and report take; the positional is the documented one.
  p.add_argument("--config", dest="config_flag", metavar="CONFIG",
                 help="the same suite config file, as main.py/systems/report spell it")
  p.add_argument("--results_dir", default=None, help="default: results/<suite NAME>")
  p.add_argument("--dry_run", action="store_true", help="print the plan and exit")
  p.add_argument("--mfu", type=float, default=DEFAULT_MFU,
                 help="fraction of --peak_flops the plan's device-hours assume, in (0, 1]")
  p.add_argument("--peak_flops", type=float, default=DEFAULT_PEAK_FLOPS,
                 help="per-device peak FLOP/s for device-hours (default H100 bf16 dense)")
  p.add_argument("--local_processes", default=os.environ.get("LOCAL_PROCESSES") or "0",
                 help="each run as N local JAX processes (default: $LOCAL_PROCESSES, else 0)")
  p.add_argument("--main_cmd", default=f"{shlex.quote(sys.executable)} -m depthbench_jax.main",
                 help="command prefix that trains one run (gets --config and --workdir)")
  p.add_argument("--print_results_dir", action="store_true", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  try:
    if (args.config and args.config_flag and os.path.realpath(args.config)
        != os.path.realpath(args.config_flag)) or not (args.config or args.config_flag):
      raise ConfigError(f"suite config {args.config!r}, --config={args.config_flag!r}; "
                        f"allowed: one configs/*.py file, as the positional or as --config")
    args.config = args.config or args.config_flag
    if not str(args.local_processes).isdigit():
      raise ConfigError(f"--local_processes (LOCAL_PROCESSES)={args.local_processes!r}; allowed: "
                        f"a whole number, 0 or 1 for one process per run")
    args.local_processes = int(args.local_processes)
    try:   # Before any run: an unclosed quote was a traceback after every config was checked,
      main_cmd = shlex.split(args.main_cmd)   # and an empty one launched '--config=...'.
    except ValueError as err:
      main_cmd, why = [], f" ({err})"
    else:
      why = ""
    if not main_cmd:
      raise ConfigError(f"--main_cmd={args.main_cmd!r}{why}; allowed: a command that trains "
                        f"one run, e.g. 'python -m depthbench_jax.main'")
    check_device_hours_inputs(args.mfu, args.peak_flops)
    module = load_config_module(args.config)
    # An empty --results_dir= reaches check_folder, which refuses it (as run_sweep.sh does),
    # instead of standing for the default folder.
    results_dir = (os.path.join("results", suite_name(module)) if args.results_dir is None
                   else args.results_dir)
    check_folder(results_dir, f"--results_dir={results_dir}")
    if args.print_results_dir:
      print(results_dir)
      return 0
    runs = list_runs(args.config, results_dir)
    for run in runs:   # A file where a run's folder goes: a NotADirectoryError traceback.
      check_folder(run.workdir, f"run {run.name}'s folder")
    check_recipes(args.config, runs)
    for line in off_target_shapes(args.config, module):
      print(line, flush=True)
    # Every run, done or not, in the dry run too: with all done, a typo passed the sweep (exit
    # 0) and failed the dry run; and the launch settings, which the dry run passed.
    configs = {run.name: checked_config(module, run) for run in runs}
    check_launch_settings(args.local_processes, runs, configs)
    if args.dry_run:
      rows = plan_rows(args.config, runs, args.mfu, args.peak_flops, configs)
      print(f"suite {suite_name(module)} -> {results_dir}")
      print(format_plan(rows, args.mfu, args.peak_flops))
      return 0
    outcome = execute(args.config, runs, main_cmd, args.local_processes)
  except ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if _STOP.requested:   # Stopped (outcome's 'stopped' and 'not started'), not a host error.
    return 128 + signal.SIGTERM   # as if killed by it: launch/run_sweep.sh skips the report
  return 0 if not outcome["failed"] else 1


if __name__ == "__main__":
  sys.exit(main())
