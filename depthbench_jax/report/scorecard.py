"""Run records -> the DepthBench scorecard (markdown), the runs CSV and the plots.

A *record* is one run's ``summary.json`` (keys in DEVELOPERS.md) plus ``workdir`` and the
derived ``n_layers``, ``d_model``, ``aspect_ratio`` and ``lr`` (from the summary, else its
config). Best LR per (design, shape) is ``sweep.select_best_lr``: lowest final val loss among
runs with status 'ok' and a finite loss; diverged runs are listed, never chosen.

Depth trend of a design, at its best LR per shape, over the two reference depths (16 and 32
layers, the paper's table, when the results have both; else the shallowest and deepest):
``peak in the middle (L=..)`` when the best depth strictly between them beats both by more than
``tol`` (a deeper shape beyond the pair does not hide it); else ``better when deeper`` /
``worse when deeper`` when the deep value is lower / higher by more than ``tol``; else ``flat``.

When one design has several shapes at the same depth (the multi-scale suite), shapes are split
into scale families by parameter count (``assign_families``), and each family gets its own table.
"""

from __future__ import annotations

import csv
import importlib
import io
import json
import math
import os
import statistics
import sys
from typing import Any, Iterable, Sequence

from depthbench_jax import recipe, revision
from depthbench_jax.sweep import (design_label, format_lr, human, is_usable, parse_run_name,
                                  read_summary, record_lr, select_best_lr, shape_key)

# The paper's 400M table (val loss, best LR): design -> (16 layers, 32 layers, note).
PAPER_400M = {
    "preln": (2.759, 2.782, "worse when deeper"),
    "attnres_full": (2.751, 2.718, "better when deeper"),
    "hc": (2.729, 2.699, "better when deeper"),
    "attnres_block": (None, 2.730, "peak in the middle (best 2.715 at 20 layers)"),
}
PAPER_DEPTHS = (16, 32)
# The total parameter counts (embeddings included) that stand for the paper's "400M" suite.
PAPER_TOTAL_RANGE = (350e6, 450e6)
# The recipe the paper's 400M losses were trained and measured with: a run whose summary config
# says otherwise (a long-context copy of the suite; a pilot with a fixed ``steps``, which
# overrides the 20-tokens-per-parameter budget; the embedded demo text) is not put beside them.
# ``data.source='parquet'`` is how the suites read FineWeb-Edu (which corpus, it cannot tell).
# The paper's ~1M-token batch (512 x 2048; a 128-row pilot trains the same tokens in 4x the
# steps) and Pre-LN's token budget for every design (``budget_design``; '' gives MoDA 12-14%
# more tokens) count too.
PAPER_RECIPE = {"data.seq_len": 2048, "data.tokenizer": "gpt2", "tokens_per_param": 20.0,
                "steps": -1, "data.source": "parquet", "data.global_batch_size": 512,
                "budget_design": "preln"}
# The paper's shapes share one total parameter count; its 400M suite's lie within 3.2% of each
# other. A family whose 16- and 32-layer totals are further apart (the iso-backbone control:
# 407M -> 374M) measures another trend.
PAPER_ISO_TOTAL_TOL = 0.05
TREND_TOL = 0.005
FAMILY_GAP = 1.2   # a scale family's shapes lie within this factor of its smallest's parameters
CSV_FIELDS = ("name", "design", "n_layers", "d_model", "aspect_ratio", "lr", "params_total",
              "params_non_embedding", "steps", "tokens", "final_train_loss", "final_val_loss",
              "status", "diverged_step", "diverged_reason", "skipped_steps", "max_grad_norm",
              "max_grad_norm_step", "wall_time_s", "device_hours",
              "devices", "device_kind", "best_lr", "family", "set_aside",
              "commit", "workdir")
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
    summary = read_summary(root)
    if summary is None:
      continue  # A torn or foreign file is not a run (collect_unfinished lists it).
    (_, n_layers, d_model), lr = shape_key(summary), record_lr(summary)
    record = dict(summary)
    record.update(design=design_label(summary), n_layers=n_layers, d_model=d_model, lr=lr,
                  aspect_ratio=d_model / n_layers, workdir=root,
                  # The folder, as report.md names runs: a copy or a variant trained under
                  # another folder repeated its config's name in runs.csv.
                  name=os.path.basename(root))
    records.append(record)
  return sorted(records, key=lambda r: r["name"])


