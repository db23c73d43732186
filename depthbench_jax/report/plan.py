"""The sweep's plan beside what is on disk: ``report RESULTS_DIR --config=SUITE.py``.

The planned runs are ``sweep.list_runs(SUITE, RESULTS_DIR)``, the sweep's own expansion (design
x shape x LR, one workdir each), and each run's state is the one the sweep acts on
(``sweep.run_state``): ``ok`` / ``diverged`` (a summary with that final status), ``started``
(a non-empty folder without one: training, interrupted or crashed; or a run diverged under
other divergence rules than the suite's now, which the sweep trains again), ``not started``, or
``other recipe`` (trained, finished or not, with a recipe the suite no longer gives it:
``other_recipe_runs``; the report sets it aside, the sweep refuses it).
Progress is ``finished = ok + diverged`` of ``planned``; a run folder on disk that is no
planned workdir is *off plan* (a suite edited since, a copy): named, and still reported unless
it trained another recipe than the suite gives it (then set aside, and named so). A suite that
plans none of the folder's runs (another suite's ``--config``) is a warning line.
"""

from __future__ import annotations

import os
from typing import Sequence

from depthbench_jax import recipe
from depthbench_jax.errors import ConfigError
from depthbench_jax.sweep import (config_of, design_label, design_name, format_lr, list_runs,
                                  load_config_module, read_summary, run_state, trained_config)

STATES = ("ok", "diverged", "started", "not started", "other recipe")


def other_recipe_runs(config_path: str, items: Sequence[dict],
                      planned: dict[str, str] | None = None) -> dict[str, dict]:
  """``{abspath(workdir): {field: (trained value, the suite's)}}`` of the runs in ``items``
  (the report's records and runs without a summary, planned or not) that trained another
  recipe than the suite gives them now (``sweep.trained_config``). Off-plan folders were
  compared only with each other, so a copy of an old run could be reported beside nothing of
  the suite's recipe.

  A planned run (its workdir in ``planned``, ``{abspath(workdir): run argument}``) is compared
  with the suite's config for its own entry, design options included (``recipe.OWN_FIELDS``:
  only the seeds and data.path are a run's own): a 2-stream HC run in a planned HC folder is
  no run of the suite's. An off-plan run, with the suite's config for its design, shape and
  LR, its design options being its own (``recipe.RUN_FIELDS``: a variant, reported under
  ``sweep.design_label``). Implementation switches (``recipe.IMPLEMENTATION_FIELDS``) are
  resumable: no recipe either way."""
  from depthbench_jax.train import config_check
  module = load_config_module(config_path)
  planned = planned or {}
  out = {}
  for item in items:
    design, n_layers, d_model = item.get("key") or (
        item.get("design"), item.get("n_layers"), item.get("d_model"))
    design = design_name(design) if design else design   # a variant's label: its design's recipe
    lr, workdir = item.get("lr"), item.get("workdir")
    trained = trained_config(workdir) if workdir else None
    if trained is None or None in (design, n_layers, d_model, lr):
      continue
    arg = planned.get(os.path.abspath(workdir))
    own = recipe.is_own_field if arg else recipe.is_run_field
    try:
      suite = config_of(module, arg or
                        f"arch={design},shape={n_layers}x{d_model},lr={format_lr(lr)}")
    except (ConfigError, KeyError):   # a design or shape this suite cannot build
      continue
    changes = {field: (was, now) for field, was, now in config_check.recipe_changes(trained, suite)
               if not own(field)}
    if changes:
      out[os.path.abspath(workdir)] = changes
  return out


def shown_path(path: str) -> str:
  """``path`` relative to the working directory when under it (``configs/x.py``), else as is."""
  rel = os.path.relpath(path)
  return path if rel.startswith("..") else rel


def load_plan(config_path: str, results_dir: str) -> list[dict]:
  """Every planned run of the suite as ``{'name', 'design', 'arg', 'key': (label, L, d), 'lr',
  'workdir', 'state'}`` (``label``: the design as its records name it, ``_label``; the state
  on disk; the report marks 'other recipe' from its ``other_recipe_runs`` over every run
  folder, these among them). A missing file, a file that does not import, or one that is no
  suite (no ``sweep``, or entries the sweep refuses) is one ConfigError naming ``--config``."""
  where = f"--config={config_path}"
  allowed = "allowed: a suite file whose sweep() lists its runs, e.g. configs/smoke.py"
  if not os.path.isfile(config_path):
    raise ConfigError(f"{where}: no such file; {allowed}")
  if not config_path.endswith(".py"):
    raise ConfigError(f"{where}: not a Python file; {allowed}")
  try:
    runs = list_runs(config_path, results_dir)
  except ConfigError as err:
    raise ConfigError(f"{where}: {err}") from None
  except Exception as err:  # pylint: disable=broad-except  # sweep() entries that are no runs
    raise ConfigError(f"{where}: {type(err).__name__}: {err}; {allowed}") from None
  module = load_config_module(config_path)
  return [{"name": r.name, "design": r.design, "arg": r.arg,
           "key": (_label(module, r), r.shape.n_layers, r.shape.d_model), "lr": r.lr,
           "workdir": r.workdir, **_state(r.workdir, module, r.arg)} for r in runs]


