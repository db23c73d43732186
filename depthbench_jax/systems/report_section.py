"""The report's systems section: ``systems_table(runs) -> markdown`` (found by ``report/``).

``runs`` are the scorecard's run records (a run's ``summary.json`` plus ``workdir``). One row per
(design, shape) present in the runs, computed from the run's own config (analytic, no compile):
prefill FLOPs at ``PREFILL_SEQ_LEN`` (causal and paper conventions), KV-cache and residual-state
bytes, parameter bytes, training FLOPs per token, the Chinchilla device-hours estimate, and the
wall-clock time the runs actually took (summed over the LR grid). When ``python -m
depthbench_jax.systems`` has written a ``systems.json`` in a run's directory or one of its two
parents, its XLA FLOPs and peak memory are merged in, and its measured rows (``--measured``: the
bench's timed steps and device-hours, ``systems/measured.py``) for the runs' (design, shape)s
follow the table; a file at another prefill length, batch or dtype than the table's
(``PREFILL_SEQ_LEN``, batch 1, bf16) is named, not merged. A run whose config does not validate
here (a design this checkout does not register) is named under the table with the reason.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable

import ml_collections

PREFILL_SEQ_LEN = 4096
PREFILL_SETTING = (PREFILL_SEQ_LEN, 1, "bfloat16")  # (T, batch, dtype): systems' CLI defaults.


def _setting_mismatch(data: dict) -> str:
  """'' when a systems.json is at ``PREFILL_SETTING``, else what differs, e.g. 'batch 8, not
  this table's batch 1' (rows carry batch and dtype; a file without them is at the defaults)."""
  row = (data.get("rows") or [{}])[0]
  theirs = (data.get("seq_len"), row.get("batch", 1), row.get("dtype", "bfloat16"))
  differ = [i for i, (a, b) in enumerate(zip(theirs, PREFILL_SETTING)) if a != b]
  says = lambda values: ", ".join(f"{('T=', 'batch ', '')[i]}{values[i]}" for i in differ)
  return f"{says(theirs)}, not this table's {says(PREFILL_SETTING)}" if differ else ""


def _run_model(record: dict) -> ml_collections.ConfigDict:
  """The run's saved ``config.model`` over ``configs/base.py`` defaults
  (``config_check.with_schema_defaults``, as a run's config.json is read), at its shape."""
  from depthbench_jax.train import config_check
  model = config_check.with_schema_defaults(record.get("config") or {}).model.to_dict()
  model["n_layers"], model["d_model"] = int(record["n_layers"]), int(record["d_model"])
  model["max_seq_len"] = max(int(model["max_seq_len"]), PREFILL_SEQ_LEN)
  return ml_collections.ConfigDict(model)


def run_model_config(record: dict):
  """The run's ``ModelConfig`` (``_run_model``, validated)."""
  from depthbench_jax.model.config import model_config_from
  return model_config_from(_run_model(record))


def _budget_params(record: dict) -> int | None:
  """The run's budget N when its config names a ``budget_design`` (``shapes.budget_params``)."""
  from depthbench_jax import shapes
  budget_design = ((record.get("config") or {}).get("budget_design")) or ""
  if not budget_design:
    return None
  return shapes.budget_params(ml_collections.ConfigDict(
      {"model": _run_model(record), "budget_design": budget_design}))


def _systems_rows(records: Iterable[dict]) -> tuple[dict[tuple[str, str], dict], list[dict],
                                                   dict[str, Any], dict[str, str]]:
  """``(rows by (design, shape), measured rows, {path: what differs} of the files not merged,
  {path: its peak and MFU} of the files whose measured rows are not merged)`` of the
  ``systems.json`` files near the runs; only files at ``PREFILL_SETTING`` are merged, and their
  measured rows (MFU at a peak, device-hours at an MFU) only at the table's own peak and MFU
  (``sweep.DEFAULT_*``: a file made with --peak_flops=1979e12 showed its MFU under the table's
  989 TFLOP/s); where two files hold a row (a measured one: for the same device), the nearer
  wins: every run's own folder is read before any parent, every parent before any grandparent
  (run by run, a suite's file reached through an earlier run's parent beat a later run's
  own)."""
  found: dict[tuple[str, str], dict] = {}
  timed: dict[tuple[str, str, str], dict] = {}
  other_settings: dict[str, str] = {}
  other_costing: dict[str, str] = {}
  from depthbench_jax import sweep  # pylint: disable=g-import-not-at-top
  seen = set()
  workdirs = [r.get("workdir") or "" for r in records]
  levels = [workdirs, [os.path.dirname(d) for d in workdirs],
            [os.path.dirname(os.path.dirname(d)) for d in workdirs]]
  for path in (p for level in levels for p in level):
    f = os.path.join(path, "systems.json")
    if f in seen or not os.path.exists(f):
      continue
    seen.add(f)
    try:
      with open(f) as fh:
        data = json.load(fh)
    except (OSError, json.JSONDecodeError):
      continue
    mismatch = _setting_mismatch(data)
    if mismatch:
      other_settings[f] = mismatch
      continue
    for row in data.get("rows", []):
      found.setdefault((row["design"], row["shape"]), row)
    row0 = (data.get("rows") or [{}])[0]
    costed = (row0.get("peak_flops", sweep.DEFAULT_PEAK_FLOPS),
              row0.get("mfu", sweep.DEFAULT_MFU))
    if data.get("measured") and costed != (sweep.DEFAULT_PEAK_FLOPS, sweep.DEFAULT_MFU):
      other_costing[f] = f"peak {costed[0] / 1e12:.0f} TFLOP/s and MFU {costed[1]:.2f}"
      continue
    for m in data.get("measured") or []:
      timed.setdefault((m["device"], m["design"], m["shape"]), m)
  return found, list(timed.values()), other_settings, other_costing


def systems_table(runs: Iterable[dict], relative_to: str | None = None) -> str | None:
  del relative_to  # The report hook's signature (`report/__init__.py`); links nothing.
  from depthbench_jax import sweep
  from depthbench_jax.systems import costs, measured, table
  records = [r for r in runs if r.get("design") and r.get("n_layers") and r.get("d_model")]
  if not records:
    return None
  groups: dict[tuple[str, str], list[dict]] = {}
  for r in records:
    groups.setdefault((r["design"], f"{r['n_layers']}x{r['d_model']}"), []).append(r)
  xla_rows, timed, other_settings, other_costing = _systems_rows(records)
  rows, left_out, other_model = [], [], {}
  for (design, shape), rs in sorted(groups.items(),
                                    key=lambda kv: (kv[0][0], int(kv[0][1].split("x")[0]))):
    try:
      cfg = run_model_config(rs[0])
    except Exception as e:  # pylint: disable=broad-except
      # A record whose config no longer validates (a design not registered here) is named
      # under the table, not fatal and not dropped unsaid.
      left_out.append(f"{design} {shape} ({e})")
      continue
    config: dict[str, Any] = rs[0].get("config") or {}
    data = config.get("data") or {}
    row = costs.cost_row(
        cfg, seq_len=PREFILL_SEQ_LEN, train_seq_len=int(data.get("seq_len") or 2048),
        tokens_per_param=float(config.get("tokens_per_param") or 20.0),
        peak_flops=sweep.DEFAULT_PEAK_FLOPS, mfu=sweep.DEFAULT_MFU,
        budget_params=_budget_params(rs[0]),
        # A suite that fixes its steps (the smoke sweep) trains those, not the Chinchilla
        # budget: its device-hours were 450x the dry run's.
        train_tokens=costs.fixed_train_tokens(config))
    row["design"] = design   # the report's label: a variant (hc(n_streams=2)) is a row apart
    extra = xla_rows.get((design, shape))
    if extra and extra.get("params_total", row["params_total"]) != row["params_total"]:
      # Another model at this (design, shape): a run's own option (n_streams=2, n_kv_heads).
      other_model[(design, shape)] = (extra["params_total"], row["params_total"])
    elif extra:
      row.update({k: extra[k] for k in ("xla_flops", "peak_bytes", "backend") if k in extra})
    walls = [r.get("wall_time_s") for r in rs if r.get("wall_time_s")]
    row["wall_s"] = sum(walls) if walls else None
    hours = [r["device_hours"] for r in rs if r.get("device_hours")]
    row["run_device_hours"] = sum(hours) if len(hours) == len(walls) and hours else None
    row["device_kinds"] = sorted({r["device_kind"] for r in rs if r.get("device_kind")})
    row["runs"], row["diverged"] = len(rs), sum(r.get("status") == "diverged" for r in rs)
    row["family"] = rs[0].get("family", 0)   # the report's scale family (multi-scale suites)
    rows.append(row)
  note = (["", "Left out, their config does not validate in this checkout: " +
           "; ".join(left_out) + "."] if left_out else [])
  if not rows:
    return "\n".join(note[1:]) or None
  parts = [table.CONVENTION, "", table.markdown_table(rows)] + note
  for path, mismatch in other_settings.items():
    parts += ["", f"Not merged: {path} is at prefill {mismatch} (python -m "
              f"depthbench_jax.systems --seq_len={PREFILL_SEQ_LEN} --batch=1 --dtype=bfloat16, "
              "its defaults, writes one that adds XLA FLOPs, peak memory and measured rows)."]
  for path, costed in other_costing.items():
    parts += ["", f"Measured rows not merged: {path} costs them at {costed}, this table at "
              f"{sweep.DEFAULT_PEAK_FLOPS / 1e12:.0f} TFLOP/s and MFU {sweep.DEFAULT_MFU:.2f} "
              f"(python -m depthbench_jax.systems without --peak_flops and --mfu)."]
  for (design, shape), (theirs, ours) in sorted(other_model.items()):
    parts += ["", f"Not merged: {design} {shape} of systems.json holds {theirs:,} parameters, "
              f"the runs' model {ours:,} (another option or layout): its XLA FLOPs, peak "
              f"memory and measured rows are another model's."]
  summary = table.depth_cost_summary(rows)
  if summary:
    parts += ["", summary]
  timed = [m for m in timed if (m["design"], m["shape"]) in groups
           and (m["design"], m["shape"]) not in other_model]
  if timed:
    parts += ["", "Measured by the bench on the same models (same FLOPs per token, under the "
              "bench's remat policy):", "", measured.markdown(timed)]
  walls = [r for r in rows if r["wall_s"]]
  if walls:
    spent = lambda r: sweep.format_duration(r["wall_s"]) + (
        f" = {r['run_device_hours']:.3g} device-hours ({', '.join(r['device_kinds'])})"
        if r["run_device_hours"] else "") + f" over {r['runs']} run{'s' * (r['runs'] > 1)}" + (
        f", {r['diverged']} stopped at divergence" if r["diverged"] else "")
    parts += ["", "Measured time of the runs (all runs of a shape summed, every LR and copy; "
              "a run stopped at divergence counts only its steps, so sums over other counts of "
              "diverged runs do not compare; device-hours = each session's wall time x its "
              "devices, from summary.json, a session killed without a save counted to its last "
              "checkpoint): " +
              ", ".join(f"{r['design']} {r['shape']} {spent(r)}" for r in walls) + "."]
  return "\n".join(parts)
