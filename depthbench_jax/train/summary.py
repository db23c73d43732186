"""The run directory's records: ``config.json``, ``metrics.jsonl``, ``summary.json``, and which
checkpoint steps ``checkpoints/`` holds; ``check_replaceable`` guards the post-hoc results
(``evals.json``, ``diagnostics.json``) against a rerun with other settings.

``summary.json`` is the one results format training, diagnostics, evals, systems and reports
read (keys in DEVELOPERS.md). Writes are atomic (temp file + rename) so a kill never leaves a
half-written summary that a sweep would mistake for a finished run.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Callable

from depthbench_jax.errors import ConfigError

SUMMARY = "summary.json"
CONFIG = "config.json"
METRICS = "metrics.jsonl"
STATUS = "status.json"
CHECKPOINTS = "checkpoints"


def atomic_write_text(path: str, text: str) -> None:
  tmp = f"{path}.tmp.{os.getpid()}"
  try:
    with open(tmp, "w") as f:
      f.write(text)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):  # A write that raised: no half-written file left beside the record.
      os.remove(tmp)


def atomic_write_json(path: str, obj: Any, *, indent: int = 2, sort_keys: bool = True) -> None:
  """``obj`` as JSON at ``path``, whole or not at all: serialised first, then written beside the
  file and renamed over it, so a failure (or a kill) mid-write keeps the file it would replace."""
  atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys, default=str))


def read_json(path: str) -> Any:
  with open(path) as f:
    return json.load(f)


def recorded_options(result: dict) -> dict:
  """The settings a post-hoc result records under ``options`` ({} for older code)."""
  return result.get("options") or {}


def check_folder(path: str, name: str) -> None:
  """One ``ConfigError`` when ``path``, a folder a tool writes into (made if missing), or the
  nearest of its parents that exists is a file: caught before any compute, not a
  FileExistsError/NotADirectoryError traceback at the write. An empty ``path`` is refused too
  (``--workdir=`` passed as the cwd, then os.makedirs('') raised FileNotFoundError)."""
  if not path:
    raise ConfigError(f"{name}: empty; allowed: a folder path (made if missing)")
  probe = os.path.abspath(path)
  while not os.path.exists(probe) and os.path.dirname(probe) != probe:
    probe = os.path.dirname(probe)
  if not os.path.isdir(probe):
    raise ConfigError(f"{name}: {probe} is a file; allowed: a folder there (made if missing)")


def check_run_folder(workdir: str) -> None:
  """One ``ConfigError`` when ``workdir`` is a sweep's results folder, not a run's: no run files
  of its own (``config.json``, ``checkpoints/``) but run folders in it (a ``summary.json`` or
  ``config.json`` one level down) or a ``report.md``. A run trained there wrote its files beside
  the sweep's runs, and the report then skipped it without a word."""
  if not os.path.isdir(workdir) or any(
      os.path.exists(os.path.join(workdir, f)) for f in (CONFIG, "checkpoints")):
    return
  runs = sorted(name for name in os.listdir(workdir)
                if any(os.path.isfile(os.path.join(workdir, name, f)) for f in (SUMMARY, CONFIG)))
  if runs or os.path.isfile(os.path.join(workdir, "report.md")):
    held = f"{len(runs)} run folders ({', '.join(runs[:2])}{', ...' if len(runs) > 2 else ''})"
    raise ConfigError(
        f"--workdir={workdir} is a results folder: it holds "
        f"{held if runs else 'a report.md'} and no run of its own; allowed: a run's own "
        f"folder, e.g. {os.path.join(workdir, '<run name>')}")


