"""The bench's result as a picture: each design's step time and peak memory over Pre-LN.

Left panel, per design (one group of bars per shape): the bar is the reported ratio (median
step over Pre-LN's median step), the whisker the interquartile range of the per-round ratios
(design_i / Pre-LN_i, timed in the same round) and the dot their median: when the dot sits far
from the bar's top, or the whisker spans a target, the run cannot tell that ratio apart from
its noise. Step-time targets are dashed ticks on their designs' bars at the first shape (where
the verdict checks them). Right panel: peak memory (``memory_analysis`` of the compiled step)
over Pre-LN's, exact, no whiskers. With several shapes a third panel draws the cost of depth:
each design's step over Pre-LN at the first shape (``step_over_first_preln``), whiskered alike.
"""

from __future__ import annotations

from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position


def _whiskered_bars(ax, xs, values, bands, width, label):
  """Bars at ``values`` with the per-round IQR ``bands`` as whiskers around their medians."""
  ax.bar(xs, values, width * 0.9, label=label, alpha=0.8)
  ax.errorbar(xs, [b["median"] for b in bands],
              yerr=[[b["median"] - b["q1"] for b in bands], [b["q3"] - b["median"] for b in bands]],
              fmt="o", ms=3, color="black", capsize=3, lw=1)


def plot_bench(rows: Sequence[dict], path: str, targets: dict[str, float], title: str) -> str:
  """Writes the PNG of the bench's ``train`` rows to ``path`` (two panels; a third, the cost of
  depth, with several shapes); returns ``path``.

  ``targets``: design -> its step-over-Pre-LN target, drawn at the first shape.
  """
  designs = list(dict.fromkeys(r["design"] for r in rows))
  shapes = list(dict.fromkeys(r["shape"] for r in rows))
  width = 0.8 / len(shapes)
  depth = len(shapes) > 1 and all("step_over_first_preln" in r for r in rows)
  panels = 3 if depth else 2
  fig, axes = plt.subplots(1, panels, figsize=(max(9.0, 1.1 * len(designs) + 3) * panels / 2,
                                               4.4))
  ax_t, ax_m = axes[0], axes[1]
  for s, shape in enumerate(shapes):
    by_design = {r["design"]: r for r in rows if r["shape"] == shape}
    xs = [d + (s - (len(shapes) - 1) / 2) * width for d in range(len(designs))]
    present = [(x, by_design[name]) for x, name in zip(xs, designs) if name in by_design]
    px = [x for x, _ in present]
    step = [r["step_over_preln"] for _, r in present]
    bands = [r.get("step_over_preln_rounds") or {"q1": v, "median": v, "q3": v}
             for (_, r), v in zip(present, step)]
    _whiskered_bars(ax_t, px, step, bands, width, shape)
    if depth:
      _whiskered_bars(axes[2], px, [r["step_over_first_preln"] for _, r in present],
                      [r["step_over_first_preln_rounds"] for _, r in present], width, shape)
    ax_m.bar(px, [r["peak_over_preln"] for _, r in present], width * 0.9, label=shape,
             alpha=0.8)
    for x, r in present:
      if s == 0 and r["design"] in targets:
        ax_t.hlines(targets[r["design"]], x - width / 2, x + width / 2, colors="red",
                    linestyles="dashed", lw=1.5)
  titles = [(ax_t, "train step / Pre-LN (bar: ratio of medians;\n"
                   "dot, whisker: per-round median, IQR)"),
            (ax_m, "peak memory / Pre-LN (memory_analysis)")]
  if depth:
    titles.append((axes[2], f"cost of depth: train step / Pre-LN at {shapes[0]}"))
  for ax, panel in titles:
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(designs)), designs, rotation=35, ha="right", fontsize=8)
    ax.set_title(panel, fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    low = min(min(p.get_height() for p in ax.patches), 0.9)
    ax.set_ylim(bottom=max(0.0, low - 0.05))
    if len(shapes) > 1:
      ax.legend(fontsize=8)
  # A legend entry only where a dashed line is drawn (none with --designs=mhc).
  if any(r["design"] in targets for r in rows if r["shape"] == shapes[0]):
    ax_t.plot([], [], "r--", label="target")
  if ax_t.get_legend_handles_labels()[0]:
    ax_t.legend(fontsize=8)
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path
