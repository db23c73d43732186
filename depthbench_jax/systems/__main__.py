"""``python -m depthbench_jax.systems --config=configs/suite_400m.py --seq_len=4096``

For every shape of the suite and every registered design (or ``--designs``/``--shapes``): prefill
FLOPs per sequence (analytic, causal and as computed, the paper's approximation, and XLA's
``cost_analysis`` of an abstract ``--dtype`` compile, bf16 by default), KV-cache and
residual-state bytes per sequence, parameter bytes, peak memory of ``--batch`` sequences from
``memory_analysis`` (no allocation), training FLOPs per token and device-hours for the suite's
training tokens (the Chinchilla budget, or steps x batch x T for a suite that fixes its steps)
at ``--mfu`` of ``--peak_flops``. Then the same prefill FLOPs as a curve
over context 2k..128k (the ``T^2 L d`` term), as a PNG.

Writes ``OUT/systems.json`` (rows + curve + convention), ``OUT/systems.md`` and
``OUT/context_curve.png`` (``--out``, default ``results/<suite NAME>``, the sweep's results
directory, where the report finds ``systems.json`` and adds its XLA, peak-memory and measured
columns) and prints the tables.
``--xla=false`` skips the compiles (analytic columns only, a second or two). ``--measured`` takes
bench result JSONs (``python -m depthbench_jax.bench``) and adds what the bench timed of the same
models: tokens/s, step over Pre-LN and device-hours measured beside the analytic ones
(``systems/measured.py``). A ``systems.json`` made with other designs, shapes, prefill setting,
``--xla``, ``--mfu``, ``--peak_flops`` or ``--measured`` (its ``options``) is not replaced
without ``--overwrite``: a one-shape check would otherwise drop the suite's table,
``--xla=false`` its compiled counts, a rerun without ``--measured`` its measured rows.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Sequence

from depthbench_jax.errors import ConfigError, OneLineParser


def suite_shapes(config_path: str, module) -> list[str]:
  """The shapes the suite's sweep trains, in its order (every shape set of a multi-scale suite:
  the report's systems section covers each run); a file without a sweep: all its shape sets."""
  from depthbench_jax import sweep
  check_is_suite(config_path, module)
  if hasattr(module, "sweep"):
    return list(dict.fromkeys(str(run.shape) for run in sweep.list_runs(config_path)))
  return list(dict.fromkeys(s for shape_set in module.SHAPE_SETS.values()
                            for s in shape_set.shapes))


def shape_set_families(module, shapes: Sequence[str]) -> dict[str, int] | None:
  """``{shape: index of the first SHAPE_SETS entry listing it}``, the suite's own scale families;
  None when a shape is in none (typed with --shapes) or the file has no SHAPE_SETS. Guessed from
  sizes instead, a table of one width per depth was one family whatever the sizes: 16x800
  (205M) and 48x640 (302M) from two scales read as 'the cost of depth at iso-parameters'."""
  from depthbench_jax.shapes import parse_shape
  index = {}
  for i, shape_set in enumerate((getattr(module, "SHAPE_SETS", None) or {}).values()):
    for shape in shape_set.shapes:
      index.setdefault(str(parse_shape(shape)), i)
  return {s: index[s] for s in shapes} if all(s in index for s in shapes) else None


def check_is_suite(config_path: str, module) -> None:
  """One ConfigError unless the file has a sweep or SHAPE_SETS, with --shapes or without: its
  get_config takes no shape either (base.py refusing a shape argument was blamed on --shapes,
  with "allowed: the file alone")."""
  if not hasattr(module, "sweep") and not getattr(module, "SHAPE_SETS", None):
    raise ConfigError(f"--config={config_path} has neither a sweep nor SHAPE_SETS; allowed: a "
                      "suite file, e.g. configs/suite_400m.py")


def comma_list(text: str) -> list[str] | None:
  """``'a, b,a'`` -> ``['a', 'b']`` (an entry given twice was two identical rows, and a rerun
  without the repeat was refused as other settings); None for an empty flag (the default)."""
  return list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip())) or None


def suite_configs(config_path: str, designs: Sequence[str] | None = None,
                  shapes: Sequence[str] | None = None):
  """``(module, [(design, shape, ml_collections config)])``; shapes default to `suite_shapes`."""
  from depthbench_jax import sweep
  from depthbench_jax.residual import registry
  from depthbench_jax.shapes import parse_shape
  module = sweep.load_config_module(config_path)
  try:  # One spelling per shape: '16X1216' and '016x1216' were rows and options of their own.
    shapes = list(dict.fromkeys(str(parse_shape(s)) for s in shapes or ()))
  except ConfigError as err:
    raise ConfigError(f"--shapes: {err}") from None
  if shapes:   # (without --shapes, suite_shapes checks it)
    check_is_suite(config_path, module)
  shapes = shapes or suite_shapes(config_path, module)
  designs = designs or registry.names()
  unknown = [d for d in designs if d not in registry.names()]
  if unknown:  # Named as the flag, not as the suite file's ``arch=`` argument it becomes.
    raise ConfigError(f"--designs: unknown {unknown}; allowed: {', '.join(registry.names())}")
  from depthbench_jax.model.config import model_config_from
  out = []
  for design in designs:
    for shape in shapes:
      try:  # A shape the model refuses is named as the shape (head_dim=25 was all it said).
        config = sweep.config_of(module, f"arch={design},shape={shape}")
        model_config_from(config.model)
      except ConfigError as err:
        raise ConfigError(f"--shapes: {shape} gives {err}") from None
      out.append((design, shape, config))
  return module, out


