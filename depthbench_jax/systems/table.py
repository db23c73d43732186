"""The systems table (markdown) and the context-length curve (PNG) from cost rows."""

from __future__ import annotations

import math
from typing import Sequence

from depthbench_jax.systems import flops

CONVENTION = (
    "Prefill = one forward pass over a length-T sequence, all T logits; FLOPs, KV and state "
    "are per sequence, peak memory for the batch named below; a multiply-add "
    "is 2 FLOPs, only contractions count. **causal**: `2 N_matmul T + 2 L T^2 H hd` + design "
    "terms (QK^T and AV counted over the keys each query sees, i.e. half of the full T x T; "
    "the flops.py convention, also used for MFU). **computed**: the attention as this code "
    "computes it off-GPU, which XLA counts: `(n+1)/2n` of the full T x T (`4 L T^2 H hd`) for "
    "the blocked XLA attention (n query blocks), which both kernel settings run off-GPU (on a "
    "GPU the suites' 'fused' is cuDNN, which skips masked tiles itself). **paper**: "
    "`2*12 L d^2 T + 2 L T^2 d` (no LM head, SwiGLU at exactly 8/3 d): 2.98 -> 4.32 TFLOPs "
    "at the 400M suite's 16x1216 -> 70x640, where the paper quotes about 3.0 -> 4.4. **XLA**: "
    "`compiled.cost_analysis()['flops']` of the abstract compile in the dtype named below, with "
    "the scanned layer body counted L times; XLA also counts every elementwise op (a convert, "
    "a mask) one FLOP per element and a loop inside a layer once, so for the designs that read "
    "a depth buffer (Full/Block AttnRes, MoDA) it is no check on their design term: in bfloat16 "
    "it counts the buffer's converts (about 2x the term), in float32 their slot loops once "
    "(below it as depth grows). KV = K and V of every layer in that dtype; state = "
    "the residual state carried between layers; peak = `memory_analysis()` arguments + outputs "
    "+ temporaries - aliased, abstract compile on the backend named below (no allocation; "
    "XLA:CPU's buffers are a rough guide to a GPU's).")


def _num(v: float, decimals: int) -> str:
  """``v`` with ``decimals`` decimals (thousands separated) from 1 up; below 1, two significant
  figures, so a smoke-sized model's 0.023 TFLOPs or 5e-07 device-hours do not print as 0."""
  if v == 0 or abs(v) >= 1:
    return f"{v:,.{decimals}f}"
  return f"{v:.2g}"


def _hours(v: float) -> str:
  """Device-hours to two decimals below 10, one below 100, whole hours above (below 1, two
  significant figures, ``_num``): whole hours printed a 120M suite's 1.47 as 1, where the
  sweep plan says 1.47."""
  return _num(v, 2 if abs(v) < 10 else 1 if abs(v) < 100 else 0)


def _t(x) -> str:
  return "-" if x is None else _num(x / 1e12, 2)


def _mb(x) -> str:
  """MiB, one decimal below 10 where it is not whole: a 1.5 MiB state printed as 2 (and a drop
  from 2 to 1.5 MiB with depth as none)."""
  if x is None:
    return "-"
  v = x / 2**20
  return _num(v, 1 if abs(v) < 10 and not float(v).is_integer() else 0)


def _gb(x) -> str:
  return "-" if x is None else _num(x / 2**30, 2)