def collect_unfinished(results_dir: str) -> list[dict]:
  """Run folders without a readable ``summary.json`` (training, interrupted, or crashed, or a
  torn summary, which a sweep re-launches too): ``{'name', 'workdir', 'step', 'train_loss',
  'checkpoint_step', 'key', 'lr', 'torn'}`` from ``metrics.jsonl``, ``checkpoints/`` and
  ``config.json`` (``key``: ``(design, L, d)``, None when unknown); a folder with none of
  ``config.json`` (the trainer's first file), logged losses, checkpoints or a summary file is
  not a run. A run restarted from step 0 and stopped before its first log line (its
  metrics.jsonl a session line alone) vanished from the report."""
  from depthbench_jax.train.summary import checkpoint_steps, read_metrics  # Local, and light.
  out = []
  for root, files in _folders(results_dir):
    if "summary.json" in files and read_summary(root) is not None:
      continue
    saved = checkpoint_steps(root)
    losses = read_metrics(root) if "metrics.jsonl" in files else {}
    key, lr = _planned_run(root)
    # A run's config.json (an HF export's hf/config.json places no run: key None).
    started = "config.json" in files and key is not None
    if not saved and not losses and "summary.json" not in files and not started:
      continue
    last = max(losses) if losses else None
    out.append({"name": os.path.basename(root), "workdir": root, "step": last,
                "train_loss": losses.get(last) if last is not None else None,
                "checkpoint_step": saved[-1] if saved else None, "key": key, "lr": lr,
                "torn": "summary.json" in files})
  return sorted(out, key=lambda r: r["name"])


def _planned_run(workdir: str) -> tuple[tuple[str, int, int] | None, float | None]:
  """``((design, L, d), lr)`` of a run without a summary, from its ``config.json`` (written
  when it starts), else its folder name ``<design>_<L>x<d>_lr<lr>``; ``(None, None)`` if
  neither says."""
  try:
    with open(os.path.join(workdir, "config.json")) as f:
      record = {"config": json.load(f)}
    _, n_layers, d_model = shape_key(record)
    return (design_label(record), n_layers, d_model), record_lr(record)
  except (OSError, json.JSONDecodeError, TypeError, ValueError, KeyError, AttributeError):
    pass
  named = parse_run_name(os.path.basename(workdir))
  if named is None:
    return None, None
  design, shape, lr = named
  return (design, shape.n_layers, shape.d_model), lr


def grid_gaps(records: Sequence[dict], unfinished: Sequence[dict] = (),
              plan: Sequence[dict] | None = None) -> dict:
  """``{(design, L, d): {'pending': [lr], 'missing': [lr], 'not_started': [lr],
  'other_recipe': [lr]}}`` for every shape whose grid is incomplete (``pending``: LRs started
  there without a summary yet, or whose diverged run the plan says the sweep retrains (its
  state 'started', ``report.plan._state``); ``other_recipe``: planned LRs whose run trained
  another recipe and is set aside, so the best LR there is picked without them).

  Without ``plan``, inferred from disk: a design's grid is every LR it ran at any shape of its
  suite (``record['suite']``, ``assign_families``'s recipe; a suite sweeps one grid per
  design), ``missing``: LRs of that grid with no folder there at all. With
  ``plan`` (``report.plan.load_plan``: the suite's runs and their states) the grid is what the
  suite plans: ``not_started``: planned LRs with no folder yet, and ``missing`` is empty (an LR
  the suite does not plan at a shape is no gap), so shapes no run has reached appear too."""
  grid: dict[tuple[int, str], set[float]] = {}
  tried: dict[tuple[str, int, int], set[float]] = {}
  waiting: dict[tuple[str, int, int], set[float]] = {}
  unstarted: dict[tuple[str, int, int], set[float]] = {}
  suite = {shape_key(r)[1:]: r.get("suite", 0) for r in records}
  grid_of = lambda key: grid.setdefault((suite.get(key[1:], 0), key[0]), set())
  for r in records:
    grid_of(shape_key(r)).add(r["lr"])
    tried.setdefault(shape_key(r), set()).add(r["lr"])
  for u in unfinished:
    if u.get("key") is not None and u.get("lr") is not None:
      grid_of(u["key"]).add(u["lr"])
      waiting.setdefault(u["key"], set()).add(u["lr"])
  other: dict[tuple[str, int, int], set[float]] = {}
  relaunched: dict[tuple[str, int, int], set[float]] = {}   # the plan's word beats a record:
  for p in plan or ():   # a run diverged under other rules is 'started', the sweep retrains it
    if p["state"] in ("started", "not started"):
      (relaunched if p["state"] == "started" else unstarted).setdefault(p["key"], set()).add(
          p["lr"])
    elif p["state"] == "other recipe":
      other.setdefault(p["key"], set()).add(p["lr"])
  gaps = {}
  for key in set(tried) | set(waiting) | set(relaunched) | set(unstarted) | set(other):
    done = tried.get(key, set())
    set_aside = sorted(other.get(key, set()) - done)
    pending = sorted((waiting.get(key, set()) - done | relaunched.get(key, set()))
                     - set(set_aside))
    not_started = sorted(unstarted.get(key, set()) - done - set(pending))
    missing = [] if plan is not None else sorted(grid_of(key) - done - set(pending))
    if pending or missing or not_started or set_aside:
      gaps[key] = {"pending": pending, "missing": missing, "not_started": not_started,
                   "other_recipe": set_aside}
  return gaps


def unfinished_markdown(rows: Sequence[dict]) -> str | None:
  if not rows:
    return None
  lines = ["| run | last logged step | train loss there | last checkpoint |", "|---|---|---|---|"]
  for r in rows:
    name = r["name"] + (" (summary.json unreadable)" if r.get("torn") else "")
    lines.append(f"| {name} | {'' if r['step'] is None else r['step']} | "
                 f"{_fmt(r['train_loss'])} | "
                 f"{'' if r['checkpoint_step'] is None else r['checkpoint_step']} |")
  return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The scorecard.
