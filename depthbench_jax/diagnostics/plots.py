"""Heatmaps and curves of one diagnostics result (matplotlib, Agg): PNG files or uint8 images.

Each heatmap and layer curve marks the late boundary ``L/4`` (dashed): only pairs right of and
below it enter the shares (the share curves' x axis is the threshold). Undefined entries
(``i >= j``) are blank; a pair whose swapped or skipped run blew up (a non-finite score, which
the shares count above every threshold) is a red cross, not a blank.
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
import numpy as np  # noqa: E402

from depthbench_jax.diagnostics.metrics import is_spec_skip  # noqa: E402
from depthbench_jax.diagnostics.probes import from_jsonable_matrix  # noqa: E402


def _title(result: dict, what: str) -> str:
  return f"{result.get('design', '?')} L={result.get('n_layers', '?')}: {what}"


def _skip_word(causal: dict) -> str:
  """``''`` for the spec's skip (``causal_skip='zero_update'``), else ``', layer absent'``."""
  return "" if is_spec_skip(causal) else ", layer absent"


def _heatmap(matrix: np.ndarray, title: str, late_start: int, xlabel: str, ylabel: str,
             vmin: float = 0.0, vmax: float | None = None, cmap: str = "viridis",
             measured: np.ndarray | None = None):
  """``measured``: the cells the probes computed; a non-finite one among them blew up."""
  fig, ax = plt.subplots(figsize=(4.8, 4.0), dpi=100)
  finite = matrix[np.isfinite(matrix)]
  if vmax is None:
    vmax = float(finite.max()) if finite.size and finite.max() > vmin else vmin + 1e-6
  image = ax.imshow(np.ma.masked_invalid(matrix), vmin=vmin, vmax=vmax, cmap=cmap,
                    interpolation="nearest", origin="upper")
  fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
  blown_i, blown_j = np.nonzero(~np.isfinite(matrix) & (False if measured is None else measured))
  if blown_i.size:
    ax.scatter(blown_j, blown_i, marker="x", color="red", s=30, label="blew up (non-finite)")
    ax.legend(fontsize=7, loc="lower left")
  for line in (ax.axvline, ax.axhline):
    line(late_start - 0.5, color="0.5", ls="--", lw=0.8)
  for axis in (ax.xaxis, ax.yaxis):   # layers (at L=4 the ticks read -0.5, 0.0, 0.5, ...)
    axis.set_major_locator(MaxNLocator(integer=True))
  ax.set_title(title, fontsize=9)
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  fig.tight_layout()
  return fig


def _line(series: dict[str, tuple[np.ndarray, np.ndarray]], title: str, xlabel: str,
          ylabel: str, vlines: dict[str, float] | None = None, late_x: float | None = None,
          layers: bool = False):
  """Curves with a legend; ``vlines`` (a series' name -> x) drawn dotted in that series' colour;
  ``late_x`` the late boundary (dashed); ``layers``: x is a layer index (whole ticks)."""
  fig, ax = plt.subplots(figsize=(4.8, 3.4), dpi=100)
  colour = {}
  for label, (x, y) in series.items():
    (line,) = ax.plot(x, y, marker="." if len(x) < 80 else None, label=label)
    colour[label] = line.get_color()
  for label, x in (vlines or {}).items():
    ax.axvline(x, color=colour.get(label, "gray"), ls=":", lw=0.8)
  if late_x is not None:
    ax.axvline(late_x, color="gray", ls="--", lw=0.8)
  if layers:
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  ax.set_title(title, fontsize=9)
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.legend(fontsize=8)
  fig.tight_layout()
  return fig


