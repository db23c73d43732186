"""The bench's result judged and printed: ``TARGETS``, the verdict against them, the table.

Pure functions of a result dict (``bench.run_bench``'s, or a saved ``results-<device>.json``
under ``--replot``): ``verdict`` checks the first shape's rows against ``TARGETS`` (thresholds
live here, never in tests; a check this run's noise cannot decide prints UNDECIDED), the
``*_needs`` lines state what each target asks of the step, and ``render`` is the printed table.
"""

from __future__ import annotations

from typing import Sequence

from depthbench_jax import revision

# Targets (on 2 CPU cores for the default preset); ratios are "<=", mfu is ">=".
TARGETS = {"mfu": 0.45, "hc_over_preln": 1.10, "attnres_full_over_preln": 1.15,
           "compile_deep_over_shallow": 1.3, "ours_over_hf": 0.8}
# Designs with a step-time target (checked at the first shape): design -> (label, TARGETS key).
STEP_TARGETS = {"hc": ("HC", "hc_over_preln"),
                "attnres_full": ("Full AttnRes", "attnres_full_over_preln")}


def first_shape_rows(result: dict) -> tuple[str, dict[str, dict]]:
  """The first shape timed (where the targets are checked) and its rows by design."""
  first = result["train"][0]["shape"]
  return first, {r["design"]: r for r in result["train"] if r["shape"] == first}


def verdict(result: dict) -> list[dict]:
  """``TARGETS`` checked at the first shape: one ``{check, value, target, op, pass}`` each
  (``pass``: the reported value's side of the target), with ``band`` and ``within_noise`` where
  the ratio has a per-round IQR (``undecided``'s reason in ``noise`` when the run cannot tell
  pass from fail: printed UNDECIDED), and ``failed`` (a FAIL) where the design was asked for and
  did not compile or fit."""
  first, rows = first_shape_rows(result)
  checks = []

  def add(name, value, target, higher_is_better=False, band=None, failed=None):
    if failed:  # Asked for and did not compile or fit: a FAIL, not a missing line.
      checks.append({"check": name, "value": None, "target": target, "failed": failed,
                     "op": ">=" if higher_is_better else "<=", "pass": False})
      return
    if value is None:
      return
    ok = value >= target if higher_is_better else value <= target
    check = {"check": name, "value": value, "target": target,
             "op": ">=" if higher_is_better else "<=", "pass": bool(ok)}
    if band:
      noise = undecided(value, target, band)
      check.update(band=band, within_noise=noise is not None)
      if noise:
        check["noise"] = noise
    checks.append(check)

  failed = result.get("failed", {})
  pre = rows.get("preln")
  add(f"MFU Pre-LN {first}", pre and pre["mfu"], TARGETS["mfu"], True,
      failed=failed.get(f"preln {first}"))
  for design, (label, key) in STEP_TARGETS.items():
    row = rows.get(design, {})
    add(f"{label} / Pre-LN step {first}", row.get("step_over_preln"), TARGETS[key],
        band=row.get("step_over_preln_rounds"), failed=failed.get(f"{design} {first}"))
  c = result["compile"]
  add(f"compile {c['deep_layers']}L / {c['shallow_layers']}L", c["deep_over_shallow"],
      TARGETS["compile_deep_over_shallow"], band=c.get("deep_over_shallow_rounds"))
  # Not measured for want of torch/transformers (``bench.hf_missing``, recorded by the run): a
  # FAIL line saying so, as a design that did not compile; left out under --no_hf and off the
  # CPU (the baseline is torch's CPU step; the run records hf=false then).
  left_out = result.get("hf_left_out")
  add("ours / HF LLaMA step", pre and pre.get("ours_over_hf"), TARGETS["ours_over_hf"],
      band=pre and pre.get("ours_over_hf_rounds"),
      failed=f"not measured: {left_out}" if left_out else None)
  starved = torch_starved(pre or {})
  if starved and checks and checks[-1]["check"] == "ours / HF LLaMA step":
    checks[-1].update({"pass": False, "failed": starved})
  return checks