def check_replaceable(path: str, settings: dict, overwrite: bool,
                      flag: Callable[[str], str] = "--{}".format,
                      recorded: Callable[[dict], dict] = recorded_options,
                      step: int | None = None, workdir: str | None = None,
                      rounds: tuple[int, Callable[[dict], Any]] | None = None,
                      kind: tuple[str, str] | None = None) -> None:
  """Raises one ``ConfigError`` when ``path`` holds a result whose ``recorded(result)`` settings
  differ from ``settings`` (the values that decide its numbers; ``flag(key)`` is how the user
  sets one): a debug rerun (fewer examples, other designs, other thresholds) would silently
  replace a finished result with a lesser one. So does one of an earlier checkpoint ``step``
  than the result's own (``--step=100`` over the final step's evals.json). The same settings
  (a rerun, a later checkpoint, more rounds) or ``overwrite`` replace it; a key the file does
  not record (older code, or a file ``recorded`` cannot read) counts as different. With
  ``workdir``, a result of another run (its recorded ``workdir``; a debug ``--out`` reused for
  a second run replaced the first's without a word) is refused too; one that records none is
  not. With ``rounds`` ``(asked, read)``, a timing of fewer rounds than ``read(result)`` is
  refused too (``--rounds=1`` over the committed 7-round bench: a noisier result, and an IQR of
  one round). With ``kind`` ``(what, key)``, a JSON object without ``key`` is another tool's
  result (``diagnose --out=RUN/evals.json``: the refusal named ten ``--set=`` flags the user
  never gave, against evaluate's settings). One check for every tool that writes a result:
  evaluate, diagnose, systems, bench and decode_bench."""
  if os.path.isdir(path):
    raise ConfigError(f"{path} is a directory; allowed: a file path for the result (--out)")
  check_folder(os.path.dirname(os.path.abspath(path)), f"--out={path}")
  if overwrite or not os.path.exists(path):
    return
  try:
    result = read_json(path)
    before = recorded(result)
  except (ValueError, AttributeError, KeyError, TypeError, IndexError):  # Not such a result.
    result, before = {}, {}
  if kind is not None and isinstance(result, dict) and result and kind[1] not in result:
    raise ConfigError(
        f"--out={path} holds no {kind[0]} result ({kind[1]!r} not in it: another tool's?), "
        f"which this run would replace; allowed: another --out, or --overwrite")
  made_at = result.get("step") if isinstance(result, dict) else None
  made_of = result.get("workdir") if isinstance(result, dict) else None
  # A file in the run's own folder is its own result, wherever the folder was first trained
  # (copied, moved, or reached through a link: each refused as 'another run' once).
  if (workdir and made_of and os.path.realpath(made_of) != os.path.realpath(workdir)
      and os.path.realpath(os.path.dirname(os.path.abspath(path))) != os.path.realpath(workdir)):
    raise ConfigError(
        f"--workdir={workdir}: {path} holds the result of another run ({made_of}), which this "
        f"run would replace; allowed: another --out, or --overwrite")
  if step is not None and isinstance(made_at, int) and step < made_at:
    raise ConfigError(
        f"checkpoint step {step} (--step, else the latest): {path} holds the result of the "
        f"later step {made_at}, which this run would replace; allowed: --out to write this "
        f"result elsewhere, or --overwrite")
  if rounds is not None:
    try:
      had = rounds[1](result)
    except (KeyError, TypeError, AttributeError):
      had = None
    if isinstance(had, int) and rounds[0] < had:
      raise ConfigError(
          f"--rounds={rounds[0]}: {path} holds a result of {had} rounds, which this run would "
          f"replace with a noisier one; allowed: --rounds >= {had}, another --out, or "
          f"--overwrite")
  asked = json.loads(json.dumps(settings))  # Tuples as lists, as the file holds them.
  changed = [k for k in asked if k not in before or before[k] != asked[k]]
  if not changed:
    return
  there = lambda k: json.dumps(before[k]) if k in before else "(not recorded)"
  made = (f"made with {', '.join(f'{k}={there(k)}' for k in changed)}" if before else
          "that records no settings (older code)")
  raise ConfigError(
      f"{', '.join(f'{flag(k)}={json.dumps(asked[k])}' for k in changed)}: {path} holds a "
      f"result {made}, which this run would replace; allowed: the same settings, --overwrite "
      f"to replace it, or another --out to write this result elsewhere")


def checkpoint_steps(workdir: str) -> list[int]:
  """The steps of ``workdir``'s complete checkpoints, ascending ([] with none). Orbax finalises a
  step by renaming its temporary directory (which carries a suffix) to the bare step number, so
  only all-digit names count. Reads the directory alone: no orbax, no jax."""
  try:
    names = os.listdir(os.path.join(workdir, CHECKPOINTS))
  except (FileNotFoundError, NotADirectoryError):   # none, or a file where a folder goes
    return []
  return sorted(int(name) for name in names if name.isdigit())


def write_config(workdir: str, config) -> None:
  atomic_write_json(os.path.join(workdir, CONFIG), config.to_dict())


def run_name(config, model_cfg) -> str:
  return config.get("name") or f"{model_cfg.design}_{model_cfg.n_layers}x{model_cfg.d_model}"