def figures(result: dict) -> dict:
  """name -> matplotlib Figure for everything the result holds."""
  late = int(result.get("late_start", 0))
  figs = {}
  ang = from_jsonable_matrix(result["angular"]["matrix"])
  figs["angular"] = _heatmap(ang, _title(result, "angular distance of hidden states"), late,
                             "layer j", "layer i")
  if "causal" in result:
    # The score has no upper bound (a skipped layer can more than redo a later update): the
    # scale reaches the largest, where a cap at 1 drew 1.46 as 1.0.
    c = from_jsonable_matrix(result["causal"]["matrix"])
    finite = c[np.isfinite(c)]
    pairs = np.triu(np.ones(c.shape, bool), 1)   # every s < t
    what = f"causal score C[s,t] ({result['causal']['reduction']}{_skip_word(result['causal'])})"
    figs["causal"] = _heatmap(c, _title(result, what),
                              late, "measured layer t", "skipped layer s",
                              vmax=max([1.0, *finite.tolist()]), measured=pairs)
  if "permutation" in result:
    p = from_jsonable_matrix(result["permutation"]["matrix"])
    finite = p[np.isfinite(p)]
    vmax = max(float(finite.max()) if finite.size else 0.0, 2 * result["permutation"]["threshold"])
    pairs = np.triu(np.ones(p.shape, bool), 1)   # every i < j, or the late ones only
    if result["permutation"].get("pairs") == "late":
      pairs &= np.arange(len(p))[:, None] >= late
    figs["permutation"] = _heatmap(p, _title(result, "permutation score P[i,j]"), late,
                                   "layer j", "layer i", vmin=min(0.0, float(finite.min())
                                                                  if finite.size else 0.0),
                                   vmax=vmax, measured=pairs)
  curves = {k: (np.asarray(result[k]["curve"]["thresholds"]),
                np.asarray(result[k]["curve"]["share"], dtype=float))
            for k in ("causal", "permutation") if k in result}
  if curves:
    named = {k: f"{k} (threshold {result[k]['threshold']:g})" for k in curves}
    figs["share_curves"] = _line(
        {named[k]: v for k, v in curves.items()},
        _title(result, "share of late pairs above threshold"), "threshold", "share",
        vlines={named[k]: result[k]["threshold"] for k in curves})
  cons = np.asarray(result["angular"]["consecutive"], dtype=float)
  figs["angular_consecutive"] = _line({"d(l, l+1)": (np.arange(len(cons)), cons)},
                                      _title(result, "consecutive angular distance"), "layer l",
                                      "distance", late_x=late - 0.5, layers=True)
  if "mixing" in result:
    e = np.asarray(result["mixing"]["erank_by_start"], dtype=float)
    figs["erank"] = _line({"erank": (np.arange(len(e)), e)},
                          _title(result, "erank of the mixing product, layers s..L-1"),
                          "start layer s", "effective rank", late_x=late - 0.5, layers=True)
  if "dead_prefix" in result and "per_sublayer" in result["dead_prefix"]:
    own = np.asarray(result["dead_prefix"]["per_sublayer"], dtype=float)
    series = {"own block": (np.arange(len(own)) / 2, own)}
    emb = (result.get("depth_weights") or {}).get("embedding_per_sublayer")
    if emb is not None:
      series["embedding"] = (np.arange(len(emb)) / 2, np.asarray(emb, dtype=float))
    figs["dead_prefix"] = _line(series, _title(result, "depth weight per sublayer"),
                                "layer (sublayer / 2)", "mean weight", late_x=late - 0.25)
  elif "depth_weights" in result:
    emb = np.asarray(result["depth_weights"]["embedding_per_sublayer"], dtype=float)
    figs["depth_weights"] = _line({"embedding": (np.arange(len(emb)) / 2, emb)},
                                  _title(result, "depth weight on the embedding per sublayer"),
                                  "layer (sublayer / 2)", "mean weight", late_x=late - 0.25)
  return figs


def to_uint8(fig) -> np.ndarray:
  """uint8 [H, W, 3] RGB pixels of a figure (for TensorBoard images); closes the figure."""
  fig.canvas.draw()
  pixels = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
  plt.close(fig)
  return pixels


# Every name ``figures`` may draw: a rerun that draws fewer (``run_permutation=false``) removes
# the earlier run's figure of that name, which no diagnostics.json names any more.
FIGURE_NAMES = ("angular", "causal", "permutation", "share_curves", "angular_consecutive",
                "erank", "dead_prefix", "depth_weights")


def save_pngs(result: dict, directory: str, prefix: str = "diag_") -> dict[str, str]:
  """Writes ``directory/<prefix><name>.png`` for every figure and removes those of the
  ``FIGURE_NAMES`` it did not draw; returns name -> file path."""
  os.makedirs(directory, exist_ok=True)
  paths = {}
  for name, fig in figures(result).items():
    assert name in FIGURE_NAMES, name  # A new figure joins FIGURE_NAMES, or stale ones stay.
    path = os.path.join(directory, f"{prefix}{name}.png")
    fig.savefig(path)
    plt.close(fig)
    paths[name] = path
  for name in set(FIGURE_NAMES) - set(paths):
    stale = os.path.join(directory, f"{prefix}{name}.png")
    if os.path.exists(stale):
      os.remove(stale)
  return paths


def images(result: dict, names: tuple[str, ...] = ("angular", "causal", "permutation",
                                                    "share_curves")) -> dict[str, np.ndarray]:
  """name -> uint8 [1, H, W, 3], the selected figures as TensorBoard images."""
  out = {}
  for name, fig in figures(result).items():
    if name in names:
      out[name] = to_uint8(fig)[None]
    else:
      plt.close(fig)
  return out
