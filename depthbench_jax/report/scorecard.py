"""Run records -> the DepthBench scorecard (markdown), the runs CSV and the plots.

A *record* is one run's ``summary.json`` (keys in DEVELOPERS.md) plus ``workdir`` and the
derived ``n_layers``, ``d_model``, ``aspect_ratio`` and ``lr`` (from the summary, else its
config). Best LR per (design, shape) is ``sweep.select_best_lr``: lowest final val loss among
runs with status 'ok' and a finite loss; diverged runs are listed, never chosen.

Depth trend of a design, at its best LR per shape, over the two reference depths (16 and 32
layers, the paper's table, when the results have both; else the shallowest and deepest):
``peak in the middle (L=..)`` when the best depth lies strictly between them and beats both by
more than ``tol``; else ``better when deeper`` / ``worse when deeper`` when the deep value is
lower / higher by more than ``tol``; else ``flat``.

When one design has several shapes at the same depth (the multi-scale suite), shapes are split
into scale families by parameter count (``assign_families``), and each family gets its own table.
"""

from __future__ import annotations

import csv
import importlib
import json
import math
import os
import statistics
from typing import Any, Iterable, Sequence

from depthbench_jax.sweep import (format_lr, is_usable, read_summary, record_lr, select_best_lr,
                                  shape_key)

# The paper's 400M table (val loss, best LR): design -> (16 layers, 32 layers, note).
PAPER_400M = {
    "preln": (2.759, 2.782, "worse when deeper"),
    "attnres_full": (2.751, 2.718, "better when deeper"),
    "hc": (2.729, 2.699, "better when deeper"),
    "attnres_block": (None, 2.730, "peak in the middle (best 2.715 at 20 layers)"),
}
PAPER_DEPTHS = (16, 32)
TREND_TOL = 0.005
FAMILY_GAP = 1.2   # a scale family's shapes lie within this factor of its smallest's parameters
CSV_FIELDS = ("name", "design", "n_layers", "d_model", "aspect_ratio", "lr", "params_total",
              "params_non_embedding", "steps", "tokens", "final_train_loss", "final_val_loss",
              "status", "diverged_step", "diverged_reason", "wall_time_s", "best_lr", "family",
              "workdir")
HOOKS = (("diagnostics", "diagnostics_table", "diagnostics.json"),
         ("evals", "evals_table", "evals.json"),
         ("systems", "systems_table", None))


# ---------------------------------------------------------------------------------------------
# Reading.
# ---------------------------------------------------------------------------------------------

def _folders(results_dir: str):
  """``(folder, its file names)`` under ``results_dir``, sorted, not descending into a run's
  ``checkpoints``, ``tensorboard`` or ``plots``."""
  for root, dirs, files in os.walk(results_dir):
    dirs[:] = sorted(d for d in dirs if d not in ("checkpoints", "tensorboard", "plots"))
    yield root, files


def collect_runs(results_dir: str) -> list[dict]:
  """Every ``summary.json`` under ``results_dir`` (any depth), as records sorted by name."""
  records = []
  for root, files in _folders(results_dir):
    if "summary.json" not in files:
      continue
    try:
      with open(os.path.join(root, "summary.json")) as f:
        summary = json.load(f)
    except (OSError, json.JSONDecodeError):
      continue  # A torn or foreign file is not a run.
    try:
      design, n_layers, d_model = shape_key(summary)
      lr = record_lr(summary)
    except (TypeError, ValueError, KeyError):
      continue
    record = dict(summary)
    record.update(design=design, n_layers=n_layers, d_model=d_model, lr=lr,
                  aspect_ratio=d_model / n_layers, workdir=root,
                  name=summary.get("name") or os.path.basename(root))
    records.append(record)
  return sorted(records, key=lambda r: r["name"])