def undecided(value: float, target: float, band: dict) -> str | None:
  """Why a run cannot tell ``value``'s pass from fail at ``target``, else None: the target inside
  the per-round IQR, or the reported ratio (of medians) and the median per-round ratio on
  opposite sides of it (a ratio of medians can fall outside its own band)."""
  if band["q1"] <= target <= band["q3"]:
    return f"target inside the per-round IQR {_band(band)}"
  if (value <= target) != (band["median"] <= target):
    return (f"the per-round median {band['median']:.3f} on the other side of the target, "
            f"IQR {_band(band)}")
  return None


TORCH_CEILING_FLOOR = 0.1   # torch's GEMM ceiling over XLA's, same rounds (normally ~0.4-0.5)


def torch_starved(pre: dict) -> str | None:
  """Why the HF comparison says nothing, when torch's own GEMM ceiling, timed in the same rounds,
  fell below ``TORCH_CEILING_FLOOR`` of XLA's: a run beside another process once read torch at
  0.3 GFLOP/s and HF's step at 628 ms, and ``ours / HF = 0.002`` passed."""
  torch_peak, peak = pre.get("hf_matmul_peak_flops"), pre.get("matmul_peak_flops")
  if not torch_peak or not peak or torch_peak >= TORCH_CEILING_FLOOR * peak:
    return None
  return (f"torch's GEMM ceiling read {torch_peak / 1e9:.1f} GFLOP/s against XLA's "
          f"{peak / 1e9:.1f} in the same rounds: torch ran starved, rerun on a quiet machine")


def step_targets_needs(result: dict) -> list[str]:
  """``step_target_needs`` for each design with a step target timed at the first shape."""
  _, rows = first_shape_rows(result)
  targets = result.get("targets", TARGETS)
  lines = [step_target_needs(label, rows[design], rows["preln"], targets[key],
                             result.get("stream_bandwidth"))
           for design, (label, key) in STEP_TARGETS.items()
           if design in rows and "preln" in rows and key in targets]
  return [""] + lines if lines else []


def _band(band: dict | None) -> str:
  return "" if not band else f"{band['q1']:.3f}-{band['q3']:.3f}"


def _verdict_value(value: float | None, target: float) -> str:
  """``value`` to 3 decimals, or to 5, 7, ... where fewer would print the target itself
  (``1.100`` failing ``<= 1.1`` reads as a contradiction; ``1.10041`` does not)."""
  if value is None:
    return "-"
  if value == target:
    return f"{value:.3f}"
  for decimals in (3, 5, 7, 9, 11, 13):
    text = f"{value:.{decimals}f}"
    if text != f"{target:.{decimals}f}":
      return text
  return repr(value)


def _verdict_word(v: dict) -> str:
  """``PASS``, ``FAIL (why)``, or ``UNDECIDED (reads PASS; why)`` where the run's noise cannot
  decide (results saved before ``noise`` was recorded: the target inside the IQR)."""
  reads = "PASS" if v["pass"] else "FAIL"
  if v.get("failed"):
    return f"FAIL ({v['failed']})"
  if v.get("within_noise"):
    why = v.get("noise") or f"target inside the per-round IQR {_band(v['band'])}"
    return f"UNDECIDED (reads {reads}; {why})"
  return reads


def hf_target_needs(pre: dict, target: float) -> str:
  """What ``ours/HF <= target`` asks of the Pre-LN step: its time, and its MFU against the XLA
  GEMM ceiling of the same run (``mfu * (ours/HF) / target``; above 1 the target is out of
  reach on that device whatever the non-GEMM work costs)."""
  step = target * pre["hf_step_s"]
  mfu = pre["mfu"] * pre["ours_over_hf"] / target
  return (f"ours/HF <= {target} needs a Pre-LN step of {1e3 * step:.1f} ms: MFU {mfu:.3f} of "
          f"this run's XLA GEMM ceiling (ours now {pre['mfu']:.3f}): with every GEMM at that "
          f"ceiling, all other work (AdamW, the cross-entropy, norms, softmax) in "
          f"{max(0.0, 1 - mfu) * 100:.0f}% of the step")