def build(config, model_cfg, counts, *, steps, tokens, final_train_loss, final_val_loss,
          wall_time_s, status, guard=None, last_checkpoint_step=None, code=None,
          cost: dict | None = None) -> dict:
  """The run's ``summary.json``; ``code``: ``revision.history`` of its sessions' commits;
  ``cost``: ``device_hours`` (every session's wall time x its device count, the measured
  cost the systems table sets beside its analytic one), and this session's ``devices`` and
  ``device_kind``. A diverged run has no final losses (None): the last ones a session saw
  were from before the divergence and depended on where it was last resumed; its curve is in
  metrics.jsonl."""
  out = {
      "name": run_name(config, model_cfg),
      "design": model_cfg.design,
      "n_layers": model_cfg.n_layers,
      "d_model": model_cfg.d_model,
      "aspect_ratio": model_cfg.d_model / model_cfg.n_layers,
      "lr": config.lr,
      "config": config.to_dict(),
      "params_total": counts["total"],
      "params_non_embedding": counts["non_embedding"],
      "steps": steps,
      "tokens": tokens,
      "final_train_loss": final_train_loss,
      "final_val_loss": final_val_loss,
      "wall_time_s": wall_time_s,
      "status": status,
      "diverged_step": None,
      "diverged_reason": None,
      "skipped_steps": guard.skipped if guard is not None else 0,
      "max_grad_norm": guard.max_grad_norm if guard is not None else None,
      "max_grad_norm_step": guard.max_grad_norm_step if guard is not None else None,
      "last_checkpoint_step": last_checkpoint_step,
      "code": list(code or []),
      **(cost or {}),
  }
  if guard is not None and guard.reason:
    out["status"] = "diverged"
    out["diverged_step"], out["diverged_reason"] = guard.step, guard.reason
    out["final_train_loss"] = out["final_val_loss"] = None
  return out


def step_mark(summary: dict, result: dict) -> str:
  """``' (step 500 of 7770)'`` when a post-hoc result (diagnostics.json, evals.json) was made at
  another checkpoint than the run's last step (``summary['steps']``), else ``''``."""
  step, steps = result.get("step"), summary.get("steps")
  if isinstance(step, int) and isinstance(steps, int) and step != steps:
    return f" (step {step} of {steps})"
  return ""


def write(workdir: str, result: dict) -> None:
  atomic_write_json(os.path.join(workdir, SUMMARY), result)


def previous_name(name: str) -> str:
  """``summary.json`` -> ``summary.previous.json``: where ``set_aside_earlier`` moves it."""
  return name[:-len(".json")] + ".previous.json"


def set_aside_earlier(workdir: str) -> None:
  """Moves an earlier session's ``summary.json`` and ``status.json`` to ``*.previous.json``
  before a session trains on (a diverged run resumed under other divergence rules): the sweep
  counts a run with a final summary as done, so a session stopped before writing its own left
  the run 'diverged at step X', skipped for good while its checkpoints went past X."""
  for name in (SUMMARY, STATUS):
    path = os.path.join(workdir, name)
    if os.path.exists(path):
      os.replace(path, os.path.join(workdir, previous_name(name)))


def restore_earlier(workdir: str) -> None:
  """``set_aside_earlier`` undone: ``*.previous.json`` back to ``summary.json`` and
  ``status.json`` (a run diverged under the rules it is run with again, after a session under
  other rules set them aside and stopped before writing its own)."""
  for name in (SUMMARY, STATUS):
    earlier = os.path.join(workdir, previous_name(name))
    if os.path.exists(earlier):
      os.replace(earlier, os.path.join(workdir, name))


def write_status(workdir: str, status: str, step: int, reason: str) -> None:
  """Records a divergence as it happens (the final summary repeats it)."""
  atomic_write_json(os.path.join(workdir, STATUS),
                    {"status": status, "step": step, "reason": reason})


