"""``python -m depthbench_jax.evaluate --workdir=RUN_DIR``: domain evals of a finished run.

Restores the run's latest (or ``--step``) params and, for each eval set found under
``--eval_data_dir`` (else ``config.evals.data_dir`` when set, else
``~/.cache/depthbench_jax/evals``; formats in
``evals/datasets.py``), computes the teacher-forced NLL of the reference answers and the set's
task score (``evals/tasks.py``). Writes ``RUN_DIR/evals.json`` and scalars
``evals/<set>/<metric>`` and ``evals/<domain>/nll_per_token`` to ``RUN_DIR/tensorboard`` (unless
the run's ``config.tensorboard`` is False).
Sets whose file is missing are skipped and listed under ``missing`` with the message saying
where to put them (``--strict`` makes that an error). ``--export_hf`` also writes a Hugging Face
checkpoint (Pre-LN family) to ``RUN_DIR/hf``. ``--out=PATH`` writes ``PATH`` (its scalars to
``tensorboard/`` and the export to ``hf/`` beside it, or ``tensorboard/<stem>`` and
``<stem>_hf/`` unless PATH is an ``evals.json``: ``beside``) instead. An existing file whose
``options`` differ in what decides the numbers (``RESULT_OPTIONS``), or that was made at a later
checkpoint than ``--step``, is replaced only with ``--overwrite``, so a debug rerun never
silently replaces a finished evaluation.

``evals.json``::

  {"step", "name", "design", "n_layers", "tokenizer", "workdir",
   "options": {"sets", "eval_data_dir", "max_examples", "generate", "max_new_tokens",
               "timeout_s", "score_len", "batch_size"},
   "sets": {set: {"domain", "kind", "file", "examples_sha1", "n", "tokens", "context_cut",
                  "answer_cut", "nll_per_token", "nll_per_example", "time_s",
                  "per_example": [{"id", "nll", "tokens"}], + "acc"/"acc_norm" (mc),
                  "exact_match" (math), "pass@1"/"timeouts" (code), "samples"}},
   "domains": {domain: {"nll_per_token": mean over the domain's sets, "sets": [...],
                        "examples_sha1": {set: its examples' fingerprint}}},
   "missing": {set: message}}
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Sequence

# allow_override: diagnose.py and evaluate.py share flag names and may be imported together.
from absl import app, flags, logging

from depthbench_jax.errors import ConfigError, absl_flags_parser, fail, quiet_logs
from depthbench_jax.evals import datasets

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory with config.json and checkpoints/.",
                               allow_override=True)
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).",
                              allow_override=True)
_DATA_DIR = flags.DEFINE_string("eval_data_dir", None,
                                "Root of the eval sets (<dir>/<set>/<file>); default: the "
                                "run's config.evals.data_dir, else "
                                "~/.cache/depthbench_jax/evals.")
_SETS = flags.DEFINE_list("sets", list(datasets.SETS), "Eval sets to run.")
_MAX_EXAMPLES = flags.DEFINE_integer("max_examples", None, "First N examples of each set.")
_GENERATE = flags.DEFINE_bool("generate", True,
                              "Greedy generation + exact match / pass@1 (NLL and mc always run).")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 256, "Generation budget per example.")
_BATCH = flags.DEFINE_integer("batch_size", 8, "Rows per model call.", allow_override=True)
_TIMEOUT = flags.DEFINE_float("timeout_s", 10.0, "Sandbox timeout per program.")
_STRICT = flags.DEFINE_bool("strict", False, "Fail when a set's file is missing.")
_EXPORT = flags.DEFINE_bool("export_hf", False, "Also export a Hugging Face checkpoint "
                            "(Pre-LN family only): RUN_DIR/hf, or beside --out (evaluate.beside).")
_OUT = flags.DEFINE_string("out", None, "Result file (default RUN_DIR/evals.json); its scalars "
                           "go to tensorboard/ beside it, or tensorboard/<stem> for another "
                           "name than evals.json.", allow_override=True)
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace --out even when it was made with "
                               "other settings.", allow_override=True)
for _name, _ok, _allowed in (
    ("max_examples", lambda n: n is None or n >= 1, "an integer >= 1 (or unset: every example)"),
    ("max_new_tokens", lambda n: n >= 1, "an integer >= 1"),
    ("batch_size", lambda n: n >= 1, "an integer >= 1"),
    ("timeout_s", lambda t: t > 0, "seconds > 0")):
  flags.register_validator(_name, _ok, message=f"allowed: {_allowed}")
USAGE = ("python -m depthbench_jax.evaluate --workdir=RUN_DIR [--step=N] [--sets=a,b] "
         "[--eval_data_dir=DIR] [--max_examples=N] [--strict] [--export_hf] [--out=PATH] "
         "[--overwrite] ...")
# The options that decide the numbers (batch_size only groups the rows).
RESULT_OPTIONS = ("sets", "eval_data_dir", "max_examples", "generate", "max_new_tokens",
                  "timeout_s", "score_len")


def domain_means(sets: dict) -> dict:
  """Per domain: the unweighted mean over its evaluated sets of ``nll_per_token``."""
  out = {}
  for domain, names in datasets.DOMAINS.items():
    found = [n for n in names if n in sets]
    if found:
      out[domain] = {"nll_per_token": sum(sets[n]["nll_per_token"] for n in found) / len(found),
                     "sets": found,
                     "examples_sha1": {n: sets[n].get("examples_sha1") for n in found}}
  return out


def check_sets(sets: Sequence[str]) -> None:
  """One ``ConfigError`` naming every requested set that is not an eval set, and the allowed."""
  unknown = [s for s in sets if s not in datasets.SETS]
  if unknown or not sets:
    raise ConfigError(f"--sets: {f'unknown {unknown}' if unknown else 'empty'}; allowed: "
                      f"{', '.join(datasets.SETS)}")


def check_found(sets: Sequence[str], data_dir: str | None, strict: bool,
                max_examples: int | None = None) -> list[str]:
  """The requested sets whose files are found; one ``ConfigError`` when none is, or
  (``strict``) any one is not; it says where each missing file goes. A found file with no
  example, or a record lacking the published fields, is one too (the records ``evaluate`` will
  read, ``max_examples`` as it is given: only the first was once, so record 1 was a ValueError
  traceback after the sets before it had been scored, and no evals.json)."""
  missing = {}
  for name in sets:
    try:
      datasets.load_set(name, data_dir, max_examples=max_examples)
    except datasets.MissingEvalSet as e:
      missing[name] = str(e)
    except ValueError as e:
      raise ConfigError(f"--sets: {e}; allowed: the set's published file, or --sets without "
                        f"{name}") from None
  if missing and (strict or len(missing) == len(sets)):
    flag = "--strict" if strict else f"--sets={','.join(sets)}"
    raise ConfigError(f"{flag}: {', '.join(missing)} not found; allowed: sets whose files are "
                      f"present. {' '.join(missing.values())}")
  return [name for name in sets if name not in missing]


def evaluate(model_cfg, params, tokenizer, *, sets: Sequence[str] = tuple(datasets.SETS),
             data_dir: str | None = None, max_examples: int | None = None,
             generate: bool = True, max_new_tokens: int = 256, batch_size: int = 8,
             timeout_s: float = 10.0, strict: bool = False,
             score_len: int | None = None) -> dict[str, Any]:
  """Every requested set that is found: ``{'sets', 'domains', 'missing'}`` (see module doc).

  ``score_len``: the most positions the NLL and multiple-choice scores feed the model; a
  scored sequence (context + answer) has up to ``score_len + 1`` tokens, as a training row of
  ``seq_len + 1`` tokens fills ``seq_len`` positions (a longer context keeps its last tokens);
  ``None`` = ``model_cfg.max_seq_len``. The CLI passes the run's training context
  ``config.data.seq_len``, so no scored position lies beyond the positions the model trained
  at, and none within them is cut. Generation keeps ``max_seq_len``.
  """
  from depthbench_jax.evals import tasks  # pylint: disable=g-import-not-at-top

  check_sets(sets)
  results, missing = {}, {}
  for name in sets:
    try:
      examples = datasets.load_set(name, data_dir, max_examples)
    except datasets.MissingEvalSet as e:
      if strict:
        raise
      missing[name] = str(e)
      logging.warning("%s", e)
      continue
    t0 = time.perf_counter()
    results[name] = tasks.evaluate_set(
        name, model_cfg, params, tokenizer, examples, generate=generate,
        max_new_tokens=max_new_tokens, batch_size=batch_size, timeout_s=timeout_s,
        score_len=(score_len or model_cfg.max_seq_len) + 1)  # tokens: one past the positions
    results[name]["time_s"] = time.perf_counter() - t0
    # Which file and examples: GPQA diamond and main are both 'gpqa' (the first file found),
    # and the report compares depths only over the same examples.
    results[name]["file"] = datasets.find_file(name, data_dir)
    results[name]["examples_sha1"] = datasets.examples_fingerprint(examples)
    logging.info("%s: %s", name, {k: v for k, v in results[name].items()
                                  if isinstance(v, (int, float))})
  if not results:
    raise FileNotFoundError("no eval set found:\n" + "\n".join(missing.values()))
  return {"sets": results, "domains": domain_means(results), "missing": missing}


def scalars(evals: dict) -> dict[str, float]:
  """Flat ``evals/<set>/<metric>`` and ``evals/<domain>/nll_per_token`` scalars."""
  out = {}
  for name, res in evals["sets"].items():
    for k, v in res.items():
      if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "time_s":
        out[f"evals/{name}/{k}"] = float(v)
  for domain, res in evals["domains"].items():
    out[f"evals/{domain}/nll_per_token"] = res["nll_per_token"]
  return out


def beside(path: str, name: str) -> str:
  """Where a side output of the result at ``path`` goes: ``name`` beside an ``evals.json``,
  else ``name/<stem>`` (TensorBoard) or ``<stem>_name`` (a folder of its own). A debug ``--out``
  inside the run wrote its scalars into the run's own TensorBoard at the same step, and
  ``--export_hf`` replaced the run's ``hf/`` wherever ``--out`` pointed."""
  folder = os.path.dirname(os.path.abspath(path))
  stem = os.path.splitext(os.path.basename(path))[0]
  if stem == "evals":
    return os.path.join(folder, name)
  return os.path.join(folder, name, stem) if name == "tensorboard" else os.path.join(
      folder, f"{stem}_{name}")


