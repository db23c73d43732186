"""Measured training cost beside the analytic one: bench results folded into the systems table.

The table's device-hours (``costs.device_hours``) count FLOPs at one assumed MFU for every design,
so HC, whose extra FLOPs are <1%, costs what Pre-LN costs there. What a design costs on a device
is its measured step: the paper's "HC has the highest GPU-hour cost" is a measurement. Given the
JSONs ``python -m depthbench_jax.bench`` wrote, each (design, shape) the bench timed gets

    device-hours measured  = train_tokens / tokens_per_s / 3600     (one device, the bench batch)
    MFU at the table's peak = train_flops_per_token * tokens_per_s / peak_flops

and the bench's own step / Pre-LN ratio with its per-round IQR (both timed interleaved in one
process, so the ratio is the trustworthy figure; tokens/s is one run on one device, no
communication). A bench row is used only when it timed the table's model: its model FLOPs per
token (``model_flops_per_step / (batch * seq_len)``, the same ``flops.py`` count) must equal the
row's ``train_flops_per_token`` within ``FLOPS_REL_TOL``; one that does not is reported, not
folded in. Where several files time the same (device, design, shape), the first given wins.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from depthbench_jax import revision

FLOPS_REL_TOL = 0.01


def bench_rows(paths: Sequence[str]) -> list[dict]:
  """Every ``train`` row of the bench results at ``paths``, with its run's device, batch and
  code; ValueError naming the file when one is not a bench result."""
  from depthbench_jax import bench
  out = []
  for path in paths:
    result = bench.read_result(path, ("train", "preset", "device"), "results-<device>.json",
                               flag="--measured")
    preset = result["preset"]
    tokens = preset["batch"] * preset["seq_len"]
    for r in result["train"]:
      out.append({**r, "device": result["device"], "source": path,
                  "commit": revision.result_label(result), "batch": preset["batch"],
                  "seq_len": preset["seq_len"], "dtype": preset["dtype"],
                  "flops_per_token": r["model_flops_per_step"] / tokens})
  return out


def match(cost_rows: Iterable[dict], measured: Iterable[dict], *, peak_flops: float,
          ) -> tuple[list[dict], list[str]]:
  """``(rows, skipped)``: one row per (device, design, shape) found in both, with the measured
  device-hours beside the analytic; ``skipped`` says why a bench row of a tabled (design, shape)
  was left out (a different model, or one the first file given already timed on that device:
  two orders of --measured gave HC 1.489 and 1.509 without a word). The rows of one (device,
  shape) come from one file, the first given with a row there: a step ratio is against its own
  run's Pre-LN, and Full AttnRes's 1.980 (against the second file's Pre-LN) sat beside the
  first file's Pre-LN, whose tokens/s give 1.962, and the ranking compared the two runs."""
  by_key = {(r["design"], r["shape"]): r for r in cost_rows}
  rows, skipped, seen, shown_from = [], [], {}, {}
  for m in measured:
    key = (m["design"], m["shape"])
    row = by_key.get(key)
    if row is None:
      continue
    if (m["device"],) + key in seen:
      skipped.append(f"{m['source']}: {m['design']} {m['shape']} on {m['device']} is timed "
                     f"by {seen[(m['device'],) + key]} too, given first: that one is shown")
      continue
    if abs(m["flops_per_token"] / row["train_flops_per_token"] - 1.0) > FLOPS_REL_TOL:
      # Four figures and the gap: a tiny model's 0.006 read 'against the table's 0.006'.
      skipped.append(f"{m['source']}: {m['design']} {m['shape']} timed a different model "
                     f"({m['flops_per_token']:.4g} FLOPs/token against the table's "
                     f"{row['train_flops_per_token']:.4g}, "
                     f"{m['flops_per_token'] / row['train_flops_per_token'] - 1:+.1%})")
      continue
    source = shown_from.setdefault((m["device"], m["shape"]), m["source"])
    if source != m["source"]:
      skipped.append(f"{m['source']}: {m['design']} {m['shape']} on {m['device']}: that shape "
                     f"is shown from {source}, given first (its step ratios and ranking compare "
                     f"the designs of one run)")
      continue
    seen[(m["device"],) + key] = m["source"]
    band = m.get("step_over_preln_rounds") or {}
    rows.append({
        "design": m["design"], "shape": m["shape"], "n_layers": row["n_layers"],
        "device": m["device"], "source": m["source"], "commit": m["commit"],
        "batch": m["batch"], "seq_len": m["seq_len"], "dtype": m["dtype"],
        "step_s": m["step_s"], "tokens_per_s": m["tokens_per_s"],
        "step_over_preln": m["step_over_preln"],
        "step_over_preln_iqr": [band.get("q1"), band.get("q3")],
        "mfu_at_peak": row["train_flops_per_token"] * m["tokens_per_s"] / peak_flops,
        "device_hours_measured": row["train_tokens"] / m["tokens_per_s"] / 3600.0,
        "device_hours_analytic": row["device_hours"], "mfu_assumed": row["mfu"],
        "remat_policy": m.get("remat_policy"), "trained_remat_policy": row.get("remat_policy"),
    })
  rows.sort(key=lambda r: (r["device"], r["n_layers"], r["step_over_preln"]))
  return rows, skipped


def ranking(rows: Sequence[dict]) -> list[str]:
  """Per (device, shape) timed with Pre-LN and at least one other design: the designs from the
  most device-hours to the fewest, each as its step over Pre-LN."""
  groups: dict[tuple[str, str], list[dict]] = {}
  for r in rows:
    groups.setdefault((r["device"], r["shape"]), []).append(r)
  out = []
  for (device, shape), rs in groups.items():
    if len(rs) < 2 or not any(r["design"] == "preln" for r in rs):
      continue
    rs = sorted(rs, key=lambda r: -r["device_hours_measured"])
    out.append(f"{device} {shape}, most device-hours first: " + " > ".join(
        f"{r['design']} {r['step_over_preln']:.2f}x" for r in rs))
  return out


def markdown(rows: Sequence[dict], skipped: Sequence[str] = ()) -> str:
  """The measured table, the rankings and any bench rows left out."""
  if not rows and not skipped:
    return ""
  r0 = rows[0] if rows else None
  parts = []
  if r0:
    parts += [
        "| design | shape | device | tokens/s | step / Pre-LN (per-round IQR) | "
        f"MFU at the table's peak | device-h measured | device-h at MFU {r0['mfu_assumed']:.2f} |",
        "|---|---|---|---|---|---|---|---|"]
    for r in rows:
      q1, q3 = r["step_over_preln_iqr"]
      band = f" ({q1:.3f}-{q3:.3f})" if q1 is not None and r["design"] != "preln" else ""
      parts.append(
          f"| {r['design']} | {r['shape']} | {r['device']} | {r['tokens_per_s']:,.0f} | "
          f"{r['step_over_preln']:.3f}{band} | {r['mfu_at_peak']:.3f} | "
          f"{r['device_hours_measured']:,.1f} | {r['device_hours_analytic']:,.1f} |")
    sources = sorted({(r["source"], r["commit"], r["batch"], r["seq_len"], r["dtype"])
                      for r in rows})
    parts += ["", "Measured by " + "; ".join(
        f"`{s}` (code {c}, batch {b} x {t}, {d})" for s, c, b, t, d in sources)
        + ": one device, no communication."]
    remat = sorted({(r.get("remat_policy"), r.get("trained_remat_policy")) for r in rows
                    if r.get("remat_policy") and r.get("trained_remat_policy")
                    and r["remat_policy"] != r["trained_remat_policy"]}, key=str)
    if remat:
      parts += ["", "Timed under another remat policy than the runs train with ("
                + ", ".join(f"bench {b}, runs {t}" for b, t in remat) + "): the runs recompute "
                "other activations in their backward, so their step times, and these "
                "device-hours, differ (benchmarks/README.md's remat tables: on the H200 at "
                "16x1216 Pre-LN's step is 9% longer under nothing_saveable than dots_saveable)."]
    ranked = ranking(rows)
    if ranked:
      parts += [""] + [f"- {line}" for line in ranked]
  if skipped:
    parts += ["", "Bench rows left out:"] + [f"- {s}" for s in skipped]
  return "\n".join(parts)