def collect_unfinished(results_dir: str) -> list[dict]:
  """Run folders without a readable ``summary.json`` (training, interrupted, or crashed, or a
  torn summary, which a sweep re-launches too): ``{'name', 'workdir', 'step', 'train_loss',
  'checkpoint_step'}`` from ``metrics.jsonl`` and ``checkpoints/``; a folder with neither is not
  a run."""
  from depthbench_jax.train.summary import checkpoint_steps, read_metrics  # Local, and light.
  out = []
  for root, files in _folders(results_dir):
    if "summary.json" in files and read_summary(root) is not None:
      continue
    saved = checkpoint_steps(root)
    losses = read_metrics(root) if "metrics.jsonl" in files else {}
    if not saved and not losses:
      continue
    last = max(losses) if losses else None
    out.append({"name": os.path.basename(root), "workdir": root, "step": last,
                "train_loss": losses.get(last) if last is not None else None,
                "checkpoint_step": saved[-1] if saved else None})
  return sorted(out, key=lambda r: r["name"])


def unfinished_markdown(rows: Sequence[dict]) -> str | None:
  if not rows:
    return None
  lines = ["| run | last logged step | train loss there | last checkpoint |", "|---|---|---|---|"]
  for r in rows:
    lines.append(f"| {r['name']} | {'' if r['step'] is None else r['step']} | "
                 f"{_fmt(r['train_loss'])} | "
                 f"{'' if r['checkpoint_step'] is None else r['checkpoint_step']} |")
  return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The scorecard.
# ---------------------------------------------------------------------------------------------

def assign_families(records: Sequence[dict], gap: float = FAMILY_GAP) -> None:
  """Sets ``record['family']``: 0 unless some depth has several widths (multi-scale), then the
  scale family by parameter count: shapes sorted by their smallest ``params_total`` over the
  runs (the backbone's, where Pre-LN ran), a new family wherever a shape has more than ``gap``
  times the parameters of its family's first. An iso-parameter family spans a few percent, the
  multi-scale suite's families 1.5x, so a shape whose runs are missing shifts no other shape."""
  widths: dict[int, set[int]] = {}
  for r in records:
    widths.setdefault(r["n_layers"], set()).add(r["d_model"])
  if all(len(w) == 1 for w in widths.values()):
    for r in records:
      r["family"] = 0
    return
  size: dict[tuple[int, int], float] = {}
  for r in records:
    key = (r["n_layers"], r["d_model"])
    size[key] = min(size.get(key, math.inf), float(r.get("params_total") or _backbone_estimate(r)))
  family, first, index = {}, None, -1
  for key in sorted(size, key=size.get):
    if first is None or size[key] > gap * first:
      index, first = index + 1, size[key]
    family[key] = index
  for r in records:
    r["family"] = family[(r["n_layers"], r["d_model"])]


def _backbone_estimate(record: dict) -> float:
  """``12 L d^2 + 2 V d`` (SwiGLU layers, untied embedding) for a record without a count."""
  vocab = ((record.get("config") or {}).get("model") or {}).get("vocab_size") or 50257
  return 12 * record["n_layers"] * record["d_model"] ** 2 + 2 * vocab * record["d_model"]


def depth_trend(losses: dict[int, float], ref: tuple[int, int], tol: float = TREND_TOL) -> str:
  """``losses``: {n_layers: best-LR val loss}. See the module docstring for the rule."""
  lo, hi = ref
  if lo not in losses or hi not in losses or lo == hi:
    return "n/a"
  best_depth = min(losses, key=losses.get)
  if lo < best_depth < hi and losses[best_depth] < min(losses[lo], losses[hi]) - tol:
    return f"peak in the middle (L={best_depth})"
  if losses[hi] < losses[lo] - tol:
    return "better when deeper"
  if losses[hi] > losses[lo] + tol:
    return "worse when deeper"
  return "flat"


def reference_depths(records: Sequence[dict]) -> tuple[int, int]:
  depths = sorted({r["n_layers"] for r in records})
  if set(PAPER_DEPTHS) <= set(depths):
    return PAPER_DEPTHS
  return (depths[0], depths[-1]) if depths else (0, 0)