# ---------------------------------------------------------------------------------------------

def assign_families(records: Sequence[dict], gap: float = FAMILY_GAP) -> None:
  """Sets ``record['family']`` (and ``record['suite']``, its recipe's index): 0 unless some
  depth has several widths (multi-scale), then the scale family by parameter count: shapes
  sorted by their smallest ``params_total`` over the runs (the backbone's, where Pre-LN ran), a
  new family wherever a shape has more than ``gap`` times the parameters of its family's first,
  or a depth its family already has (a family is one iso-parameter sweep: one shape per depth).
  An iso-parameter family spans a few percent, the multi-scale suite's families 1.5x, so a
  shape whose runs are missing shifts no other shape. The depth rule keeps suites reported
  together apart where the gap alone does not: the 400M suite (402-415M) and the multi-scale
  500M family (482-485M) chained into one, and its 32x992 replaced 32x896 in the 32-layer
  column.

  Suites reported together are told apart by recipe first (``recipe_clusters``): the smoke
  sweep (bytes, seq 128) beside the 400M suite, one width per depth, was one family, whose
  best shape was a smoke run. Then each recipe's families, numbered on."""
  offset = 0
  for index, cluster in enumerate(recipe_clusters(records)):
    _size_families(cluster, gap, offset)
    offset = 1 + max(r["family"] for r in cluster)
    for r in cluster:
      r["suite"] = index


def recipe_clusters(records: Sequence[dict]) -> list[list[dict]]:
  """``records`` by recipe (``recipe.shared_differences`` of their summaries' configs against
  each cluster's first), in order of first appearance; records without a config join the first
  cluster (one that started a cluster, an empty config differing from none, took in every
  recipe after it)."""
  clusters: list[tuple[dict, list[dict]]] = []   # (the first member's config, members)
  bare = []
  for r in records:
    config = r.get("config")
    if not isinstance(config, dict) or not config:
      bare.append(r)
      continue
    home = next((members for first, members in clusters
                 if not recipe.shared_differences(config, first)), None)
    if home is None:
      clusters.append((config, [r]))
    else:
      home.append(r)
  if not clusters:
    return [bare] if bare else []
  clusters[0][1].extend(bare)
  return [members for _, members in clusters]


def set_aside_other_recipes(records: Sequence[dict], plan: Sequence[dict] = (),
                            other: dict[str, dict] | None = None,
                            ) -> tuple[list[dict], list[tuple[dict, dict]]]:
  """``(kept, [(record, {field: (its value, the kept runs' value)})])``: where runs of two
  recipes share a shape, one recipe is reported and the other's runs are set aside, named.

  Each shape's best LR is picked among its runs, so a copy of a run trained longer in another
  folder (README's one-run example beside the smoke sweep) won it and flipped the ranking, and
  a suite edited after some runs finished mixed two schedules in one trend. With ``--config``,
  ``other`` (``report.plan.other_recipe_runs``: runs of another recipe than the suite gives
  them now, planned or not) go first. Then, where recipes still share a shape, kept: the
  recipe with the most runs in ``plan``'s workdirs, then the most runs, then the first found.
  Recipes at other shapes stay (other families: ``assign_families``)."""
  other = other or {}
  planned = {os.path.abspath(p["workdir"]) for p in plan} - set(other)
  aside = [(r, other[os.path.abspath(r["workdir"])])
           for r in records if os.path.abspath(r.get("workdir", "")) in other]
  records = [r for r in records if os.path.abspath(r.get("workdir", "")) not in other]
  shapes = lambda c: {(r["n_layers"], r["d_model"]) for r in c}
  linked: list[list[list[dict]]] = []   # clusters joined by a shared shape
  for cluster in recipe_clusters(records):
    touching = [g for g in linked if any(shapes(c) & shapes(cluster) for c in g)]
    for g in touching:
      linked.remove(g)
    linked.append([c for g in touching for c in g] + [cluster])
  kept_ids = set()
  for group in linked:
    main = max(group, key=lambda c: (
        sum(os.path.abspath(r.get("workdir", "")) in planned for r in c), len(c)))
    kept_ids |= {id(r) for r in main}
    reference = next((r["config"] for r in main if isinstance(r.get("config"), dict)), {})
    aside += [(r, recipe.shared_differences(r.get("config") or {}, reference))
              for c in group if c is not main for r in c]
  return [r for r in records if id(r) in kept_ids], aside


def set_aside_markdown(aside: Sequence[tuple[dict, dict]], relative_to: str | None) -> str:
  """One line per run set aside: its folder, and each field with its value and the reported
  runs' (names repeat across folders)."""
  lines = []
  for r, differ in aside:
    where = r.get("workdir", r.get("name", "?"))
    where = os.path.relpath(where, relative_to) if relative_to and os.path.isabs(where) else where
    fields = ", ".join(f"{f}={a!r} (reported: {b!r})" for f, (a, b) in differ.items())
    lines.append(f"- `{where}`: {fields}")
  return ("Runs of another recipe than the reported runs: with --config, than the suite gives "
          "them now; without, where two recipes share a shape (with that recipe's runs at other "
          "shapes). One best-LR choice, trend or plot line cannot mix recipes. Report them from "
          "their own folder, or move the others out.\n\n"
          + "\n".join(lines))