class DivergenceGuard:
  """Marks a run diverged on a non-finite loss or gradient, or a loss spike.

  The loop feeds it every step's metrics (``check_steps``, batched between the steps where it
  logs or checkpoints), so the first bad step is found exactly and no checkpoint is written
  past it. Spike: from step ``divergence.min_steps`` on, a loss above ``spike_factor`` times
  the best loss so far (``spike_factor`` <= 0 disables it). With ``skip_nonfinite_steps`` the
  train step already left the state untouched on a non-finite step; those are counted
  (``skipped``) and only more than ``divergence.max_skipped_steps`` in a row are a divergence.
  """

  def __init__(self, config):
    div = config.divergence
    self.spike_factor = float(div.spike_factor)
    self.min_steps = int(div.min_steps)
    self.max_skipped = int(div.max_skipped_steps)
    self.skip_nonfinite = bool(config.skip_nonfinite_steps)
    self.best = math.inf
    self.skipped, self._skipped_in_row = 0, 0
    self.reason, self.step = None, None
    # The largest finite gradient norm before clipping, and its step: a gradient explosion that
    # clipping absorbs (DepthBench's HC at its widest 500M shape) stops nothing, so it is kept.
    self.max_grad_norm, self.max_grad_norm_step = None, None

  def progress(self) -> dict:
    """What a checkpoint keeps of the guard, so a resumed run judges spikes against the best
    loss before the interruption, counts every skipped step, and goes on counting a run of
    skipped steps that the checkpoint fell inside (``max_skipped_steps`` is per run of them)."""
    return {"best_loss": self.best if math.isfinite(self.best) else None,
            "skipped_steps": self.skipped, "skipped_in_row": self._skipped_in_row,
            "max_grad_norm": self.max_grad_norm, "max_grad_norm_step": self.max_grad_norm_step}

  def resume(self, progress: dict) -> None:
    best = progress.get("best_loss")
    self.best = math.inf if best is None else float(best)
    self.skipped = int(progress.get("skipped_steps") or 0)
    self._skipped_in_row = int(progress.get("skipped_in_row") or 0)
    self.max_grad_norm = progress.get("max_grad_norm")
    self.max_grad_norm_step = progress.get("max_grad_norm_step")

  def check(self, step: int, loss: float, grad_norm: float) -> str | None:
    if self.reason:
      return self.reason
    if math.isfinite(grad_norm) and (self.max_grad_norm is None
                                     or grad_norm > self.max_grad_norm):
      self.max_grad_norm, self.max_grad_norm_step = float(grad_norm), step
    finite = math.isfinite(loss) and math.isfinite(grad_norm)
    if not finite and self.skip_nonfinite:
      self.skipped += 1
      self._skipped_in_row += 1
      if self._skipped_in_row <= self.max_skipped:
        return None
      self.reason = (f"non-finite loss or gradient on more than divergence.max_skipped_steps="
                     f"{self.max_skipped} steps in a row (last: loss {loss}, gradient norm "
                     f"{grad_norm})")
    elif not math.isfinite(loss):
      self.reason = f"non-finite loss ({loss})"
    elif not math.isfinite(grad_norm):
      self.reason = f"non-finite gradient norm ({grad_norm})"
    elif (self.spike_factor > 0 and step >= self.min_steps
          and loss > self.spike_factor * self.best):
      self.reason = (f"loss spike: {loss:.4f} > {self.spike_factor} x best {self.best:.4f}")
    if self.reason:
      self.step = step
      return self.reason
    self._skipped_in_row = 0
    self.best = min(self.best, loss)
    return None

  def check_steps(self, records) -> str | None:
    """``records``: ``[(step, {'loss', 'grad_norm', ...})]`` on the host, in step order."""
    for step, m in records:
      if self.check(step, float(m["loss"]), float(m["grad_norm"])):
        return self.reason
    return None


class MetricsLog:
  """Appends one JSON line per logged step; a resumed run may repeat steps after its last
  checkpoint, and ``read_metrics`` keeps the resumed session's records from there on
  (``start_session``'s line says where it starts)."""

  def __init__(self, workdir: str, enabled: bool = True):
    self.path = os.path.join(workdir, METRICS)
    self.enabled = enabled
    if enabled:
      self._end_torn_line()

  def _end_torn_line(self) -> None:
    """A kill mid-write leaves a last line without its newline: end it, so the next record
    starts a line of its own instead of being glued onto the torn one (and skipped with it)."""
    try:
      with open(self.path, "rb+") as f:
        if f.seek(0, os.SEEK_END) == 0:
          return
        f.seek(-1, os.SEEK_END)
        if f.read(1) != b"\n":
          f.write(b"\n")
    except FileNotFoundError:
      pass

  def start_session(self, step: int) -> None:
    """``{"step": step, "session_from": step}``: the records of an abandoned session after
    ``step`` (the checkpoint this one starts from) are no longer the run's. Without it only a
    step going back said so: a session resumed at 500 under a larger log_every, logging 600
    first, kept the abandoned session's 510..540 (NaNs of a divergence among them)."""
    if self.enabled:
      self.append(step, {"session_from": step})

  def append(self, step: int, scalars: dict) -> None:
    if not self.enabled:
      return
    with open(self.path, "a") as f:
      f.write(json.dumps({"step": step, **{k: float(v) for k, v in scalars.items()}}) + "\n")
      f.flush()


def read_metrics(workdir: str, key: str = "train/loss") -> dict[int, float]:
  """``{step: value}`` of one metric as the run's own history: last record per step wins, and
  where a session starts from a checkpoint (``MetricsLog.start_session``'s line, or in older
  files a record whose step goes back) the records of the abandoned session after it are
  dropped, even at steps the new one has not reached yet (they read as the run's progress:
  "last logged step 1050" for a run at 1020)."""
  out: dict[int, float] = {}
  path = os.path.join(workdir, METRICS)
  if not os.path.exists(path):
    return out
  last = None
  with open(path) as f:
    for line in f:
      try:
        rec = json.loads(line)
      except json.JSONDecodeError:  # A kill mid-write leaves at most one torn last line.
        continue
      step = int(rec["step"])
      if "session_from" in rec:
        for stale in [s for s in out if s > step]:
          del out[stale]
      elif last is not None and step < last:
        for stale in [s for s in out if s >= step]:
          del out[stale]
      last = step
      if key in rec:
        out[step] = rec[key]
  return out