def markdown_table(rows: Sequence[dict]) -> str:
  """One line per (design, shape): FLOPs (four ways), bytes, training cost."""
  if not rows:
    return ""
  r0 = rows[0]
  backends = sorted({r["backend"].upper() for r in rows
                     if r.get("peak_bytes") and r.get("backend")})
  peak = f" (peak memory compiled by XLA:{'/'.join(backends)})" if backends else ""
  tokens = ("Chinchilla tokens" if all(r.get("train_tokens_from", "chinchilla") == "chinchilla"
                                         for r in rows) else
            "the suite's steps x batch x T tokens" if all(
                r.get("train_tokens_from") == "steps" for r in rows) else
            "Chinchilla tokens, or steps x batch x T where a suite fixes its steps")
  # Each row's own training T: a report of the smoke sweep beside a suite (T=128 and 2048)
  # said the first row's for all.
  train_t = "/".join(str(t) for t in sorted({r["train_seq_len"] for r in rows}))
  head = (f"Prefill at T={r0['seq_len']}, batch {r0.get('batch', 1)}, {r0['dtype']}{peak}; "
          f"training at T={train_t}, {tokens}, device-hours at "
          f"{r0['peak_flops'] / 1e12:.0f} TFLOP/s peak and MFU {r0['mfu']:.2f}.")
  lines = [head, "",
           "| design | shape | AR | params | prefill TFLOPs causal | computed | XLA | paper | "
           "KV MiB | state MiB | params GiB | peak GiB | train GFLOPs/tok | device-h |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    lines.append(
        f"| {r['design']} | {r['shape']} | {r['aspect_ratio']:.1f} | "
        f"{r['params_total'] / 1e6:.1f}M | {_t(r['prefill_flops_causal'])} | "
        f"{_t(r['prefill_flops_computed'])} | {_t(r.get('xla_flops'))} | "
        f"{_t(r['prefill_flops_paper'])} | {_mb(r['kv_cache_bytes'])} | "
        f"{_mb(r['residual_state_bytes'])} | {_gb(r['param_bytes'])} | "
        f"{_gb(r.get('peak_bytes'))} | {_num(r['train_flops_per_token'] / 1e9, 2)} | "
        f"{_hours(r['device_hours'])} |")
  return "\n".join(lines)


def depth_cost_summary(rows: Sequence[dict]) -> str:
  """Per design and scale family (``family``, ``report.scorecard.assign_families``; one when
  absent): deepest over shallowest shape (prefill FLOPs, KV cache, peak memory, hours)."""
  out = []
  by_design: dict[tuple[str, int], list[dict]] = {}
  for r in rows:
    by_design.setdefault((r["design"], r.get("family", 0)), []).append(r)
  for (design, _), rs in by_design.items():
    rs = sorted(rs, key=lambda r: r["n_layers"])
    lo, hi = rs[0], rs[-1]
    if lo is hi:
      continue
    ratio = lambda key: (f"x{hi[key] / lo[key]:.2f}" if lo.get(key) and hi.get(key) else "-")
    out.append(f"| {design} | {lo['shape']} -> {hi['shape']} | "
               f"{_t(lo['prefill_flops_paper'])} -> {_t(hi['prefill_flops_paper'])} | "
               f"{_t(lo['prefill_flops_causal'])} -> {_t(hi['prefill_flops_causal'])} "
               f"({ratio('prefill_flops_causal')}) | {ratio('kv_cache_bytes')} | "
               f"{ratio('peak_bytes')} | {ratio('device_hours')} |")
  if not out:
    return ""
  return "\n".join(["| design | shallow -> deep | paper approx TFLOPs | causal TFLOPs | KV | "
                    "peak mem | device-h |", "|---|---|---|---|---|---|---|", *out])


def context_lengths(low: int = 2048, high: int = 131072) -> list[int]:
  """Powers of two from ``low`` to ``high`` (2k .. 128k)."""
  out, t = [], low
  while t <= high:
    out.append(t)
    t *= 2
  return out


def context_curve(cfgs: Sequence, lengths: Sequence[int], dtype: str = "bfloat16",
                  families: dict[str, int] | None = None) -> list[dict]:
  """Analytic causal prefill FLOPs and KV bytes (in ``dtype``) per sequence for each config at
  each length; ``family`` from ``families`` (shape -> scale family, ``assign_families``), else 0."""
  from depthbench_jax.systems.costs import kv_cache_bytes
  rows = []
  for cfg in cfgs:
    shape = f"{cfg.n_layers}x{cfg.d_model}"
    for t in lengths:
      rows.append({"design": cfg.design, "shape": shape, "family": (families or {}).get(shape, 0),
                   "n_layers": cfg.n_layers, "seq_len": t,
                   "prefill_flops_causal": flops.prefill_flops(cfg, t, causal=True),
                   "attention_flops": t * flops.attention_flops_per_token(cfg, t),
                   "kv_cache_bytes": kv_cache_bytes(cfg, t, dtype=dtype)})
  return rows