def _size_families(records: Sequence[dict], gap: float, offset: int) -> None:
  """``assign_families`` within one recipe: families ``offset``, ``offset + 1``, ..."""
  widths: dict[int, set[int]] = {}
  for r in records:
    widths.setdefault(r["n_layers"], set()).add(r["d_model"])
  if all(len(w) == 1 for w in widths.values()):
    for r in records:
      r["family"] = offset
    return
  size: dict[tuple[int, int], float] = {}
  for r in records:
    key = (r["n_layers"], r["d_model"])
    size[key] = min(size.get(key, math.inf), float(r.get("params_total") or _backbone_estimate(r)))
  family, first, index, depths = {}, None, offset - 1, set()
  for key in sorted(size, key=size.get):
    if first is None or size[key] > gap * first or key[0] in depths:
      index, first, depths = index + 1, size[key], set()
    family[key] = index
    depths.add(key[0])
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
  # The best depth between the pair, not over every depth: mHC's 24 beat 16 and 32 by 0.02, yet
  # a 70-layer shape better still made it no peak and the pair read 'flat'.
  middle = [d for d in losses if lo < d < hi]
  best_depth = min(middle, key=losses.get) if middle else None
  if best_depth is not None and losses[best_depth] < min(losses[lo], losses[hi]) - tol:
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


def lr_marks(key: tuple[str, int, int], groups: dict, gaps: dict | None = None) -> str:
  """The caveats on one (design, shape)'s best LR: ``†`` at an edge of the grid tried (the
  optimum may lie outside it), ``‡`` the only LR tried, ``§`` picked from an incomplete grid
  (``grid_gaps``: LRs still training, not started or never run there), ``¶`` the lowest of
  several runs at that LR (seeds or copies: a minimum beside single runs' losses)."""
  group = groups.get(key)
  if group is None or group["best"] is None:
    return ""
  marks = "†" if group["lr_at_edge"] else "‡" if group["lr_untuned"] else ""
  return (marks + ("§" if gaps and key in gaps else "")
          + ("¶" if group.get("copies", 1) > 1 else ""))