def step_target_needs(label: str, row: dict, pre: dict, target: float,
                      bandwidth: float | None = None) -> str:
  """What ``step / Pre-LN <= target`` asks of a design: its time beyond Pre-LN's step,
  ``(target - 1) * t_preln``, against what it takes now, ``t - t_preln``; with the run's stream
  bandwidth, the bytes that budget could move (the designs' extra work is elementwise: streams,
  buffers, their gradients)."""
  now, budget = row["step_s"] - pre["step_s"], (target - 1.0) * pre["step_s"]
  line = (f"{label} / Pre-LN <= {target} needs {label}'s time beyond Pre-LN's "
          f"{1e3 * pre['step_s']:.1f} ms step in {1e3 * budget:.1f} ms (now {1e3 * now:.1f} ms")
  line += f", {now / budget:.2f}x that)" if now > budget else ": within it)"
  if bandwidth:
    line += f"; at this run's stream bandwidth that budget moves {budget * bandwidth / 1e9:.2f} GB"
  return line


def depth_cost_table(rows: Sequence[dict]) -> list[str]:
  """Markdown lines (none for one shape): each design's step over Pre-LN at the first shape,
  per shape, with the per-round IQR; the first shape's Pre-LN is timed in every shape's rounds,
  so each entry is paired within rounds like ``x Pre-LN``."""
  shapes = list(dict.fromkeys(r["shape"] for r in rows))
  if len(shapes) < 2 or any("step_over_first_preln" not in r for r in rows):
    return []
  cell = {(r["design"], r["shape"]): r for r in rows}
  lines = ["", f"Cost of depth: step over Pre-LN at {shapes[0]} (timed in the same rounds; "
           "per-round IQR)", "", "| design | " + " | ".join(shapes) + " |",
           "|---|" + "---|" * len(shapes)]
  for design in dict.fromkeys(r["design"] for r in rows):
    entries = []
    for shape in shapes:
      r = cell.get((design, shape))
      entries.append("n/a" if r is None else f"{r['step_over_first_preln']:.3f} "
                     f"({_band(r['step_over_first_preln_rounds'])})")
    lines.append(f"| {design} | " + " | ".join(entries) + " |")
  return lines


def _peaks(result: dict) -> str:
  """The matmul ceiling(s) the MFUs are over: one figure, or per shape when the shapes' rounds
  measured different ones (each row's MFU is over its own shape's; results before this record
  only the largest)."""
  by_shape = {r["shape"]: r["matmul_peak_flops"] for r in result["train"]
              if "matmul_peak_flops" in r}
  if len(set(by_shape.values())) <= 1:
    return f"{result['matmul_peak_flops'] / 1e9:.1f}"
  return "(per shape) " + ", ".join(f"{s} {v / 1e9:.1f}" for s, v in by_shape.items())


def _balance(result: dict) -> str:
  """``', stream 61.2 GB/s, balance 7.5 FLOP/byte'`` (none for results from before the probe)."""
  if "stream_bandwidth" not in result:
    return ""
  return (f", stream {result['stream_bandwidth'] / 1e9:.1f} GB/s, balance "
          f"{result['machine_balance']:.1f} FLOP/byte")