def scorecard_rows(records: Sequence[dict], groups: dict | None = None) -> list[dict]:
  """One row per (family, design): losses at the reference depths, trend, best shape."""
  groups = groups if groups is not None else select_best_lr(records)
  rows = []
  for family in sorted({r["family"] for r in records}):
    fam = [r for r in records if r["family"] == family]
    ref = reference_depths(fam)
    for design in _design_order(fam):
      best = {}
      for r in fam:
        if r["design"] != design:
          continue
        group = groups[shape_key(r)]
        if group["best"] is not None:
          best[r["n_layers"]] = group["best"]
      losses = {L: rec["final_val_loss"] for L, rec in best.items()}
      winner = min(best.values(), key=lambda rec: rec["final_val_loss"], default=None)
      shapes_run = {(r["n_layers"], r["d_model"]) for r in fam if r["design"] == design}
      rows.append({
          "family": family, "design": design, "ref_depths": ref,
          "loss_lo": losses.get(ref[0]),
          "loss_hi": losses.get(ref[1]) if ref[1] != ref[0] else None,
          "trend": depth_trend(losses, ref), "best": winner,
          "best_lr_at_edge": bool(winner and groups[shape_key(winner)]["lr_at_edge"]),
          "best_lr_untuned": bool(winner and groups[shape_key(winner)]["lr_untuned"]),
          "n_shapes": len(shapes_run), "n_shapes_usable": len(best),
          "params_median": statistics.median(r["params_total"] for r in fam
                                             if r.get("params_total")) if any(
                                                 r.get("params_total") for r in fam) else None,
      })
  return rows


def _design_order(records: Iterable[dict]) -> list[str]:
  """Registry order (the paper's grouping), then anything else alphabetically."""
  present = {r["design"] for r in records}
  try:
    from depthbench_jax.residual import registry
    order = [n for n in registry.names() if n in present]
  except Exception:  # pylint: disable=broad-except
    order = []
  return order + sorted(present - set(order))


def _fmt(x: Any, digits: int = 3) -> str:
  if x is None or (isinstance(x, float) and not math.isfinite(x)):
    return "–"
  return f"{x:.{digits}f}"


def _params(n: float | None) -> str:
  if not n:
    return "?"
  return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


def scorecard_markdown(rows: Sequence[dict]) -> str:
  out = []
  for family in sorted({r["family"] for r in rows}):
    fam = [r for r in rows if r["family"] == family]
    lo, hi = fam[0]["ref_depths"]
    if len({r["family"] for r in rows}) > 1:
      out.append(f"### Scale family {family} (median {_params(fam[0]['params_median'])} "
                 f"parameters)\n")
    deep = f"val loss at {hi} layers" if hi != lo else "a second depth (none run yet)"
    out.append(f"| architecture | val loss at {lo} layers | {deep} | "
               f"depth trend | best shape (AR) | best val loss | its LR |")
    out.append("|---|---|---|---|---|---|---|")
    for r in fam:
      b = r["best"]
      shape = f"{b['n_layers']}x{b['d_model']} ({b['aspect_ratio']:.1f})" if b else "–"
      mark = " †" if r["best_lr_at_edge"] else " ‡" if r["best_lr_untuned"] else ""
      lr = f"{format_lr(b['lr'])}{mark}" if b else "–"
      out.append(f"| {r['design']} | {_fmt(r['loss_lo'])} | {_fmt(r['loss_hi'])} | "
                 f"{r['trend']} | {shape} | {_fmt(b['final_val_loss'] if b else None)} | {lr} |")
    out.append("")
  if any(r["best_lr_at_edge"] for r in rows):
    out.append("† best LR at an edge of the grid tried: the optimum may lie outside it.")
  if any(r["best_lr_untuned"] for r in rows):
    out.append("‡ the only LR tried at that shape: the LR is not tuned there.")
  return "\n".join(out)