def _label(module, run) -> str:
  """The run's design as its records are keyed (``sweep.design_label``): a suite that sets
  ``n_streams=2`` for HC plans ``hc(n_streams=2)`` cells, not 'hc' ones beside its results."""
  try:
    return design_label({"config": config_of(module, run.arg).to_dict()})
  except ConfigError:   # the entry no longer builds: its bare design
    return run.design


def _state(workdir: str, module, arg: str) -> dict:
  """``{'state', 'retrain'}``: the state the sweep acts on; a run diverged under other
  divergence rules than the suite now sets is 'started' (the sweep relaunches it,
  ``sweep.run_state``), not 'diverged', with ``retrain`` True (it has a summary)."""
  summary, config = read_summary(workdir), None
  diverged = (summary or {}).get("status") == "diverged"
  if diverged:   # only then does the suite's config decide
    try:
      config = config_of(module, arg)
    except ConfigError:   # the entry no longer builds: as on disk
      pass
  state = run_state(workdir, config)
  if state == "done":
    return {"state": summary["status"], "retrain": False}
  return {"state": "started" if state == "partial" else "not started",
          "retrain": diverged and state == "partial"}


def off_plan(plan: Sequence[dict], workdirs: Sequence[str], results_dir: str) -> list[str]:
  """The run folders in ``workdirs`` that are no planned workdir, as paths under
  ``results_dir`` (the sweep's own test: a folder of another name is not the run it plans)."""
  planned = {os.path.realpath(p["workdir"]) for p in plan}
  base = os.path.realpath(results_dir)
  return sorted({os.path.relpath(os.path.realpath(w), base) for w in workdirs
                 if os.path.realpath(w) not in planned})


def progress_markdown(plan: Sequence[dict], config_path: str,
                      extra: Sequence[str] = (), extra_aside: Sequence[str] = ()) -> str:
  """The plan's progress: one line of totals, a table per design (registry order as the plan
  lists them), and the off-plan line for the names in ``extra`` (reported) and ``extra_aside``
  (of another recipe than the suite gives them: set aside)."""
  shown = shown_path(config_path)
  count = lambda runs, *states: sum(r["state"] in states for r in runs)
  finished = count(plan, "ok", "diverged")
  retrain = sum(bool(r.get("retrain")) for r in plan)
  started = count(plan, "started") - retrain
  lines = [f"Plan ({shown}): **{finished} of {len(plan)} planned runs finished** "
           f"({count(plan, 'ok')} ok, {count(plan, 'diverged')} diverged); "
           f"{started} started without a summary (training, interrupted or crashed); "
           + (f"{retrain} diverged under other divergence rules than the suite's now (the "
              f"sweep trains them again); " if retrain else "")
           + f"{count(plan, 'not started')} not started."
           + (f" {count(plan, 'other recipe')} trained with another recipe than the suite's "
              f"now (set aside; the sweep refuses them)." if count(plan, "other recipe") else "")]
  designs = list(dict.fromkeys(r["design"] for r in plan))
  if designs:
    lines += ["", "| design | finished | ok | diverged | started, unfinished | not started | "
              "other recipe |", "|---|---|---|---|---|---|---|"]
    for design in designs:
      runs = [r for r in plan if r["design"] == design]
      lines.append(f"| {design} | {count(runs, 'ok', 'diverged')} of {len(runs)} | "
                   + " | ".join(str(count(runs, s)) for s in STATES) + " |")
  notes = [f"Not in {shown} (on disk, still reported): {', '.join(extra)}."] if extra else []
  notes += ([f"Not in {shown}, and of another recipe than it gives them (set aside below): "
             f"{', '.join(extra_aside)}."] if extra_aside else [])
  if notes:
    lines += ["", " ".join(notes)]
  return "\n".join(lines)
