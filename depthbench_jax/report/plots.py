"""Loss vs aspect ratio (d_model / n_layers): one PNG per design and one with every design.

x: aspect ratio on a log axis, reversed, so depth grows to the right (shallow-wide on the left,
deep-narrow on the right, as the paper reads). y: final val loss. The line joins each shape's
best-LR run (per scale family), broken at a shape another design ran where this one has no
usable run; grey dots are the other LRs; diverged runs and finished ones without a finite val
loss are red crosses on the lower edge, below a dashed line under the losses, at their aspect
ratio, each labelled with its LR: a position, not a value (``PLOT_CAPTION``, printed above the
report's plots).
"""

from __future__ import annotations

import math
import os
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.ticker  # pylint: disable=g-import-not-at-top,wrong-import-position
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

from depthbench_jax.sweep import (format_lr, is_usable,  # pylint: disable=wrong-import-position
                                  record_lr, shape_key)

PLOT_CAPTION = ("Each design's line joins its best-LR run at each shape (lowest final val loss); "
                "grey dots are its other LRs, hollow ones its other runs (seeds, copies) at "
                "the best LR; a red cross below the dashed line is a run that "
                "diverged or finished with a non-finite val loss (labelled with its LR), at its "
                "aspect ratio: it has no val loss to draw, so its height means nothing.")


def _best_curves(records: Sequence[dict], groups: dict, design: str) -> dict[int, list]:
  """{family: [(aspect_ratio, loss, n_layers), ...] sorted by AR} at the best LR; a shape of the
  family (any design's) where ``design`` has no usable run has loss NaN, which breaks the line
  there rather than joining its neighbours across the gap."""
  curves: dict[int, list] = {}
  seen = set()
  for r in records:
    key = (design, r["n_layers"], r["d_model"])
    if key in seen:
      continue
    seen.add(key)
    best = groups.get(key, {}).get("best")
    curves.setdefault(r["family"], []).append(
        (r["aspect_ratio"], best["final_val_loss"] if best else math.nan, r["n_layers"]))
  return {f: sorted(c, reverse=True) for f, c in curves.items()
          if any(math.isfinite(loss) for _, loss, _ in c)}


def design_colors(designs: Sequence[str]) -> dict:
  """One colour per design, by the registry's order of every design: matplotlib's ten-colour
  cycle (C0..C9), so a design keeps its colour across figures and reports (by order of
  appearance, HC was C3 in the report's plot and C1 in the decode bench's). Other labels
  (variants such as ``hc(n_streams=2)``) take ``tab20``'s light shades in order, none of
  C0..C9, so a variant never moves a design's colour (one did, by making eleven labels); past
  ten of either, one ``tab20``/``turbo`` cycle over all (an eleventh design took C0 again)."""
  try:
    from depthbench_jax.residual import registry  # Local: pulls in jax/flax.
    known = list(registry.names())
  except Exception:  # pylint: disable=broad-except  # a plot without the model code
    known = []
  given = list(dict.fromkeys(designs))
  others = [d for d in given if d not in known]
  if len(known) <= 10 and len(others) <= 10:
    light = matplotlib.colormaps["tab20"]   # tab20's even shades are C0..C9, its odd lighter
    colors = {**_cycle(known), **{d: light(2 * i + 1) for i, d in enumerate(others)}}
  else:
    colors = _cycle(known + others)
  return {d: colors[d] for d in given}


def _cycle(designs: list[str]) -> dict:
  if len(designs) <= 10:
    return {d: f"C{i}" for i, d in enumerate(designs)}
  cmap = matplotlib.colormaps["tab20" if len(designs) <= 20 else "turbo"]
  return {d: cmap(i if len(designs) <= 20 else i / (len(designs) - 1))
          for i, d in enumerate(designs)}


def _axes(ax, title: str, aspect_ratios: Sequence[float]):
  ax.set_xscale("log")
  ticks = sorted(set(round(a, 1) for a in aspect_ratios))
  if ticks:
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks], fontsize=7)
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
  ax.invert_xaxis()
  ax.set_xlabel("aspect ratio d_model / n_layers (log; deeper to the right)")
  ax.set_ylabel("final val loss (nats/token)")
  ax.set_title(title)
  ax.grid(True, alpha=0.3, which="both")