def paper_comparison(rows: Sequence[dict]) -> str | None:
  """The paper's 400M numbers beside ours, when the results are a ~400M 16/32-layer sweep."""
  fam = [r for r in rows if r["ref_depths"] == PAPER_DEPTHS and r["params_median"]
         and 350e6 <= r["params_median"] <= 450e6 and r["design"] in PAPER_400M]
  if not fam:
    return None
  lines = ["| architecture | paper 16L | ours 16L | paper 32L | ours 32L | paper trend | "
           "our trend |", "|---|---|---|---|---|---|---|"]
  for r in fam:
    p16, p32, note = PAPER_400M[r["design"]]
    lines.append(f"| {r['design']} | {_fmt(p16)} | {_fmt(r['loss_lo'])} | {_fmt(p32)} | "
                 f"{_fmt(r['loss_hi'])} | {note} | {r['trend']} |")
  return "\n".join(lines)


def lr_table(records: Sequence[dict], groups: dict) -> str:
  """Per (design, shape): val loss at every LR tried; best in bold, diverged marked."""
  lrs = sorted({r["lr"] for r in records})
  lines = ["| design | shape | AR | " + " | ".join(f"lr {format_lr(lr)}" for lr in lrs) + " |",
           "|---|---|---|" + "---|" * len(lrs)]
  for key in sorted(groups, key=lambda k: (_design_order(records).index(k[0]), k[1], k[2])):
    group = groups[key]
    cells = []
    for lr in lrs:
      runs = [r for r in group["runs"] if r["lr"] == lr]
      if not runs:
        cells.append("")
        continue
      # Several runs at one LR (a copy in another folder): the best if it is one of them, else
      # a usable one, and the count, so no run that decides the scorecard is hidden.
      r = next((x for x in runs if x is group["best"]), None) or next(
          (x for x in runs if is_usable(x)), runs[0])
      more = f" ({len(runs)} runs)" if len(runs) > 1 else ""
      if r.get("status") == "diverged":
        step = r.get("diverged_step")
        cells.append(f"diverged{f' @{step}' if step is not None else ''}{more}")
      elif not is_usable(r):
        cells.append(str(r.get("status") or "unfinished") + more)
      elif r is group["best"]:
        cells.append(f"**{r['final_val_loss']:.3f}**{more}")
      else:
        cells.append(f"{r['final_val_loss']:.3f}{more}")
    design, L, d = key
    lines.append(f"| {design} | {L}x{d} | {d / L:.1f} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def excluded_markdown(groups: dict) -> str | None:
  rows = [r for g in groups.values() for r in g["excluded"]]
  if not rows:
    return None
  lines = ["| run | status | step | reason |", "|---|---|---|---|"]
  for r in sorted(rows, key=lambda r: r["name"]):
    lines.append(f"| {r['name']} | {r.get('status') or 'unfinished'} | "
                 f"{r.get('diverged_step') if r.get('diverged_step') is not None else ''} | "
                 f"{r.get('diverged_reason') or ''} |")
  return "\n".join(lines)


def hook_sections(records: Sequence[dict],
                  relative_to: str | None = None) -> list[tuple[str, str]]:
  """Optional sections from diagnostics/evals/systems, imported lazily; skipped when the module
  or function is absent, or no run carries the file it reads. A failing hook is reported, not
  raised. Each hook gets the report's folder as ``relative_to``: links to run files (the
  diagnostics' heatmaps) are relative to it, so they survive the folder being copied or moved."""
  sections = []
  for package, fn_name, needed_file in HOOKS:
    runs = [r for r in records
            if needed_file is None or os.path.exists(os.path.join(r["workdir"], needed_file))]
    if not runs:
      continue
    fn = None
    for module_name in (f"depthbench_jax.{package}", f"depthbench_jax.{package}.report",
                        f"depthbench_jax.{package}.report_section"):
      try:
        fn = getattr(importlib.import_module(module_name), fn_name, None)
      except ImportError:
        fn = None
      if fn is not None:
        break
    if fn is None:
      continue
    try:
      text = fn(runs, relative_to=relative_to)
    except Exception as e:  # pylint: disable=broad-except
      text = f"_{package}.{fn_name} failed: {type(e).__name__}: {e}_"
    if text:
      sections.append((package.capitalize(), text))
  return sections


def build_report(records: Sequence[dict], title: str = "DepthBench scorecard",
                 plot_files: Sequence[str] = (), unfinished: Sequence[dict] = (),
                 relative_to: str | None = None) -> str:
  """report.md's text; ``relative_to``: the folder it goes to (links to run files are relative
  to it; else absolute)."""
  records = list(records)
  assign_families(records)
  groups = select_best_lr(records)
  rows = scorecard_rows(records, groups)
  n_div = sum(r.get("status") == "diverged" for r in records)
  parts = [f"# {title}", "",
           f"{len(records)} runs, {len({r['design'] for r in records})} designs, "
           f"{len({(r['n_layers'], r['d_model']) for r in records})} shapes; {n_div} diverged. "
           "Every shape at its design's best LR (lowest final val loss; diverged runs "
           "excluded).", "", "## Val loss and depth trend", "", scorecard_markdown(rows), "",
           "Depth trend: the deeper reference depth against the shallower one at each "
           f"design's best LR (ties within {TREND_TOL}: flat); 'peak in the middle' when an "
           "in-between depth beats both.", ""]
  paper = paper_comparison(rows)
  if paper:
    parts += ["## Against the paper (400M)", "", paper, ""]
  parts += ["## Val loss by LR", "", lr_table(records, groups), ""]
  excluded = excluded_markdown(groups)
  if excluded:
    parts += ["## Diverged and unfinished runs (excluded from best-LR selection)", "",
              excluded, ""]
  waiting = unfinished_markdown(unfinished)
  if waiting:
    parts += ["## Runs without a summary (training, interrupted or crashed; a sweep resumes "
              "them from their last checkpoint)", "", waiting, ""]
  if plot_files:
    parts += ["## Loss vs aspect ratio", ""]
    parts += [f"![{os.path.basename(p)}]({p})" for p in plot_files] + [""]
  for name, text in hook_sections(records, relative_to):
    parts += [f"## {name}", "", text, ""]
  parts += ["All runs: [runs.csv](runs.csv)."]
  return "\n".join(parts) + "\n"


def write_csv(records: Sequence[dict], path: str, groups: dict) -> None:
  best = [g["best"] for g in groups.values() if g["best"] is not None]
  with open(path, "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
    writer.writeheader()
    for r in records:
      writer.writerow({**{k: r.get(k) for k in CSV_FIELDS},
                       "best_lr": any(r is b for b in best)})   # not by name: names repeat


def write_report(results_dir: str, out_dir: str | None = None,
                 plots: bool = True) -> list[str] | None:
  """Writes report.md, runs.csv and plots/ for ``results_dir``; returns the paths (None if no
  runs). Before any run has finished, report.md is where the runs stand (``unfinished``)."""
  from depthbench_jax.train.summary import atomic_write_text  # Local, and light.
  records, unfinished = collect_runs(results_dir), collect_unfinished(results_dir)
  if not records and not unfinished:
    return None
  out_dir = out_dir or results_dir
  os.makedirs(out_dir, exist_ok=True)
  title = f"DepthBench scorecard: {os.path.basename(os.path.normpath(results_dir))}"
  report_path = os.path.join(out_dir, "report.md")
  if not records:
    atomic_write_text(report_path, f"# {title}\n\n{len(unfinished)} runs started; no run has "
                      f"finished yet.\n\n{unfinished_markdown(unfinished)}\n")
    return [report_path]
  assign_families(records)
  groups = select_best_lr(records)
  plot_files = []
  if plots:
    from depthbench_jax.report import plots as plots_lib  # Local: matplotlib is slow to import.
    plot_files = plots_lib.loss_vs_aspect(records, groups, os.path.join(out_dir, "plots"))
  rel = [os.path.relpath(p, out_dir) for p in plot_files]
  # Rendered in full first (the hook sections take seconds), then swapped in: an interrupted
  # report leaves the previous report.md whole.
  atomic_write_text(report_path, build_report(records, title=title, plot_files=rel,
                                              unfinished=unfinished, relative_to=out_dir))
  csv_path = os.path.join(out_dir, "runs.csv")
  write_csv(records, csv_path, groups)
  return [report_path, csv_path] + plot_files