def _shallowest(curve: Sequence[dict]) -> dict[int, dict[int, float]]:
  """``{family: {seq_len: causal prefill FLOPs}}`` of each scale family's shallowest shape."""
  first: dict[int, tuple] = {}
  for r in curve:
    key = (r["n_layers"], r["shape"])
    if key < first.get(r.get("family", 0), (math.inf,)):
      first[r.get("family", 0)] = key
  return {family: {r["seq_len"]: r["prefill_flops_causal"] for r in curve
                   if (r["n_layers"], r["shape"]) == key and r.get("family", 0) == family}
          for family, key in first.items()}


def context_curve_figure(curve: Sequence[dict]):
  """Two panels: prefill TFLOPs per sequence vs T (log-log), and each shape over the shallowest
  of its scale family (a multi-scale suite's 500M 48-layer shape over its 500M 16-layer one, not
  over another scale's). The title names the design(s): a figure read apart from systems.md
  did not say which design's count it drew."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  shapes = sorted({(r.get("family", 0), r["n_layers"], r["shape"], r["design"]) for r in curve})
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
  base = _shallowest(curve)
  for family, n_layers, shape, design in shapes:
    rs = sorted((r for r in curve if r["shape"] == shape and r["design"] == design),
                key=lambda r: r["seq_len"])
    t = [r["seq_len"] for r in rs]
    f = [r["prefill_flops_causal"] / 1e12 for r in rs]
    label = shape if len({s[3] for s in shapes}) == 1 else f"{design} {shape}"
    style = {"marker": "o", "ms": 3, "label": label, "ls": ("-", "--", ":", "-.")[family % 4]}
    ax1.plot(t, f, **style)
    ax2.plot(t, [r["prefill_flops_causal"] / base[family][r["seq_len"]] for r in rs], **style)
  for ax in (ax1, ax2):
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context length T (tokens)")
    ax.grid(alpha=0.3)
  ax1.set_yscale("log")
  ax1.set_ylabel("prefill TFLOPs per sequence (causal)")
  designs = ", ".join(dict.fromkeys(s[3] for s in shapes))
  ax1.set_title(f"{designs}: 2 N T + 2 L T^2 d (+ design terms): the attention term takes over",
                fontsize=9)
  ax2.set_ylabel(f"prefill FLOPs / {shapes[0][2]}" if len(base) == 1 else
                 "prefill FLOPs / its scale's shallowest shape")
  ax2.set_title("cost of depth at iso-parameters vs context")
  for ax in (ax1, ax2):
    ax.legend(fontsize=8)
  fig.tight_layout()
  return fig


def plot_context_curve(curve: Sequence[dict], path: str) -> str:
  """``context_curve_figure`` written to ``path`` (PNG); returns ``path``."""
  import matplotlib.pyplot as plt
  fig = context_curve_figure(curve)
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def curve_markdown(curve: Sequence[dict]) -> str:
  """Deepest over shallowest prefill FLOPs at each context length: the two shapes' TFLOPs and
  their ratio, for each scale family with two shapes or more."""
  families: dict[int, dict[str, dict[int, float]]] = {}
  layers = {}
  for r in curve:
    by_shape = families.setdefault(r.get("family", 0), {})
    by_shape.setdefault(r["shape"], {})[r["seq_len"]] = r["prefill_flops_causal"]
    layers[r["shape"]] = r["n_layers"]
  lines = []
  for _, by_shape in sorted(families.items()):
    if len(by_shape) < 2:
      continue
    lo = min(by_shape, key=lambda s: layers[s])
    hi = max(by_shape, key=lambda s: layers[s])
    ts = sorted(by_shape[lo])
    if not lines:
      lines = ["| T | " + " | ".join(f"{t // 1024}k" for t in ts) + " |",
               "|---|" + "---|" * len(ts)]
    for shape in (lo, hi):
      lines.append(f"| {shape} TFLOPs | " + " | ".join(_num(by_shape[shape][t] / 1e12, 1)
                                                      for t in ts) + " |")
    lines.append(f"| {hi} / {lo} | " + " | ".join(f"{by_shape[hi][t] / by_shape[lo][t]:.2f}"
                                                  for t in ts) + " |")
  return "\n".join(lines)


def _finite(x) -> bool:
  return x is not None and math.isfinite(x)
