"""The report's layer-diagnostics section: a markdown table and the heatmaps to embed.

``runs`` is a list of ``(summary, diagnostics)``: a run's ``summary.json`` and its
``diagnostics.json`` (``diagnose.py``). The scorecard's run records (dicts with ``workdir``, see
``report/scorecard.py``) are accepted too: their ``diagnostics.json`` is read. One row per run,
sorted by design, depth, width, LR.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Iterable, Sequence

from depthbench_jax.train.summary import step_mark

Run = tuple[dict, dict]


def as_runs(runs: Iterable[Any]) -> list[Run]:
  """``(summary, diagnostics)`` pairs from pairs or from records with a ``workdir`` (records
  without a readable ``diagnostics.json`` are dropped)."""
  out = []
  for run in runs:
    if isinstance(run, dict):
      try:
        with open(os.path.join(run["workdir"], "diagnostics.json")) as f:
          diag = json.load(f)
      except (KeyError, OSError, json.JSONDecodeError):
        continue
      diag["workdir"] = run["workdir"]   # where the run is now, not where it was diagnosed
      out.append((run, diag))
    else:
      summary, diag = run
      out.append((summary, diag))
  return out

HEATMAPS = ("causal", "permutation", "angular")


def _design(summary: dict, diag: dict) -> str:
  return summary.get("design") or diag.get("design") or "?"   # the report's label first


def _depth(summary: dict, diag: dict) -> int | None:
  if diag.get("n_layers") is not None:
    return int(diag["n_layers"])
  model = (summary.get("config") or {}).get("model") or {}
  return model.get("n_layers")


def _pct(value: Any) -> str:
  return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else (
      f"{100 * value:.1f}%")


def _num(value: Any, digits: int = 3) -> str:
  return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else (
      f"{value:.{digits}f}")


def _width(summary: dict, diag: dict) -> int | None:
  if summary.get("d_model") is not None:
    return int(summary["d_model"])
  return ((summary.get("config") or {}).get("model") or {}).get("d_model")


def _lr(summary: dict) -> float | None:
  lr = summary.get("lr", (summary.get("config") or {}).get("lr"))
  return float(lr) if isinstance(lr, (int, float)) else None


def _sorted(runs: Iterable[Run]) -> list[Run]:
  return sorted(as_runs(runs), key=lambda r: (_design(*r), _depth(*r) or 0, _width(*r) or 0,
                                              _lr(r[0]) or 0.0, r[0].get("name") or ""))


def _thresholds(runs: Sequence[Run], key: str) -> set:
  return {d[key]["threshold"] for _, d in runs if "threshold" in (d.get(key) or {})}


def _share_cell(diag: dict, key: str, per_cell: bool, mixed_skips: bool = False) -> str:
  """The ``key`` share; with ``per_cell`` (runs at other thresholds) followed by its own; a
  causal share reduced over tokens by other than the mean (``causal_reduction='max'``, never
  below the mean's) says so, and with ``mixed_skips`` (``_mixed_skips``) so does one scored
  with the layer skipped as absent (``causal_skip``, and every diagnostics.json from before the
  option)."""
  scored = diag.get(key) or {}
  cell = _pct(scored.get("share"))
  cell += f" (>{scored['threshold']:g})" if per_cell and "threshold" in scored else ""
  reduction = scored.get("reduction", "mean")
  cell += f" ({reduction} over tokens)" if reduction != "mean" else ""
  return cell + (_absent_mark(scored) if mixed_skips and key == "causal" else "")


def _absent_mark(causal: dict) -> str:
  """`` (layer absent)`` after a causal share scored with the layer skipped as absent (no mark
  on no score: run_causal off), else ``''``."""
  return " (layer absent)" if "share" in causal and not _spec_skip(causal) else ""


def _mixed_skips(runs: Sequence[Run]) -> bool:
  """The runs' causal scores skipped a layer in both ways (``skips_used``)."""
  return len({_spec_skip(d["causal"]) for _, d in runs if "causal" in d}) > 1


def _spec_skip(causal: dict) -> bool:
  """``metrics.is_spec_skip``, imported here only when a table needs it (metrics imports jax)."""
  from depthbench_jax.diagnostics.metrics import is_spec_skip
  return is_spec_skip(causal)


def diagnostics_table(runs: Sequence[Run]) -> str:
  """Markdown: per design and depth, the late-pair shares and the design-specific numbers.

  Columns: causal share (``C > 0.45``), permutation share (``P > 0.15``), mean consecutive
  angular distance of the late layers, erank of the late-span mixing product (HC/mHC), the Block
  AttnRes dead prefix (leading layers below the own-block threshold), the held-out loss the
  diagnostics saw. '-' where a run lacks the measure; a diverged run's lr reads "(diverged)",
  one diagnosed at an earlier checkpoint "(step s of n)". Runs scored at other thresholds than
  each other name theirs in each cell (the header once showed the default over them).
  """
  runs = _sorted(runs)
  thresholds = {key: _thresholds(runs, key) for key in ("causal", "permutation")}
  per_cell = {key: len(values) > 1 for key, values in thresholds.items()}
  mixed = _mixed_skips(runs)
  head = {key: f"{key} {key[0].upper()}>{min(values):g}" if len(values) == 1 else
          f"{key} share (>threshold)" for key, values in thresholds.items()}
  lines = [
      f"| design | L | d | lr | {head['causal']} | {head['permutation']} | "
      "angular d(l,l+1) late | erank (late) | dead prefix | loss |",
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
  ]
  for summary, diag in runs:
    mixing = diag.get("mixing") or {}
    dead = diag.get("dead_prefix") or {}
    lr = _lr(summary)
    lr_cell = ("-" if lr is None else f"{lr:g}") + (
        " (diverged)" if summary.get("status") == "diverged" else "") + step_mark(summary, diag)
    lines.append(
        f"| {_design(summary, diag)} | {_depth(summary, diag) or '?'} "
        f"| {_width(summary, diag) or '-'} | {lr_cell} "
        f"| {_share_cell(diag, 'causal', per_cell['causal'], mixed)} "
        f"| {_share_cell(diag, 'permutation', per_cell['permutation'])} "
        f"| {_num((diag.get('angular') or {}).get('late_consecutive_mean'))} "
        f"| {_num(mixing.get('erank_late'), 2)} "
        f"| {dead.get('dead_prefix', '-')} "
        f"| {_num(diag.get('loss'))} |")
  lines += ["", "loss: the held-out loss of the rows the probes read (diagnostics "
            "batch_size rows of the first validation batch), not the run's val loss."
            + (" (step s of n) after the lr: diagnosed at checkpoint s of a run of n steps."
               if any(step_mark(*run) for run in runs) else "")]
  return "\n".join(lines) + "\n"


def share_pivot(runs: Sequence[Run], key: str = "causal") -> str:
  """Markdown: rows = designs, columns = depths (shapes ``LxD`` when a depth has several widths,
  the multi-scale suite), cells = the ``key`` share (compact overview; with several runs per
  cell the lowest-loss run's; a run with a non-finite loss or status 'diverged' never fills a
  cell), marked like ``diagnostics_table``'s (thresholds when mixed, an earlier step)."""
  runs = [r for r in _sorted(runs) if math.isfinite(_loss(r))
          and r[0].get("status") != "diverged"]
  widths: dict[int, set] = {}
  for r in runs:
    widths.setdefault(_depth(*r), set()).add(_width(*r))
  by_shape = any(len(w) > 1 for w in widths.values())
  column = lambda r: (_depth(*r) or 0, _width(*r) or 0) if by_shape else (_depth(*r) or 0, 0)
  per_cell, mixed = len(_thresholds(runs, key)) > 1, _mixed_skips(runs)
  cells: dict[tuple[str, tuple], Any] = {}
  for run in sorted(runs, key=lambda r: -_loss(r)):   # the lowest loss written last
    cells[(_design(*run), column(run))] = (_share_cell(run[1], key, per_cell, mixed)
                                           + step_mark(*run))
  columns = sorted({c for _, c in cells})
  designs = sorted({d for d, _ in cells})
  label = lambda c: f"{c[0]}x{c[1]}" if by_shape else f"L={c[0]}"
  lines = ["| design | " + " | ".join(label(c) for c in columns) + " |",
           "|---|" + "---:|" * len(columns)]
  for design in designs:
    lines.append(f"| {design} | " + " | ".join(cells.get((design, c), "-") for c in columns)
                 + " |")
  return "\n".join(lines) + "\n"


def heatmap_paths(runs: Sequence[Run], which: Sequence[str] = HEATMAPS) -> list[tuple[str, str]]:
  """``(caption, path)`` of each run's heatmap PNGs (``diagnostics.json`` ``plots``, made absolute
  with its ``workdir``), in table order; files that are missing are skipped."""
  out = []
  for summary, diag in _sorted(runs):
    plots = diag.get("plots") or {}
    root = diag.get("workdir") or ""
    for name in which:
      if name in plots:
        path = os.path.join(root, plots[name])
        if os.path.exists(path):
          out.append((f"{_design(summary, diag)} L={_depth(summary, diag)}: {name}", path))
  return out


def skips_used(runs: Sequence[Run]) -> str:
  """How the runs' causal scores skipped a layer (``causal.skip``), in words: one phrase, or
  each with its runs' count when they differ (an older diagnostics.json: 'absent'; the tables
  then mark those cells, ``_share_cell``)."""
  spec, absent = "by setting its sublayer outputs to zero (the spec)", "as absent (Csordas et al.)"
  used: dict[str, int] = {}
  for _, diag in runs:
    if "causal" in diag:
      phrase = spec if _spec_skip(diag["causal"]) else absent
      used[phrase] = used.get(phrase, 0) + 1
  if len(used) > 1:
    return ("in two ways, not comparable: " + "; ".join(f"{p} in {n} runs" for p, n in used.items())
            + " (marked 'layer absent')")
  return next(iter(used), spec)


def _loss(run: Run) -> float:
  """The loss diagnostics measured; inf when absent (``probes.to_jsonable`` stores a NaN loss
  as null, so a diverged model's reads inf too)."""
  loss = run[1].get("loss")
  return math.inf if loss is None else float(loss)


def deepest_per_design(runs: Sequence[Run]) -> list[Run]:
  """Each design's deepest run (lowest diagnostics loss among ties; runs with a non-finite loss
  never): the heatmaps worth showing."""
  best: dict[str, Run] = {}
  rank = lambda run: (_depth(*run) or 0, -_loss(run))
  for run in _sorted(runs):
    if not math.isfinite(_loss(run)):
      continue
    design = _design(*run)
    if design not in best or rank(run) > rank(best[design]):
      best[design] = run
  return list(best.values())


# DepthBench's diagnostics (the paper summary): at L = 32 the share of late pairs with a causal
# score above 0.45 and a permutation score above 0.15, design -> (causal, permutation); the
# effective rank of the residual products, design -> (low, high) over its runs; the Block
# AttnRes dead prefix at L = 32.
PAPER_DEPTH = 32
PAPER_SHARES = {"preln": (0.01, 0.08), "attnres_full": (0.16, 0.46), "hc": (0.07, 0.35)}
PAPER_ERANK = {"mhc": (1.44, 1.65), "hc": (2.53, 2.81)}
PAPER_DEAD_PREFIX = 8


def _paper_scale(summary: dict) -> bool:
  """A run of the paper's 400M suite: a total parameter count in the scorecard's 400M range and
  the paper's recipe (a multi-scale 200M or 500M run, or a long-context copy, is not)."""
  from depthbench_jax.report.scorecard import PAPER_TOTAL_RANGE, recipe_differences
  total = summary.get("params_total")
  return (isinstance(total, (int, float)) and PAPER_TOTAL_RANGE[0] <= total <= PAPER_TOTAL_RANGE[1]
          and not recipe_differences([summary]))


def paper_comparison(best: Sequence[Any], records: Sequence[dict] | None = None) -> str | None:
  """Markdown: the paper's diagnostics beside ours (``best``: the best-LR runs of the paper's
  scale and recipe, ``_paper_scale``, in a scale family whose 16- and 32-layer totals agree
  within the scorecard's ``PAPER_ISO_TOTAL_TOL``: over ``records``, the report's runs of that
  family, diagnosed or not, as the scorecard judges it; without them, over ``best``), for the
  designs and depth the paper reports,
  each of ours named by its shape; the shares only where ours used the paper's thresholds and the
  mean over tokens. None when no run matches. Our effective rank is ``erank_late`` (products
  from layer ceil(L/4) to the last) over every depth run; the paper gives a range without saying
  over what."""
  # Local: metrics imports jax, which this module's tables do not need.
  from depthbench_jax.diagnostics.metrics import (PAPER_CAUSAL_THRESHOLD,
                                                  PAPER_PERMUTATION_THRESHOLD)
  from depthbench_jax.report.scorecard import off_iso_total
  runs = [r for r in as_runs(best) if math.isfinite(_loss(r)) and _paper_scale(r[0])]
  by_family: dict[Any, list[Run]] = {}
  for run in runs:
    by_family.setdefault(run[0].get("family"), []).append(run)
  # One iso-parameter sweep per family, as the scorecard's own comparison asks.
  # Only L = 32 is compared, so a report diagnosing only its 32-layer runs left the family's
  # 16-layer total out and passed the iso-backbone 32x864 beside the scorecard's "Not compared".
  totals = lambda family, rs: ((r for r in records if r.get("family") == family)
                               if records is not None else
                               ({"n_layers": _depth(*r), "params_total": r[0]["params_total"]}
                                for r in rs))
  runs = [r for f, rs in by_family.items() if not off_iso_total(totals(f, rs)) for r in rs]
  at = lambda design, depth: [r for r in runs if _design(*r) == design and _depth(*r) == depth]
  shape = lambda run: f" ({_depth(*run)}x{_width(*run)})" if _width(*run) else ""
  rows = []
  for design, (causal, perm) in PAPER_SHARES.items():
    for summary, diag in at(design, PAPER_DEPTH):
      for key, paper, threshold in (("causal", causal, PAPER_CAUSAL_THRESHOLD),
                                    ("permutation", perm, PAPER_PERMUTATION_THRESHOLD)):
        scored = diag.get(key) or {}
        if (scored.get("threshold", threshold) == threshold and "share" in scored
            and scored.get("reduction", "mean") == "mean"):
          absent = _absent_mark(scored) if key == "causal" else ""
          rows.append(f"| {design} | {key} share > {threshold:g}, L={PAPER_DEPTH} | "
                      f"~{100 * paper:.0f}% | {_pct(scored['share'])}{absent}"
                      f"{shape((summary, diag))} |")
  for design, (low, high) in PAPER_ERANK.items():
    ranks = sorted(d["mixing"]["erank_late"] for s, d in runs if _design(s, d) == design
                   and isinstance((d.get("mixing") or {}).get("erank_late"), (int, float)))
    if ranks:
      ours = f"{ranks[0]:.2f}" + (f" to {ranks[-1]:.2f}" if len(ranks) > 1 else "")
      rows.append(f"| {design} | effective rank of the residual products | {low:.2f} to "
                  f"{high:.2f} | {ours} ({len(ranks)} run{'s' if len(ranks) > 1 else ''}) |")
  for summary, diag in at("attnres_block", PAPER_DEPTH):
    if "dead_prefix" in (diag.get("dead_prefix") or {}):
      rows.append(f"| attnres_block | dead prefix, L={PAPER_DEPTH} | {PAPER_DEAD_PREFIX} "
                  f"layers | {diag['dead_prefix']['dead_prefix']} layers"
                  f"{shape((summary, diag))} |")
  if not rows:
    return None
  return "\n".join(["| design | measure | paper | ours |", "|---|---|---|---|", *rows])


def section(runs: Sequence[Any], relative_to: str | None = None, heading: bool = True,
            heatmap_runs: str = "all", which: Sequence[str] = HEATMAPS,
            best: Sequence[Any] | None = None, records: Sequence[dict] | None = None) -> str:
  """The markdown section: the table of ``runs``, then the pivots and heatmaps of ``best`` (the
  report passes the best-LR runs; default ``runs``), and ``paper_comparison(best, records)``.

  Image paths are relative to ``relative_to`` (the report's folder) when given, else absolute.
  ``heatmap_runs``: 'all' runs, or 'deepest' (each design's deepest run only).
  """
  from depthbench_jax.diagnostics.metrics import (PAPER_CAUSAL_THRESHOLD,
                                                  PAPER_PERMUTATION_THRESHOLD)
  runs = as_runs(runs)
  best = runs if best is None else as_runs(best)
  rule = f"C > {PAPER_CAUSAL_THRESHOLD:g}, P > {PAPER_PERMUTATION_THRESHOLD:g}"
  # Runs diagnosed with other --set=thresholds name theirs in the header or the cells.
  own = (_thresholds(runs, "causal") - {PAPER_CAUSAL_THRESHOLD}
         or _thresholds(runs, "permutation") - {PAPER_PERMUTATION_THRESHOLD})
  thresholds = (f"thresholds as the table names them (DepthBench's: {rule})" if own
                else f"thresholds as in DepthBench ({rule})")
  parts = (["## Layer diagnostics\n"] if heading else []) + [
      f"Shares are over late pairs (both layers >= L/4); {thresholds}; share "
      "curves over thresholds are in each run's plots/diag_share_curves.png. Angular distance "
      "compares each design's residual-equivalent state after each layer (x; HC/mHC the sum of "
      "streams; AttnRes the sum of its sources, Pre-LN's x: not a layer's own read); the causal "
      f"score skips a layer {skips_used(runs)}. diagnostics.json records both.\n",
      diagnostics_table(runs), "\nCausal share by depth:\n", share_pivot(best, "causal"),
      "\nPermutation share by depth:\n", share_pivot(best, "permutation"), ""]
  paper = paper_comparison(best, records)
  if paper:
    parts += ["Against the paper (DepthBench's reported diagnostics):\n", paper, ""]
  shown = deepest_per_design(best) if heatmap_runs == "deepest" else best
  for caption, path in heatmap_paths(shown, which):
    if relative_to:
      path = os.path.relpath(path, relative_to)
    parts.append(f"![{caption}]({path})")
  return "\n".join(parts) + "\n"