def write_evals(workdir: str, evals: dict, step: int, path: str | None = None,
                tensorboard: bool = True) -> str:
  """``evals`` to ``path`` (default ``workdir/evals.json``), its scalars to ``tensorboard/``
  beside it when ``tensorboard`` (the run's ``config.tensorboard``: clu's writer imports
  TensorFlow, which a run without TensorBoard never needs)."""
  from depthbench_jax.train import summary  # pylint: disable=g-import-not-at-top

  path = path or os.path.join(workdir, "evals.json")
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  summary.atomic_write_json(path, evals)
  if not tensorboard:
    return path
  from clu import metric_writers  # pylint: disable=g-import-not-at-top
  writer = metric_writers.create_default_writer(beside(path, "tensorboard"), asynchronous=False)
  writer.write_scalars(step, scalars(evals))
  writer.flush()
  writer.close()
  return path


def main(argv):
  del argv
  quiet_logs()
  from depthbench_jax.data.tokenizer import get_tokenizer  # pylint: disable=g-import-not-at-top
  from depthbench_jax.model import hf  # pylint: disable=g-import-not-at-top
  from depthbench_jax.model.config import model_config_from  # pylint: disable=g-import-not-at-top
  from depthbench_jax.train import checkpoint, summary  # pylint: disable=g-import-not-at-top

  workdir = _WORKDIR.value
  out = _OUT.value or os.path.join(workdir, "evals.json")
  # Once each: '--sets=gsm8k,gsm8k' without the file passed check_found (1 missing of 2), then
  # raised FileNotFoundError after the restore; with it, gsm8k was scored twice.
  sets = list(dict.fromkeys(_SETS.value))
  try:
    check_sets(sets)  # Before the checkpoint loads.
    config, params, step = checkpoint.restore_run(workdir, _STEP.value)
    model_cfg = model_config_from(config.model)
    if _EXPORT.value:  # Before any compute, naming the flag (the run's design is no choice).
      try:
        hf.check_exportable(model_cfg)
      except ConfigError as err:
        raise ConfigError(f"--export_hf: the run's {err}, or no --export_hf") from None
      # setup.py's test extra: without it every set was scored, then the export's import failed.
      missing = hf.missing_packages()
      if missing:
        raise ConfigError(f"--export_hf: needs {' and '.join(missing)}, not installed; allowed: "
                          f"pip install -e '.[test]' (launch/bootstrap.sh installs it), or no "
                          f"--export_hf")
    # --eval_data_dir, else the run's config.evals.data_dir (when set), else the default.
    # A leading '~' is the home dir, as in config.data.path (the shell leaves '--x=~/e' alone).
    data_dir = os.path.expanduser(_DATA_DIR.value or config.evals.data_dir or "") or None
    if data_dir and not os.path.isdir(data_dir):  # a typo read the wheel's HumanEval alone
      where = "--eval_data_dir" if _DATA_DIR.value else "config.evals.data_dir (the run's)"
      raise ConfigError(f"{where}={data_dir}: no such directory; allowed: the folder holding "
                        f"the eval sets (README: Data and eval sets), or --eval_data_dir")
    found = check_found(sets, data_dir, _STRICT.value, _MAX_EXAMPLES.value)
    can_generate = any(datasets.SETS[n].kind != "mc" for n in found)
    generates = _GENERATE.value and can_generate
    if generates and _MAX_NEW.value >= model_cfg.max_seq_len:   # else a traceback after a set
      raise ConfigError(f"--max_new_tokens={_MAX_NEW.value} leaves no room for a prompt in the "
                        f"model's config.model.max_seq_len={model_cfg.max_seq_len}; allowed: "
                        f"below {model_cfg.max_seq_len}, or --generate=false")
    # The sets found, not those asked: a rerun where two files had gone replaced a six-set
    # result with a four-set one of the same options.
    options = {"sets": sorted(set(found)),
               "eval_data_dir": os.path.abspath(data_dir or datasets.default_data_dir()),
               "max_examples": _MAX_EXAMPLES.value, "generate": _GENERATE.value,
               "max_new_tokens": _MAX_NEW.value, "batch_size": _BATCH.value,
               "timeout_s": _TIMEOUT.value, "score_len": int(config.data.seq_len)}
    # Deciding: generate where a found set can generate, max_new_tokens where one does (a
    # --generate=false rerun was refused for an earlier one's; a sciq-only rerun for its
    # generate), and the sandbox's timeout where code runs (a 3 s program passes at 10 s,
    # fails at 1 s).
    runs_code = generates and any(datasets.SETS[n].kind == "code" for n in found)
    deciding = [k for k in RESULT_OPTIONS
                if (can_generate or k != "generate") and (generates or k != "max_new_tokens")
                and (runs_code or k != "timeout_s")]
    def recorded(result: dict) -> dict:
      """A result of fewer sets, each found now, is replaced by this fuller one when its other
      recorded options agree (``generate`` and the rest as recorded, even where its sets could
      not use them): a file added after a run that lacked it is scored without --overwrite."""
      had = summary.recorded_options(result)
      if isinstance(had.get("sets"), list) and set(had["sets"]) <= set(found):
        had = {**had, "sets": options["sets"]}
      return had
    summary.check_replaceable(  # Before the tokenizer and model: a finished result is never lost.
        out, {k: options[k] for k in deciding}, _OVERWRITE.value,
        lambda key: "config.data.seq_len" if key == "score_len" else f"--{key}",
        recorded=recorded, step=step, workdir=workdir, kind=("evals", "domains"))
    # The run's own tokenizer (its BPE file, from openai-whisper, may be missing on this host).
    tokenizer = get_tokenizer(config.data.tokenizer)
  except ConfigError as err:
    fail(str(err))
  evals = evaluate(model_cfg, params, tokenizer, sets=sets, data_dir=data_dir,
                   max_examples=_MAX_EXAMPLES.value, generate=_GENERATE.value,
                   max_new_tokens=_MAX_NEW.value, batch_size=_BATCH.value,
                   timeout_s=_TIMEOUT.value, strict=_STRICT.value,
                   score_len=int(config.data.seq_len))
  evals.update(step=step, name=config.name, design=model_cfg.design,
               n_layers=model_cfg.n_layers, tokenizer=tokenizer.name, options=options,
               workdir=os.path.abspath(workdir))   # which run it holds (names repeat)
  path = write_evals(workdir, evals, int(step or 0), out, config.tensorboard)
  if _EXPORT.value:
    hf_dir = hf.export_hf(params, model_cfg, beside(path, "hf"), tokenizer=tokenizer,
                          step=step)  # depthbench_export.json says which checkpoint it holds
    logging.info("exported Hugging Face checkpoint to %s", hf_dir)
  logging.info("wrote %s", path)
  scored = ", ".join(
      f"{name} {r['n']} examples" + (f" ({r['context_cut']} cut to the window)"
                                    if r.get("context_cut") else "")
      for name, r in evals["sets"].items())
  print(f"evals at step {step} -> {path}: NLL per token by domain (the JSON line below) over "
        f"{scored}", file=sys.stderr)
  print(json.dumps({d: round(v["nll_per_token"], 4) for d, v in evals["domains"].items()}))


if __name__ == "__main__":
  flags.mark_flags_as_required(["workdir"])
  app.run(main, flags_parser=absl_flags_parser(USAGE))