def check_numbers(*, seq_len: int, batch: int, mfu: float, peak_flops: float) -> None:
  """One ``ConfigError`` naming the flag and its allowed values, before any compile: an empty
  sequence or batch gives a table of nonsense; ``--mfu`` and ``--peak_flops`` as the sweep's
  plan checks them (``sweep.check_device_hours_inputs``)."""
  from depthbench_jax import sweep
  for name, value in (("seq_len", seq_len), ("batch", batch)):
    if not value >= 1:
      raise ConfigError(f"--{name}={value}; allowed: an integer >= 1")
  sweep.check_device_hours_inputs(mfu, peak_flops)


def build(config_path: str, seq_len: int, *, designs=None, shapes=None, with_xla: bool = True,
          mfu: float | None = None, peak_flops: float | None = None, dtype: str = "bfloat16",
          batch: int = 1, measured_paths: Sequence[str] = (), log=print,
          suite: tuple | None = None, timed: list | None = None) -> dict:
  """The table's rows, context curve and measured rows. ``suite``: ``suite_configs``'s
  ``(module, entries)`` when the caller has built them (the CLI does, to check the file it
  would replace), else built here from ``config_path``, ``designs`` and ``shapes``; ``timed``:
  ``measured.bench_rows(measured_paths)`` likewise."""
  from depthbench_jax import sweep
  from depthbench_jax.model.config import model_config_from
  from depthbench_jax.shapes import budget_params
  from depthbench_jax.systems import costs, measured, table, xla
  mfu = sweep.DEFAULT_MFU if mfu is None else mfu
  peak_flops = sweep.DEFAULT_PEAK_FLOPS if peak_flops is None else peak_flops
  check_numbers(seq_len=seq_len, batch=batch, mfu=mfu, peak_flops=peak_flops)
  module, entries = suite or suite_configs(config_path, designs, shapes)
  if timed is None:  # Read first: a wrong path fails before compiles.
    timed = measured.bench_rows(measured_paths)
  rows, cfgs = [], {}
  for design, shape, config in entries:
    config.model.max_seq_len = max(config.model.max_seq_len, seq_len)
    cfg = model_config_from(config.model)
    start = time.perf_counter()
    analysis = xla.prefill_analysis(cfg, seq_len, batch=batch, dtype=dtype) if with_xla else None
    row = costs.cost_row(cfg, seq_len=seq_len, train_seq_len=config.data.seq_len,
                         tokens_per_param=config.tokens_per_param, peak_flops=peak_flops,
                         mfu=mfu, dtype=dtype, xla=analysis,
                         budget_params=budget_params(config),
                         # The smoke suite's 120 steps, not 20 tokens per parameter: 150x.
                         train_tokens=costs.fixed_train_tokens(config))
    row["batch"] = batch  # The peak column's; every other column is per sequence.
    rows.append(row)
    cfgs.setdefault(design, []).append(cfg)
    log(f"  {design:14s} {shape:8s} causal {row['prefill_flops_causal'] / 1e12:6.2f} TFLOPs"
        + (f"  XLA {row['xla_flops'] / 1e12:6.2f}  peak {row['peak_bytes'] / 2**30:5.2f} GiB"
           if analysis else "") + f"  ({time.perf_counter() - start:.1f}s)")
  # One depth summary per scale: the suite's shape sets, else families by size (--shapes).
  by_set = shape_set_families(module, [r["shape"] for r in rows])
  if by_set is None:
    from depthbench_jax.report.scorecard import assign_families
    assign_families(rows)
  else:
    for r in rows:
      r["family"] = by_set[r["shape"]]
  lengths = table.context_lengths()
  curve_design = "preln" if "preln" in cfgs else next(iter(cfgs))
  families = {r["shape"]: r["family"] for r in rows if r["design"] == curve_design}
  curve = table.context_curve(cfgs[curve_design], lengths, dtype, families)
  measured_rows, skipped = measured.match(rows, timed, peak_flops=peak_flops)
  for line in skipped:
    log(f"  --measured: left out {line}")
  for path in sorted(set(measured_paths) - {r["source"] for r in measured_rows}):
    log(f"  --measured: {path} timed none of the table's (design, shape)s")
  return {"suite": sweep.suite_name(module),
          "seq_len": seq_len, "convention": table.CONVENTION, "rows": rows, "curve": curve,
          "curve_design": curve_design, "measured": measured_rows,
          "measured_skipped": skipped}


