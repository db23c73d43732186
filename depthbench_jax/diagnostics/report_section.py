"""The report's layer-diagnostics section: a markdown table and the heatmaps to embed.

``runs`` is a list of ``(summary, diagnostics)``: a run's ``summary.json`` and its
``diagnostics.json`` (``diagnose.py``). One row per run, sorted by design then depth.
"""

from __future__ import annotations

import math
import os
from typing import Any, Iterable, Sequence

Run = tuple[dict, dict]

HEATMAPS = ("causal", "permutation", "angular")


def _design(summary: dict, diag: dict) -> str:
  return diag.get("design") or summary.get("design") or "?"


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


def _sorted(runs: Iterable[Run]) -> list[Run]:
  return sorted(runs, key=lambda r: (_design(*r), _depth(*r) or 0, r[0].get("name") or ""))


def _threshold(runs: Sequence[Run], key: str, default: float) -> float:
  values = {d[key]["threshold"] for _, d in runs if key in d}
  return values.pop() if len(values) == 1 else default


def diagnostics_table(runs: Sequence[Run]) -> str:
  """Markdown: per design and depth, the late-pair shares and the design-specific numbers.

  Columns: causal share (``C > 0.45``), permutation share (``P > 0.15``), mean consecutive
  angular distance of the late layers, erank of the late-span mixing product (HC/mHC), the Block
  AttnRes dead prefix (leading layers below the own-block threshold), the held-out loss the
  diagnostics saw. '-' where a run lacks the measure.
  """
  runs = _sorted(runs)
  tc = _threshold(runs, "causal", 0.45)
  tp = _threshold(runs, "permutation", 0.15)
  lines = [
      f"| design | L | causal C>{tc:g} | permutation P>{tp:g} | angular d(l,l+1) late | "
      "erank (late) | dead prefix | loss |",
      "|---|---:|---:|---:|---:|---:|---:|---:|",
  ]
  for summary, diag in runs:
    mixing = diag.get("mixing") or {}
    dead = diag.get("dead_prefix") or {}
    lines.append(
        f"| {_design(summary, diag)} | {_depth(summary, diag) or '?'} "
        f"| {_pct((diag.get('causal') or {}).get('share'))} "
        f"| {_pct((diag.get('permutation') or {}).get('share'))} "
        f"| {_num((diag.get('angular') or {}).get('late_consecutive_mean'))} "
        f"| {_num(mixing.get('erank_late'), 2)} "
        f"| {dead.get('dead_prefix', '-')} "
        f"| {_num(diag.get('loss'))} |")
  return "\n".join(lines) + "\n"


def share_pivot(runs: Sequence[Run], key: str = "causal") -> str:
  """Markdown: rows = designs, columns = depths, cells = the ``key`` share (compact overview)."""
  runs = _sorted(runs)
  depths = sorted({_depth(*r) for r in runs if _depth(*r) is not None})
  cells: dict[tuple[str, int], Any] = {}
  for summary, diag in runs:
    cells[(_design(summary, diag), _depth(summary, diag))] = (diag.get(key) or {}).get("share")
  designs = sorted({d for d, _ in cells})
  lines = ["| design | " + " | ".join(f"L={d}" for d in depths) + " |",
           "|---|" + "---:|" * len(depths)]
  for design in designs:
    lines.append(f"| {design} | " + " | ".join(_pct(cells.get((design, d))) for d in depths)
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


def section(runs: Sequence[Run], relative_to: str | None = None) -> str:
  """The whole markdown section: tables plus embedded heatmaps (paths relative to the report)."""
  parts = ["## Layer diagnostics\n",
           "Shares are over late pairs (both layers >= L/4); thresholds as in DepthBench.\n",
           diagnostics_table(runs), "\nCausal share by depth:\n", share_pivot(runs, "causal"),
           "\nPermutation share by depth:\n", share_pivot(runs, "permutation"), ""]
  for caption, path in heatmap_paths(runs):
    if relative_to:
      path = os.path.relpath(path, relative_to)
    parts.append(f"![{caption}]({path})")
  return "\n".join(parts) + "\n"