def scorecard_rows(records: Sequence[dict], groups: dict | None = None,
                   gaps: dict | None = None) -> list[dict]:
  """One row per (family, design): losses at the reference depths, trend, best shape, each
  with its best LR's ``lr_marks``; ``missing_shapes``: shapes of the family (any design's) where
  this design has no usable run."""
  groups = groups if groups is not None else select_best_lr(records)
  gaps = gaps or {}
  rows = []
  for family in sorted({r["family"] for r in records}):
    fam = [r for r in records if r["family"] == family]
    ref = reference_depths(fam)
    family_shapes = sorted({(r["n_layers"], r["d_model"]) for r in fam})
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
      marks = {L: lr_marks(shape_key(rec), groups, gaps) for L, rec in best.items()}
      rows.append({
          "family": family, "design": design, "ref_depths": ref,
          "loss_lo": losses.get(ref[0]),
          "loss_hi": losses.get(ref[1]) if ref[1] != ref[0] else None,
          "marks_lo": marks.get(ref[0], ""),
          "marks_hi": marks.get(ref[1], "") if ref[1] != ref[0] else "",
          "trend": depth_trend(losses, ref), "best": winner,
          "best_marks": lr_marks(shape_key(winner), groups, gaps) if winner else "",
          "missing_shapes": [s for s in family_shapes
                             if groups.get((design, *s), {}).get("best") is None],
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


def _with_marks(value: str, marks: str) -> str:
  return f"{value} {marks}" if marks and value != "–" else value


def scorecard_markdown(rows: Sequence[dict], marks: str | None = None) -> str:
  """The scorecard tables, then the key to ``marks`` (every mark the report shows: the LR
  table's too; default: the rows' own)."""
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
      lr = _with_marks(format_lr(b["lr"]), r["best_marks"]) if b else "–"
      out.append(f"| {r['design']} | {_with_marks(_fmt(r['loss_lo']), r['marks_lo'])} | "
                 f"{_with_marks(_fmt(r['loss_hi']), r['marks_hi'])} | "
                 f"{r['trend']} | {shape} | {_fmt(b['final_val_loss'] if b else None)} | {lr} |")
    out.append("")
    lacking = [r for r in fam if r["missing_shapes"]]
    if lacking:
      out.append("Not every design has a result at every shape, so best shapes and trends "
                 "compare different shape sets: " + "; ".join(
                     f"{r['design']} has none at "
                     + ", ".join(f"{L}x{d} (AR {d / L:.1f})" for L, d in r["missing_shapes"])
                     for r in lacking) + ".")
      out.append("")
  if marks is None:
    marks = "".join(r["marks_lo"] + r["marks_hi"] + r["best_marks"] for r in rows)
  if "†" in marks:
    out.append("† best LR at an edge of the grid tried: the optimum may lie outside it.")
  if "‡" in marks:
    out.append("‡ the only LR tried at that shape: the LR is not tuned there.")
  if "§" in marks:
    out.append("§ best of an incomplete LR grid: some of the design's LRs are still training, "
               "not started, were not run at that shape or trained another recipe (set aside; "
               "see the LR table).")
  if "¶" in marks:
    out.append("¶ the lowest of several runs at that LR (other seeds or copies, the LR table "
               "counts them): a minimum, set beside single runs' losses, so it reads low.")
  return "\n".join(out)


def recipe_differences(records: Iterable[dict]) -> list[str]:
  """``'data.seq_len=8192'`` for each ``PAPER_RECIPE`` field some record's summary config sets
  to another value (a record without the field, e.g. an old summary, differs in nothing).
  ``records`` is read once per field: a generator (the paper comparison's) checked only the
  first field, so a gpt2-vs-byte or 20-vs-5 tokens-per-parameter difference passed."""
  records = list(records)
  out = []
  for field, paper in PAPER_RECIPE.items():
    values = set()
    for r in records:
      value = r.get("config") or {}
      for part in field.split("."):
        value = value.get(part) if isinstance(value, dict) else None
      if value is not None and value != paper:
        values.add(value)
    out += [f"{field}={v!r}" for v in sorted(values, key=str)]
  return out


def paper_comparison(rows: Sequence[dict], records: Sequence[dict] = ()) -> str | None:
  """The paper's 400M numbers beside ours, when the results are a ~400M 16/32-layer sweep
  trained with ``PAPER_RECIPE`` at one total parameter count (``records``: the runs, whose
  configs and counts say; otherwise one line saying why they are not compared)."""
  fam = [r for r in rows if r["ref_depths"] == PAPER_DEPTHS and r["params_median"]
         and PAPER_TOTAL_RANGE[0] <= r["params_median"] <= PAPER_TOTAL_RANGE[1]
         and r["design"] in PAPER_400M]
  if not fam:
    return None
  families = {f["family"] for f in fam}
  differ = recipe_differences(r for r in records if r.get("family") in families)
  if differ:
    paper = ", ".join(f"{k}={v!r}" for k, v in PAPER_RECIPE.items())
    return (f"Not compared: these runs trained with {', '.join(differ)}; the paper's losses "
            f"are at {paper}, so the two are not the same quantity.")
  spread = off_iso_total(r for r in records if r.get("family") in families)
  if spread:
    lo, hi = spread
    return (f"Not compared: the {PAPER_DEPTHS[0]}- and {PAPER_DEPTHS[1]}-layer models hold "
            f"{_params(lo)} and {_params(hi)} parameters ({hi / lo - 1:+.1%}); the paper's "
            f"losses compare shapes of one total (~400M), within {PAPER_ISO_TOTAL_TOL:.0%}.")
  lines = ["| architecture | paper 16L | ours 16L | paper 32L | ours 32L | paper trend | "
           "our trend |", "|---|---|---|---|---|---|---|"]
  for r in fam:
    p16, p32, note = PAPER_400M[r["design"]]
    ours16 = _with_marks(_fmt(r["loss_lo"]), r["marks_lo"])
    ours32 = _with_marks(_fmt(r["loss_hi"]), r["marks_hi"])
    lines.append(f"| {r['design']} | {_fmt(p16)} | {ours16} | {_fmt(p32)} | {ours32} | {note} | "
                 f"{r['trend']} |")
  return "\n".join(lines)


def off_iso_total(records: Iterable[dict]) -> tuple[float, float] | None:
  """``(lo, hi)``, the median totals of ``records`` at the paper's two depths, when they differ
  by more than ``PAPER_ISO_TOTAL_TOL`` (not one iso-parameter sweep, as the paper's losses and
  diagnostics are: the iso-backbone suite's 32x864 beside 16x1216); else None."""
  totals = _median_totals_by_depth(records)
  lo, hi = (totals.get(depth) for depth in PAPER_DEPTHS)
  return (lo, hi) if lo and hi and abs(hi / lo - 1) > PAPER_ISO_TOTAL_TOL else None


def _median_totals_by_depth(records: Iterable[dict]) -> dict[int, float]:
  """``{n_layers: median params_total}`` over the records that state one."""
  by_depth: dict[int, list[int]] = {}
  for r in records:
    if r.get("params_total"):
      by_depth.setdefault(r["n_layers"], []).append(r["params_total"])
  return {depth: statistics.median(v) for depth, v in by_depth.items()}


def _unusable_cell(r: dict) -> str:
  """Why a run is not in the best-LR choice: diverged (at its step), a non-finite val loss
  under status 'ok', or its status."""
  if r.get("status") == "diverged":
    step = r.get("diverged_step")
    return f"diverged{f' @{step}' if step is not None else ''}"
  if r.get("status") == "ok":
    return f"val loss {r.get('final_val_loss')}"
  return str(r.get("status") or "unfinished")


def lr_table(records: Sequence[dict], groups: dict, gaps: dict | None = None) -> str:
  """Per (design, shape): val loss at every LR tried; best in bold with its ``lr_marks``,
  diverged marked; an LR of the grid without a result there says ``no summary yet`` (a folder
  without a summary), ``not started`` (planned, no folder) or ``not run`` (``grid_gaps``); a
  shape the plan lists that no run has reached is a row of such cells."""
  gaps = gaps or {}
  lrs = sorted({r["lr"] for r in records} | {lr for g in gaps.values()
                                             for lr in g["pending"] + g["not_started"]
                                             + g["other_recipe"]})
  lines = ["| design | shape | AR | " + " | ".join(f"lr {format_lr(lr)}" for lr in lrs) + " |",
           "|---|---|---|" + "---|" * len(lrs)]
  order = _design_order(list(records) + [{"design": k[0]} for k in gaps])
  for key in sorted(set(groups) | set(gaps), key=lambda k: (order.index(k[0]), k[1], k[2])):
    group = groups.get(key, {"runs": [], "best": None})
    gap = gaps.get(key, {"pending": [], "missing": [], "not_started": [], "other_recipe": []})
    cells = []
    for lr in lrs:
      runs = [r for r in group["runs"] if r["lr"] == lr]
      if not runs:
        cells.append("other recipe" if lr in gap["other_recipe"] else
                     "no summary yet" if lr in gap["pending"] else
                     "not started" if lr in gap["not_started"] else
                     "not run" if lr in gap["missing"] else "")
        continue
      # Several runs at one LR (a copy in another folder): the best if it is one of them, else
      # a usable one, and the count, so no run that decides the scorecard is hidden.
      r = next((x for x in runs if x is group["best"]), None) or next(
          (x for x in runs if is_usable(x)), runs[0])
      more = f" ({len(runs)} runs)" if len(runs) > 1 else ""
      if not is_usable(r):
        cells.append(_unusable_cell(r) + more)
      elif r is group["best"]:
        cells.append(_with_marks(f"**{r['final_val_loss']:.3f}**", lr_marks(key, groups, gaps))
                     + more)
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
    reason = r.get("diverged_reason") or (
        f"final val loss {r.get('final_val_loss')}" if r.get("status") == "ok" else "")
    lines.append(f"| {r['name']} | {r.get('status') or 'unfinished'} | "
                 f"{r.get('diverged_step') if r.get('diverged_step') is not None else ''} | "
                 f"{reason} |")
  return "\n".join(lines)


def hook_sections(records: Sequence[dict],
                  relative_to: str | None = None) -> list[tuple[str, str]]:
  """Optional sections from diagnostics/evals/systems, imported lazily; skipped when the module
  or function is absent, or no run carries the file it reads. A failing hook is reported, not
  raised. Each hook gets every record (it skips those without its file), so its best-LR runs
  are the scorecard's: given only the runs with the file, a hook picked its "best" among them,
  and a (design, shape) whose best LR had not been diagnosed showed another LR's figures. Each
  hook gets the report's folder as ``relative_to``: links to run files (the diagnostics'
  heatmaps) are relative to it, so they survive the folder being copied or moved."""
  sections = []
  for package, fn_name, needed_file in HOOKS:
    if needed_file is not None and not any(
        os.path.exists(os.path.join(r["workdir"], needed_file)) for r in records):
      continue
    runs = list(records)
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
                 relative_to: str | None = None, plan: Sequence[dict] | None = None,
                 progress: str | None = None, set_aside: Sequence[tuple] = ()) -> str:
  """report.md's text; ``relative_to``: the folder it goes to (links to run files are relative
  to it; else absolute). ``plan``: the suite's planned runs (``report.plan.load_plan``), whose
  grid the LR table and ``§`` then read; ``progress``: its markdown, put under the title;
  ``set_aside``: runs of another recipe (``set_aside_other_recipes``), listed, not compared."""
  records = list(records)
  assign_families(records)
  groups = select_best_lr(records)
  gaps = grid_gaps(records, unfinished, plan)
  rows = scorecard_rows(records, groups, gaps)
  n_div = sum(r.get("status") == "diverged" for r in records)
  n_retrained = sum(bool(p.get("retrain")) for p in plan or ())   # report.plan._state
  # Finished 'ok' with a NaN/inf val loss: excluded like a diverged run, so counted beside it.
  n_bad = sum(r.get("status") == "ok" and not is_usable(r) for r in records)
  # Trained on with skip_nonfinite_steps (a diverged run resumed so): compared, but named.
  skipped = sorted(f"{r['name']} ({r['skipped_steps']})" for r in records
                   if isinstance(r.get("skipped_steps"), int) and r["skipped_steps"] > 0)
  parts = [f"# {title}", ""] + ([progress, ""] if progress else []) + [
           f"{len(records)} runs, {len({r['design'] for r in records})} designs, "
           f"{len({(r['n_layers'], r['d_model']) for r in records})} shapes; {n_div} diverged"
           + (f" ({n_retrained} of them to be retrained by the sweep)" if n_retrained else "")
           + "; "
           + (f"{n_bad} with a non-finite final val loss; " if n_bad else "")
           + (f"{len(skipped)} skipped non-finite steps ({', '.join(skipped)}); "
              if skipped else "")
           + f"{len(unfinished)} without a summary. "
           "Every shape at its design's best LR (lowest final val loss; diverged runs "
           "excluded)." + code_versions_note(records), ""]
  if records:
    parts += ["## Val loss and depth trend", "",
              scorecard_markdown(rows, "".join(lr_marks(k, groups, gaps) for k in groups)), "",
              "Depth trend: the deeper reference depth against the shallower one at each "
              f"design's best LR (ties within {TREND_TOL}: flat); 'peak in the middle' when an "
              "in-between depth beats both." + size_spread_note(records)
              + token_budget_note(records, groups), ""]
    paper = paper_comparison(rows, records)
    if paper:
      parts += ["## Against the paper (400M)", "", paper, ""]
    parts += ["## Val loss by LR", "", lr_table(records, groups, gaps), ""]
  else:   # Every finished run set aside: no empty table under a heading.
    parts += ["No finished run of this recipe to compare.", ""]
  if set_aside:
    parts += [f"## Set aside: {len(set_aside)} run{'s' if len(set_aside) > 1 else ''} of "
              f"another recipe", "", set_aside_markdown(set_aside, relative_to), ""]
  excluded = excluded_markdown(groups)
  if excluded:
    parts += ["## Diverged and unfinished runs (excluded from best-LR selection)", "",
              excluded, ""]
  waiting = unfinished_markdown(unfinished)
  if waiting:
    parts += ["## Runs without a summary (training, interrupted or crashed; a sweep resumes "
              "them from their last checkpoint)", "", waiting, ""]
  if plot_files:
    from depthbench_jax.report.plots import PLOT_CAPTION  # Local: matplotlib.
    parts += ["## Loss vs aspect ratio", "", PLOT_CAPTION, ""]
    parts += [f"![{os.path.basename(p)}]({p})" for p in plot_files] + [""]
  for name, text in hook_sections(records, relative_to):
    parts += [f"## {name}", "", text, ""]
  parts += ["All runs: [runs.csv](runs.csv)."]
  return "\n".join(parts) + "\n"


def size_spread_note(records: Sequence[dict], tol: float = PAPER_ISO_TOTAL_TOL) -> str:
  """`` The shapes [of family F] are not iso-parameter: ...`` when a family's shapes (each at its
  smallest run: the backbone's) differ by more than ``tol`` in both total and non-embedding
  parameters: its depth trend is also a size trend (a shape typed in off the solver's width;
  the iso-backbone control keeps the non-embedding count and is not named)."""
  notes = []
  for family in sorted({r.get("family", 0) for r in records}):
    sizes: dict[tuple, tuple] = {}
    for r in records:
      if r.get("family", 0) == family and r.get("params_total") and r.get(
          "params_non_embedding"):
        key = (r["n_layers"], r["d_model"])
        sizes[key] = min(sizes.get(key, (math.inf, math.inf)),
                         (r["params_total"], r["params_non_embedding"]))
    if len(sizes) < 2:
      continue
    small = min(sizes, key=lambda k: sizes[k][0])
    large = max(sizes, key=lambda k: sizes[k][0])
    spread = [max(v[i] for v in sizes.values()) / min(v[i] for v in sizes.values()) - 1
              for i in (0, 1)]
    if min(spread) > tol:
      notes.append(f" The shapes{f' of family {family}' if family else ''} are not "
                   f"iso-parameter: {small[0]}x{small[1]} has {sizes[small][0]:,} parameters, "
                   f"{large[0]}x{large[1]} {sizes[large][0]:,} (+{100 * spread[0]:.1f}%), so "
                   f"the depth trend is also a size trend.")
  return "".join(notes)


def token_budget_note(records: Sequence[dict], groups: dict, tol: float = 0.005) -> str:
  """`` At LxD the designs' best-LR runs trained different token counts: ...`` where they differ
  by more than ``tol`` (every summary records its ``tokens``): a budget mix-up the recipe check
  cannot see, e.g. a run from before ``budget_design`` existed (MoDA then trained 12-14% more
  tokens, and its config has no field to differ in)."""
  by_shape: dict[tuple, dict[str, int]] = {}
  for (design, n_layers, d_model), group in groups.items():
    best = group["best"]
    if best is not None and isinstance(best.get("tokens"), (int, float)) and best["tokens"] > 0:
      by_shape.setdefault((best.get("family", 0), n_layers, d_model), {})[design] = best["tokens"]
  notes = []
  for (_, n_layers, d_model), tokens in sorted(by_shape.items()):
    if len(tokens) > 1 and max(tokens.values()) / min(tokens.values()) - 1 > tol:
      notes.append(f" At {n_layers}x{d_model} the designs' best-LR runs trained different token "
                   f"counts (" + ", ".join(f"{d} {human(t)}" for d, t in tokens.items())
                   + "): their losses compare budgets too.")
  return "".join(notes)


def code_versions_note(records: Sequence[dict]) -> str:
  """`` Trained at N code revisions ...`` when the runs' last commits (``summary.json``
  ``code``, ``revision.label``) differ, or a run resumed under another commit; else ``''``."""
  last = {revision.label(r["code"][-1:]) for r in records if r.get("code")}
  resumed = sum(len(r.get("code") or ()) > 1 for r in records)
  if len(last) < 2 and not resumed:
    return ""
  return (f" Trained at {len(last)} code revisions"
          + (f", {resumed} of the runs resumed under another" if resumed else "")
          + ": runs.csv's commit column says which; a comparison across them mixes code "
          "versions.")


def write_csv(records: Sequence[dict], path: str, groups: dict) -> None:
  """``runs.csv``, whole or not at all (as report.md): a report stopped mid-write left a torn
  one over the last."""
  from depthbench_jax.train.summary import atomic_write_text  # Local, and light.
  best = [g["best"] for g in groups.values() if g["best"] is not None]
  text = io.StringIO(newline="")
  writer = csv.DictWriter(text, fieldnames=CSV_FIELDS, extrasaction="ignore")
  writer.writeheader()
  for r in records:
    writer.writerow({**{k: r.get(k) for k in CSV_FIELDS},
                     "best_lr": any(r is b for b in best),   # not by name: names repeat
                     "commit": revision.label(r.get("code"))})
  atomic_write_text(path, text.getvalue())


def write_report(results_dir: str, out_dir: str | None = None, plots: bool = True,
                 config_path: str | None = None) -> list[str] | None:
  """Writes report.md, runs.csv and plots/ for ``results_dir``; returns the paths (None if no
  runs and no plan). Before any run has finished, report.md is where the runs stand
  (``unfinished``). With ``config_path`` (the suite swept) it also reads the plan
  (``report.plan``): progress, ``not started`` cells and the run folders the suite lacks; a bad
  suite is a ConfigError before anything is written."""
  from depthbench_jax.report import plan as plan_lib
  from depthbench_jax.train.summary import atomic_write_text  # Local, and light.
  plan = plan_lib.load_plan(config_path, results_dir) if config_path is not None else None
  records, unfinished = collect_runs(results_dir), collect_unfinished(results_dir)
  if not records and not unfinished and plan is None:
    return None
  # Once, over every run folder (the planned ones among them: each planned run that trained
  # has a summary or checkpoints); load_plan built every trained planned run's config again.
  other = (plan_lib.other_recipe_runs(
      config_path, records + unfinished,
      planned={os.path.abspath(p["workdir"]): p["arg"] for p in plan or ()})
           if config_path is not None else {})
  for p in plan or ():
    if os.path.abspath(p["workdir"]) in other:   # refused by the sweep: not retrained either
      p["state"], p["retrain"] = "other recipe", False
  progress = None
  if plan is not None:
    on_disk = [r["workdir"] for r in records + unfinished]
    off = plan_lib.off_plan(plan, on_disk, results_dir)
    if on_disk and len(off) == len(on_disk):
      planned = (f"it plans e.g. {os.path.basename(plan[0]['workdir'])}" if plan else
                 "it plans no run")
      print(f"warning: --config={config_path} plans none of the {len(on_disk)} run folders in "
            f"{results_dir} ({planned}): is it the suite swept into them?", file=sys.stderr,
            flush=True)
    aside_off = plan_lib.off_plan(plan, [w for w in on_disk if os.path.abspath(w) in other],
                                  results_dir)
    progress = plan_lib.progress_markdown(plan, config_path,
                                          [w for w in off if w not in aside_off], aside_off)
  out_dir = out_dir or results_dir
  os.makedirs(out_dir, exist_ok=True)
  title = f"DepthBench scorecard: {os.path.basename(os.path.normpath(results_dir))}"
  report_path = os.path.join(out_dir, "report.md")
  if not records:
    head = f"# {title}\n\n" + (f"{progress}\n\n" if progress else "")
    table = f"\n\n{unfinished_markdown(unfinished)}" if unfinished else ""
    atomic_write_text(report_path, f"{head}{len(unfinished)} runs started; no run has "
                      f"finished yet.{table}\n")
    return [report_path]
  every = records
  records, aside = set_aside_other_recipes(records, plan or (), other)
  # Runs without a summary of another recipe: named with the others, not a gap of the grid.
  aside += [(u, other[os.path.abspath(u["workdir"])]) for u in unfinished
            if os.path.abspath(u["workdir"]) in other]
  unfinished = [u for u in unfinished if os.path.abspath(u["workdir"]) not in other]
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
                                              unfinished=unfinished, relative_to=out_dir,
                                              plan=plan, progress=progress,
                                              set_aside=aside))
  csv_path = os.path.join(out_dir, "runs.csv")
  aside_ids = {id(r) for r, _ in aside}
  for r in every:   # the runs set aside are listed too: none is the best LR
    r["set_aside"] = id(r) in aside_ids
  write_csv(every, csv_path, groups)
  return [report_path, csv_path] + plot_files