def loss_vs_aspect(records: Sequence[dict], groups: dict, out_dir: str) -> list[str]:
  """Writes ``loss_vs_aspect_<design>.png`` per design and ``loss_vs_aspect_all.png``; none
  without records (every run set aside: an empty axes was embedded)."""
  if not records:
    return []
  os.makedirs(out_dir, exist_ok=True)
  designs = []
  for r in records:
    if r["design"] not in designs:
      designs.append(r["design"])
  paths = []
  for design in designs:
    fig, ax = plt.subplots(figsize=(6, 4))
    mine = [r for r in records if r["design"] == design]
    others = [r for r in mine if is_usable(r) and groups[shape_key(r)]["best"] is not r]
    best_lr = lambda r: record_lr(r) == record_lr(groups[shape_key(r)]["best"])
    for label, dots, face in (("other LRs", [r for r in others if not best_lr(r)], "0.6"),
                              ("other runs at the best LR", [r for r in others if best_lr(r)],
                               "none")):
      if dots:   # A seed copy at the best LR was drawn as one of its "other LRs".
        ax.scatter([r["aspect_ratio"] for r in dots], [r["final_val_loss"] for r in dots],
                   s=12, facecolors=face, edgecolors="0.6", label=label, zorder=2)
    for family, curve in sorted(_best_curves(records, groups, design).items()):
      xs, ys, ls = zip(*curve)
      ax.plot(xs, ys, "o-", label=f"best LR (family {family})" if family else "best LR",
              zorder=3)
      for x, y, L in curve:
        if math.isfinite(y):
          ax.annotate(f"{L}L", (x, y), textcoords="offset points", xytext=(0, 5), fontsize=7,
                      ha="center")
    # Finished without a val loss to draw: diverged, or (status ok) a non-finite one.
    lost = [r for r in mine if r.get("status") in ("diverged", "ok") and not is_usable(r)]
    if lost:  # In a band of their own below the losses, set off by a dashed line.
      low, high = ax.get_ylim()
      ticks = [t for t in ax.get_yticks() if low <= t <= high]   # none in the band
      ax.set_ylim(low - 0.15 * (high - low), high)
      ax.set_yticks(ticks)
      ax.axhline(low, color="red", lw=0.6, ls="--", alpha=0.5)
      ax.scatter([r["aspect_ratio"] for r in lost], [0.02] * len(lost), marker="x",
                 color="red", transform=ax.get_xaxis_transform(),
                 label="diverged or no finite val loss (below the line)", zorder=4)
      stacked: dict[float, int] = {}   # two lost runs at one shape: labels one above the other
      for r in lost:
        k = stacked[r["aspect_ratio"]] = stacked.get(r["aspect_ratio"], -1) + 1
        ax.annotate(f"lr {format_lr(r['lr'])}" if r.get("lr") is not None else "diverged",
                    (r["aspect_ratio"], 0.02), xycoords=ax.get_xaxis_transform(),
                    textcoords="offset points", xytext=(4, 3 + 8 * k), fontsize=7, color="red")
    _axes(ax, f"{design}: val loss vs aspect ratio", [r["aspect_ratio"] for r in mine])
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out_dir, f"loss_vs_aspect_{design}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)

  # A colour per design, a line style per scale family: no two lines drawn alike.
  fig, ax = plt.subplots(figsize=(7, 4.5))
  colors = design_colors(designs)
  for design in designs:
    for family, curve in sorted(_best_curves(records, groups, design).items()):
      xs, ys, _ = zip(*curve)
      ax.plot(xs, ys, marker="o", ms=3, color=colors[design],
              linestyle=("-", "--", ":", "-.")[family % 4],
              label=design if not family else f"{design} ({family})")
  _axes(ax, "best-LR val loss vs aspect ratio, all designs", [r["aspect_ratio"] for r in records])
  if ax.get_legend_handles_labels()[0]:
    ax.legend(fontsize=7, ncol=2)
  fig.tight_layout()
  path = os.path.join(out_dir, "loss_vs_aspect_all.png")
  fig.savefig(path, dpi=110)
  plt.close(fig)
  paths.append(path)
  return paths