def render(result: dict) -> str:
  """The printed report, markdown: the run's header, one row per design and shape, the cost of
  depth, each step target's budget, ours vs HF, the compile ratio and the verdict."""
  lines = [f"DepthBench bench on {result['device']} ({result['device_kind']}, "
           f"{result['cpu_count']} CPUs, {result.get('host_cpu', 'unknown CPU')}), code "
           f"{revision.result_label(result)}, jax {result['jax']}, {result['preset']['dtype']}, "
           f"batch {result['preset']['batch']} x seq {result['preset']['seq_len']}; matmul peak "
           f"{_peaks(result)} GFLOP/s{_balance(result)}; host malloc "
           f"{result.get('host_malloc', 'default')}", "",
           "| design | shape | remat | attention | step ms | x Pre-LN | per-round IQR | tokens/s | "
           "model GFLOP/s | MFU | peak MiB | x Pre-LN | compile s |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in result["train"]:
    lines.append(f"| {r['design']} | {r['shape']} | {r['remat_policy']} | "
                 f"{r.get('attention', 'n/a')} | "
                 f"{1e3 * r['step_s']:.1f} | {r['step_over_preln']:.3f} | "
                 f"{_band(r.get('step_over_preln_rounds'))} | "
                 f"{r['tokens_per_s']:,.0f} | {r['model_flops_per_s'] / 1e9:.1f} | "
                 f"{r['mfu']:.3f} | {r['peak_bytes'] / 2**20:,.0f} | {r['peak_over_preln']:.2f} | "
                 f"{r['compile_s']:.1f} |")
  lines += [f"| {key.split()[0]} | {key.split()[1]} | failed: {message} |"
            for key, message in result.get("failed", {}).items()]
  lines += depth_cost_table(result["train"])
  lines += step_targets_needs(result)
  pre = next((r for r in result["train"] if r["design"] == "preln" and "hf_step_s" in r), None)
  if pre:
    lines += ["", f"Pre-LN step {1e3 * pre['step_s']:.1f} ms vs HF LlamaForCausalLM (torch) "
              f"{1e3 * pre['hf_step_s']:.1f} ms: ours/HF = {pre['ours_over_hf']:.3f} "
              f"(per-round IQR {_band(pre.get('ours_over_hf_rounds'))})"]
    if "hf_mfu" in pre:
      xla_peak = pre.get("matmul_peak_flops", result["matmul_peak_flops"])
      lines += [f"GEMM ceilings: XLA {xla_peak / 1e9:.1f}, torch "
                f"{pre['hf_matmul_peak_flops'] / 1e9:.1f} GFLOP/s; MFU ours {pre['mfu']:.3f}, "
                f"HF {pre['hf_mfu']:.3f}: ours/HF at equal GEMM speed = "
                f"{pre['ours_over_hf_at_equal_gemm']:.3f}"
                + (f" with every part of our step scaled by the ceilings' ratio, "
                   f"{pre['ours_over_hf_gemms_moved']:.3f} with only the GEMMs' ideal time "
                   f"moved to torch's ceiling (the truth lies between)"
                   if pre.get("ours_over_hf_gemms_moved") is not None else "")]
      lines += [hf_target_needs(pre, result.get("targets", TARGETS)["ours_over_hf"])]
  for shape, mem in (result.get("device_memory") or {}).items():
    if mem:
      lines += ["", f"Device allocator after {shape} (cumulative high-water mark): peak "
                f"{mem.get('peak_bytes_in_use', 0) / 2**30:.2f} GiB of "
                f"{mem.get('bytes_limit', 0) / 2**30:.1f} GiB"]
  c = result["compile"]
  lines += ["", f"Train-step compile (abstract): {c['shallow_layers']}L {c['shallow_s']:.2f}s, "
            f"{c['deep_layers']}L {c['deep_s']:.2f}s, ratio {c['deep_over_shallow']:.2f}", "",
            "| verdict | value | target | |", "|---|---|---|---|"]
  for v in result["verdict"]:
    lines.append(f"| {v['check']} | {_verdict_value(v['value'], v['target'])} | "
                 f"{v['op']} {v['target']} | {_verdict_word(v)} |")
  return "\n".join(lines)