def render(result: dict) -> str:
  from depthbench_jax import revision
  from depthbench_jax.systems import measured, table
  parts = [f"## Systems cost of depth ({result['suite']})", "", table.CONVENTION, "",
           table.markdown_table(result["rows"])]
  made = result.get("made_by")
  if made and any("xla_flops" in r for r in result["rows"]):   # --xla=false compiles nothing
    parts += ["", f"XLA columns compiled by jax {made['jax']} ({made['backend']}) at code "
              f"{revision.label([made['code']]) or 'unrecorded'}."]
  summary = table.depth_cost_summary(result["rows"])
  if summary:
    parts += ["", "Shallowest -> deepest shape, per design:", "", summary]
  timed = measured.markdown(result.get("measured") or [], result.get("measured_skipped") or [])
  if timed:
    parts += ["", "Measured training cost (the bench's timed steps of the same models, same "
              "FLOPs per token, under the bench's remat policy; the analytic device-hours above "
              "assume one MFU for every design):", "", timed]
  curve = table.curve_markdown(result["curve"])
  if curve:
    parts += ["", f"Causal prefill FLOPs per sequence over context length "
              f"({result['curve_design']}):", "", curve]
  return "\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
  p = OneLineParser(prog="python -m depthbench_jax.systems", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", required=True, help="a suite file, e.g. configs/suite_400m.py")
  p.add_argument("--seq_len", type=int, default=4096)
  p.add_argument("--batch", type=int, default=1)
  p.add_argument("--designs", default="", help="comma list (default: every registered design)")
  p.add_argument("--shapes", default="",
                 help="comma list of LxD (default: every shape the suite's sweep trains)")
  p.add_argument("--xla", default="true", choices=("true", "false"),
                 help="abstract-compile each model for cost_analysis / memory_analysis")
  p.add_argument("--mfu", type=float, default=None)
  p.add_argument("--peak_flops", type=float, default=None, help="per device, FLOP/s")
  p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
  p.add_argument("--measured", default="",
                 help="comma list of bench result JSONs (benchmarks/results-<device>*.json) "
                      "whose timed (design, shape) steps to add as measured device-hours")
  p.add_argument("--out", default=None,
                 help="output dir (default results/<suite NAME>: the sweep's results dir, "
                      "which the report reads)")
  p.add_argument("--overwrite", action="store_true",
                 help="replace a systems.json made with other options")
  args = p.parse_args(argv)
  try:
    from depthbench_jax import sweep
    from depthbench_jax.train import summary
    mfu = sweep.DEFAULT_MFU if args.mfu is None else args.mfu
    peak = sweep.DEFAULT_PEAK_FLOPS if args.peak_flops is None else args.peak_flops
    check_numbers(seq_len=args.seq_len, batch=args.batch, mfu=mfu, peak_flops=peak)
    suite = suite_configs(args.config, comma_list(args.designs), comma_list(args.shapes))
    module, entries = suite
    # An empty --out= (an unset variable) is refused by check_folder, as the sweep's
    # --results_dir=: it wrote a one-design table into the default folder the report reads.
    out = os.path.join("results", sweep.suite_name(module)) if args.out is None else args.out
    summary.check_folder(out, f"--out={out}")
    # What decides the file's rows, columns and figures; checked before any compile. A rerun
    # without --measured once dropped the table's measured device-hours without a word.
    options = {"designs": list(dict.fromkeys(d for d, _, _ in entries)),
               "shapes": list(dict.fromkeys(s for _, s, _ in entries)), "seq_len": args.seq_len,
               "batch": args.batch, "dtype": args.dtype, "xla": args.xla == "true",
               "mfu": mfu, "peak_flops": peak, "measured": comma_list(args.measured)}
    from depthbench_jax.systems import measured
    timed = measured.bench_rows(options["measured"] or ())  # A bad file: its own error first.
    summary.check_replaceable(os.path.join(out, "systems.json"), options, args.overwrite)
    result = build(args.config, args.seq_len, with_xla=args.xla == "true", mfu=mfu,
                   peak_flops=peak, dtype=args.dtype, batch=args.batch,
                   measured_paths=options["measured"] or (),
                   log=lambda s: print(s, file=sys.stderr, flush=True), suite=suite, timed=timed)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  result["options"] = options
  import jax
  from depthbench_jax import revision
  # XLA's FLOP and peak columns depend on the jax/XLA version and backend that compiled them.
  result["made_by"] = {"jax": jax.__version__, "backend": jax.default_backend(),
                       "code": revision.code_revision()}
  os.makedirs(out, exist_ok=True)
  from depthbench_jax.systems import table
  png = table.plot_context_curve(result["curve"], os.path.join(out, "context_curve.png"))
  text = render(result) + f"\n\n![prefill FLOPs vs context]({os.path.basename(png)})\n"
  # Whole or not at all, the table first: a failed write keeps the last systems.json and its .md.
  summary.atomic_write_json(os.path.join(out, "systems.json"), result, indent=1, sort_keys=False)
  summary.atomic_write_text(os.path.join(out, "systems.md"), text)
  print(text)
  print(f"wrote {out}/systems.json, systems.md, context_curve.png", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
