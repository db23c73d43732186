"""``python -m depthbench_jax.systems.decode_bench``: the inference cost of depth, measured.

The paper counts prefill FLOPs and KV bytes. At a fixed parameter count a deep-narrow model also
runs more, smaller steps one after another for every token it generates, which neither count
shows. Here, for each design at each shape, everything is timed side by side in one process
(``bench.interleaved``: each round calls every candidate once, in ``bench.round_order``):

* ``token``: one greedy decode step at batch B with ``context`` tokens in the per-layer KV
  cache (``model/decode.py``'s cached step, the cache donated and written in place): the new
  token through every layer, attention over the ``context + 1`` cached slots, the LM head and
  the argmax. The cache index is set back to ``context`` before each call, so every call does
  the same work.
* ``prefill``: the forward that fills the cache with ``context`` tokens (time to first token).

Beside each decode time: the bytes a step has to read, every weight once (the input table only
for its B rows) plus the cache (``2 L K hd (context + 1) B``), and the rate that makes. A step
near the host's memory bandwidth is bound by those bytes; one well below it by the per-layer
work that depth adds. Every time is also given over the first shape's Pre-LN (same context and
layer loop), paired round by round like the train bench's ratios.

``--loops`` picks the layer loop: ``unrolled`` (the default: one block per layer, as a serving
stack runs them) or ``scan`` (``nn.scan`` over stacked weights, what training and
``greedy_generate`` run), or both. On XLA:CPU the scanned decode step is bimodal: at 8x512 the
same step takes 13-14 ms or 27-30 ms from call to call, alone in its process and with
nothing else timed, while the unrolled one holds 10-12 ms; with
``--xla_cpu_multi_thread_eigen=false`` the scan holds 13-15 ms. A ratio of two scanned steps'
medians then depends on which mode each landed in (benchmarks/README.md).

Every registered design decodes from the per-layer KV cache (MoDA through its own cached
attention, ``residual/moda.py``); a design whose ``attend`` override does not handle the cache
would decode by full recompute (``decode.supports_kv_cache``) and is refused here with that
reason.

Writes ``OUT/results-<device>-decode.json`` and ``.png`` and prints the table; a run with other
designs, shapes, contexts, loops or batch than the defaults writes beside it, named by what it
changed (``results-cpu-designs-decode-contexts.json``), so it never replaces the default run;
a file there of other cases or batch is refused before anything is timed (``--overwrite``).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import statistics
import sys
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from depthbench_jax import bench, hostmem, revision
from depthbench_jax.errors import OneLineParser
from depthbench_jax.train import summary

DESIGNS = ("preln", "hc", "mhc", "attnres_full", "attnres_block", "moda")
SHAPES = ("8x512", "16x368", "32x256", "64x176")  # the bench's depth run: ~26M layer params each
LOOPS = ("scan", "unrolled")


@dataclasses.dataclass(frozen=True)
class Case:
  """One timed candidate: a design (with ``bench.design_spec`` overrides) at a shape, a context
  and a layer loop (``scan`` or ``unrolled``)."""
  design: str
  shape: str
  context: int
  loop: str

  @property
  def name(self) -> str:
    return f"{self.design}@{self.shape}@ctx{self.context}@{self.loop}"

  @property
  def anchor(self) -> tuple[int, str]:
    """Cases sharing it are compared against one Pre-LN."""
    return self.context, self.loop


DECODE_PRESET_FIELDS = ("vocab_size", "n_heads", "dtype", "attention_kernel")


def decode_preset(preset: dict) -> dict:
  """The fields of a bench preset (as a result records it) that a decode case reads
  (``decode_config``); None for one an older record lacks."""
  return {k: preset.get(k) for k in DECODE_PRESET_FIELDS}


def decode_config(p: bench.Preset, case: Case):
  """The ``ModelConfig`` of ``case`` for inference: the preset's dtype for params and compute,
  no remat, room for ``context + 1`` positions, scanned or unrolled layers."""
  from depthbench_jax.model.config import model_config_from
  from depthbench_jax.systems.xla import inference_config
  n_layers, d_model = bench.shape_spec(case.shape, p.n_heads)
  cfg = model_config_from(bench.bench_config(p, case.design, n_layers, d_model).model)
  return dataclasses.replace(inference_config(cfg, p.dtype), max_seq_len=case.context + 1,
                             scan_layers=case.loop == "scan")


def bytes_per_step(cfg, params: Any, context: int, batch: int) -> int:
  """What one decode step must read: every parameter once, except the input table, of which
  only the ``batch`` looked-up rows; plus the K/V cache of ``context + 1`` slots."""
  from depthbench_jax.systems.costs import kv_cache_bytes
  weights = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  table = params["embed"]["embedding"]
  # A tied LM head reads the whole table; else only the looked-up rows are read.
  unread = 0 if cfg.tie_embeddings else (table.shape[0] - batch) * table.shape[1]
  return int(weights - unread * table.dtype.itemsize
             + kv_cache_bytes(cfg, context + 1, batch, cfg.dtype))


@dataclasses.dataclass
class Prepared:
  case: Case
  cfg: Any
  token: Callable[[], Any]       # -> the next ids [B] after the prompt's greedy token
  prefill: Callable[[], Any]     # -> the greedy ids [B] after the prompt
  compile_s: float
  params: int
  bytes_per_step: int


def prepare(p: bench.Preset, case: Case, batch: int) -> Prepared:
  """Compiles ``case``'s cached step for the prefill and the decode shapes ahead of time
  (``compile_s``: both) and returns one callable for each, which blocks until its result is
  ready. Params from ``PRNGKey(0)``, the prompt [B, context] from ``PRNGKey(1)``; every
  ``token()`` call decodes the same position from the same cache, the one after the prompt's
  own greedy token."""
  import flax.linen as nn

  from depthbench_jax.model import decode
  from depthbench_jax.model.transformer import init_params
  cfg = decode_config(p, case)
  params = nn.unbox(init_params(cfg, jax.random.PRNGKey(0)))
  step = decode.cached_step(cfg)
  ctx = case.context

  @functools.partial(jax.jit, donate_argnums=(1,), static_argnums=(2,))
  def step_from(params, cache, index, tokens, positions, last):
    """``step`` with every layer's cache index first set to ``index`` (inside the program, so
    the reset costs no host round trip per layer)."""
    return step(params, decode.set_cache_index(cache, jnp.full((batch,), index, jnp.int32)),
                tokens, positions, last)

  prompt = jax.random.randint(jax.random.PRNGKey(1), (batch, ctx), 0, cfg.vocab_size, jnp.int32)
  positions = jnp.broadcast_to(jnp.arange(ctx, dtype=jnp.int32), (batch, ctx))
  last = jnp.full((batch,), ctx - 1, jnp.int32)
  token_positions = jnp.full((batch, 1), ctx, jnp.int32)
  zero = jnp.zeros((batch,), jnp.int32)
  filled = {"cache": decode.init_cache(cfg, batch, ctx + 1)}
  start = time.perf_counter()
  fill = step_from.lower(params, filled["cache"], 0, prompt, positions, last).compile()
  new_tokens = jax.ShapeDtypeStruct((batch, 1), jnp.int32)
  step_one = step_from.lower(params, filled["cache"], ctx, new_tokens, token_positions,
                             zero).compile()
  compile_s = time.perf_counter() - start
  next_ids, _, filled["cache"] = fill(params, filled["cache"], prompt, positions, last)
  decoding = {"cache": filled["cache"], "tokens": next_ids[:, None]}
  filled["cache"] = decode.init_cache(cfg, batch, ctx + 1)  # The prefill's own buffer.

  def token():
    ids, _, decoding["cache"] = step_one(params, decoding["cache"], decoding["tokens"],
                                         token_positions, zero)
    return jax.block_until_ready(ids)

  def prefill():
    ids, _, filled["cache"] = fill(params, filled["cache"], prompt, positions, last)
    return jax.block_until_ready(ids)

  return Prepared(case=case, cfg=cfg, token=token, prefill=prefill, compile_s=compile_s,
                  params=int(sum(x.size for x in jax.tree.leaves(params))),
                  bytes_per_step=bytes_per_step(cfg, params, ctx, batch))


def anchors(cases: Sequence[Case]) -> dict[Case, Case]:
  """Each case -> the case its times are divided by: Pre-LN (else the first design) at the
  first shape, with the same context and layer loop."""
  first: dict[tuple[int, str], Case] = {}
  for c in cases:
    first.setdefault(c.anchor, c)
  preln: dict[tuple[int, str], Case] = {}
  for c in cases:
    if c.design == "preln" and c.shape == first[c.anchor].shape:
      preln.setdefault(c.anchor, c)
  first.update(preln)
  return {c: first[c.anchor] for c in cases}


def rows_from_times(prepared: Sequence[Prepared], times: dict[str, list[float]],
                    batch: int) -> list[dict]:
  """The result rows: medians, rates and ratios to each case's anchor (``anchors``), with the
  per-round IQR of each ratio. ``times`` holds ``<name>/token`` and ``<name>/prefill``."""
  by_case = {p.case: p for p in prepared}
  anchor_of = anchors([p.case for p in prepared])
  rows = []
  for p in prepared:
    c, a = p.case, anchor_of[p.case]
    token, prefill = times[f"{c.name}/token"], times[f"{c.name}/prefill"]
    a_token, a_prefill = times[f"{a.name}/token"], times[f"{a.name}/prefill"]
    token_s, prefill_s = statistics.median(token), statistics.median(prefill)
    rows.append({
        "design": c.design, "shape": c.shape, "context": c.context, "loop": c.loop,
        "batch": batch, "n_layers": p.cfg.n_layers, "d_model": p.cfg.d_model,
        "params": p.params, "compile_s": p.compile_s,
        "token_ms": 1e3 * token_s, "tokens_per_s": batch / token_s,
        "bytes_per_step": p.bytes_per_step, "read_gb_per_s": p.bytes_per_step / token_s / 1e9,
        "prefill_ms": 1e3 * prefill_s, "prefill_tokens_per_s": batch * c.context / prefill_s,
        "anchor": a.name,
        "token_over_anchor": token_s / statistics.median(a_token),
        "token_over_anchor_rounds": bench.paired_ratio_band(token, a_token),
        "prefill_over_anchor": prefill_s / statistics.median(a_prefill),
        "prefill_over_anchor_rounds": bench.paired_ratio_band(prefill, a_prefill),
        "anchor_bytes_ratio": p.bytes_per_step / by_case[a].bytes_per_step,
    })
  return rows


class TooManyMaps(RuntimeError):
  """The compiled programs are about to exhaust the process's memory maps."""


def _check_maps(done: int, total: int, held: int, limit: int, largest: int) -> None:
  """Stops before a compile that could exceed ``vm.max_map_count``: XLA:CPU would abort the
  process mid-compile (the default run holds ~54,000 of 65,530 here once all 48 programs are
  compiled). ``largest``: the most maps one case has taken so far; 1.5x of it is kept free."""
  if done < total and held + 1.5 * largest > limit:
    raise TooManyMaps(
        f"decode_bench: after compiling {done} of {total} cases this process holds {held:,} "
        f"memory maps of vm.max_map_count = {limit:,}, and one case has taken up to "
        f"{largest:,}; XLA:CPU aborts a compile that cannot map more. Time fewer cases per run "
        "(--designs, --shapes, --contexts, --loops: each run writes its own file) or raise the "
        "limit (sysctl -w vm.max_map_count=262144). Nothing was timed or written.")


def run(p: bench.Preset, cases: Sequence[Case], batch: int, rounds: int,
        log: Callable[[str], None] = print) -> dict:
  record = bench.run_record(p)  # Read before the run, so an edit landing during it is not.
  # The preset fields a decode case reads (``decode_config``); the train bench's batch,
  # seq_len, rounds, designs ... contradicted this run's own batch and rounds.
  record["preset"] = decode_preset(record["preset"])
  prepared, largest = [], 0
  for case in cases:
    before = hostmem.memory_maps()
    prepared.append(prepare(p, case, batch))
    after = hostmem.memory_maps()
    maps = ""
    if before and after:
      largest = max(largest, after[0] - before[0])
      maps = f", {after[0]:,} memory maps"
    log(f"  compiled {case.name}: {prepared[-1].compile_s:.1f}s, "
        f"{prepared[-1].params / 1e6:.1f}M params{maps}")
    if before and after:
      _check_maps(len(prepared), len(cases), after[0], after[1], largest)
  candidates = {}
  for q in prepared:
    candidates[f"{q.case.name}/token"] = q.token
    candidates[f"{q.case.name}/prefill"] = q.prefill
  times = bench.interleaved(candidates, rounds, warmup=2, log=log)
  return {**record, "batch": batch, "rounds": rounds,
          "rows": rows_from_times(prepared, times, batch), "times_s": times}


def render(result: dict) -> str:
  p = result["preset"]
  head = (f"DepthBench decode on {result['device']} ({result['host_cpu']}, "
          f"{result['cpu_count']} CPUs), {revision.result_label(result)}, jax {result['jax']}, "
          f"{p['dtype']}, batch {result['batch']}, vocab {p['vocab_size']}, "
          f"{result['rounds']} interleaved rounds\n\n")
  # The anchor is the first design when Pre-LN is not among them (``anchors``).
  first = "first Pre-LN" if any(r["design"] == "preln" for r in result["rows"]) else (
      f"first {result['rows'][0]['design']}" if result["rows"] else "anchor")
  lines = ["| design | shape | context | loop | params | decode ms/token (per sequence) "
           f"| x {first} (IQR) | MB read/step | GB/s | prefill ms | x {first} |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in result["rows"]:
    band = r["token_over_anchor_rounds"]
    lines.append(
        f"| {r['design']} | {r['shape']} | {r['context']} | {r['loop']} | "
        f"{r['params'] / 1e6:.1f}M | {r['token_ms']:.2f} | {r['token_over_anchor']:.3f} "
        f"({band['q1']:.3f}-{band['q3']:.3f}) | {r['bytes_per_step'] / 1e6:.0f} | "
        f"{r['read_gb_per_s']:.1f} | {r['prefill_ms']:.1f} | {r['prefill_over_anchor']:.3f} |")
  return head + "\n".join(lines)


def plot(result: dict, path: str) -> str:
  """Three panels against n_layers (log2 axis), one line per design (colour), context (marker)
  and loop (scan dashed): decode ms per token of each sequence (one step), the rate its bytes
  are read at, prefill ms."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from depthbench_jax.report.plots import design_colors  # pylint: disable=g-import-not-at-top
  rows = result["rows"]
  fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
  series = dict.fromkeys((r["design"], r["context"], r["loop"]) for r in rows)
  several = {k: len({s[i] for s in series}) > 1 for i, k in enumerate(("design", "ctx", "loop"))}
  # One colour per design, a line style per loop (scan dashed), a marker per context.
  colors = design_colors([s[0] for s in series])
  markers = {c: "osD^v"[i % 5] for i, c in enumerate(dict.fromkeys(s[1] for s in series))}
  for design, context, loop in series:
    pts = sorted((r for r in rows if (r["design"], r["context"], r["loop"]) ==
                  (design, context, loop)), key=lambda r: r["n_layers"])
    label = " ".join([design] + ([f"ctx {context}"] if several["ctx"] else [])
                     + ([loop] if several["loop"] else []))
    xs = [r["n_layers"] for r in pts]
    style = {"color": colors[design], "linestyle": "--" if loop == "scan" else "-",
             "marker": markers[context]}
    for ax, key in zip(axes, ("token_ms", "read_gb_per_s", "prefill_ms")):
      ax.plot(xs, [r[key] for r in pts], label=label, **style)
  shapes = sorted({(r["n_layers"], r["shape"]) for r in rows})
  titles = ("decode step, ms (a token per sequence)", "decode bytes read, GB/s", "prefill, ms")
  for ax, title in zip(axes, titles):
    ax.set_xscale("log", base=2)
    ax.set_xticks([n for n, _ in shapes], [s for _, s in shapes])
    ax.set_xlabel("shape (n_layers x d_model, ~equal layer parameters)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.suptitle(f"Inference cost of depth on {result['device']} ({result['host_cpu']}), "
               f"{result['preset']['dtype']}, batch {result['batch']}", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def parse_cases(p: bench.Preset, designs: str, shapes: str, contexts: str,
                loops: str) -> list[Case]:
  """The cases of the comma lists (context-major, then loop, shape, design); ValueError names
  the flag and the allowed values of any bad entry."""
  from depthbench_jax.model import decode
  from depthbench_jax.systems.__main__ import comma_list   # an entry given twice: one case
  split = lambda text: comma_list(text) or []
  design_list = split(designs)
  shape_list = list(bench.canonical_shapes(split(shapes), p.n_heads))   # one spelling, once
  for spec in design_list:
    name, _ = bench.design_spec(spec)
    if not decode.design_supports_kv_cache(name):
      raise ValueError(f"--designs entry {spec!r}: {name} decodes by full recompute (its "
                       "attend override does not handle the per-layer KV cache: "
                       "LayerWiring.attend_handles_kv_cache, model/decode.py), so it has no "
                       "cached decode step to time")
  for spec in design_list:
    for shape in shape_list:
      bench.check_model(p, spec, shape)
  context_list = []
  for text in split(contexts):
    if not text.isdigit() or int(text) < 1:
      raise ValueError(f"--contexts entry {text!r}: allowed: positive integers (tokens already "
                       "in the cache), e.g. 512,2048")
    context_list.append(int(text))
  loop_list = split(loops)
  for loop in loop_list:
    if loop not in LOOPS:
      raise ValueError(f"--loops entry {loop!r}: allowed: {', '.join(LOOPS)}")
  for flag, values in (("--designs", design_list), ("--shapes", shape_list),
                       ("--contexts", context_list), ("--loops", loop_list)):
    if not values:
      raise ValueError(f"{flag}: empty; give at least one entry")
  return [Case(d, s, c, loop) for c in context_list for loop in loop_list for s in shape_list
          for d in design_list]


def main(argv: Sequence[str] | None = None) -> int:
  ap = OneLineParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--preset", default=None, choices=sorted(bench.PRESETS),
                  help="vocabulary, heads and dtype only (default: cpu, or gpu400m on an "
                       "accelerator); 'quick' keeps the 8x512..64x176 shapes: give --shapes "
                       "(e.g. 2x32) for a quick run")
  ap.add_argument("--designs", default=",".join(DESIGNS))
  ap.add_argument("--shapes", default=",".join(SHAPES), help="comma list of LxD")
  ap.add_argument("--contexts", default="512", help="tokens in the cache, comma list")
  ap.add_argument("--loops", default="unrolled", help=f"comma list of {', '.join(LOOPS)}")
  ap.add_argument("--batch", type=int, default=1)
  ap.add_argument("--rounds", type=int, default=15)
  ap.add_argument("--out", default=None,
                  help="result directory (default benchmarks); with --replot, for the PNG "
                       "(default: beside the JSON)")
  ap.add_argument("--replot", default="", help="re-render a saved result JSON, time nothing")
  ap.add_argument("--overwrite", action="store_true",
                  help="replace a result file of other cases or batch (else refused)")
  args = ap.parse_args(argv)
  if args.replot:
    try:
      result = bench.read_result(args.replot, ("rows", "preset", "batch"),
                                 "results-<device>-decode.json")
      picture = os.path.splitext(bench.replot_json_path(args.replot, args.out))[0] + ".png"
    except ValueError as e:
      ap.error(str(e))
    print(render(result))
    print(f"wrote {plot(result, picture)}", file=sys.stderr)
    return 0
  args.out = args.out or "benchmarks"
  name = args.preset or ("cpu" if jax.default_backend() == "cpu" else "gpu400m")
  p = bench.PRESETS[name]
  if args.batch < 1 or args.rounds < 1:
    ap.error(f"--batch {args.batch} / --rounds {args.rounds}: allowed: positive integers")
  # Like the train bench: the default run owns results-<device>-decode.json; a run that changes
  # what is timed writes beside it (named by what it changed) instead of over it.
  changed = lambda flag: getattr(args, flag) != ap.get_default(flag)
  path = bench.result_path(
      args.out, bench.device_name(), name, designs=changed("designs"), shapes=changed("shapes"),
      kind="decode" + "".join(f"-{f}" for f in ("contexts", "loops", "batch") if changed(f)))
  try:
    cases = parse_cases(p, args.designs, args.shapes, args.contexts, args.loops)
    summary.check_folder(args.out, f"--out={args.out}")
    # The preset's model fields too: the cpu and gpu400m presets share the device's file name,
    # and a --preset=cpu rerun replaced a gpu400m (bf16, 16-head) result without a word.
    summary.check_replaceable(  # Before timing: a finished result is never lost.
        path, {"cases": sorted(c.name for c in cases), "batch": args.batch,
               "preset": decode_preset(dataclasses.asdict(p))}, args.overwrite,
        flag={"cases": "--designs/--shapes/--contexts/--loops", "batch": "--batch",
              "preset": f"--preset={name}'s"}.get,
        recorded=lambda r: {"cases": sorted(
            f"{x['design']}@{x['shape']}@ctx{x['context']}@{x['loop']}" for x in r["rows"]),
                            "batch": r["batch"],   # older results record the whole preset
                            "preset": decode_preset(r["preset"])},
        rounds=(args.rounds, lambda r: r["rounds"]))
  except ValueError as e:
    ap.error(str(e))
  os.makedirs(args.out, exist_ok=True)
  log = lambda s: print(s, file=sys.stderr, flush=True)
  log(f"device {bench.device_name()}: {len(cases)} cases x 2 (decode step, prefill), "
      f"batch {args.batch}")
  try:
    with bench.compiles_without_disk_cache(log):
      result = run(p, cases, args.batch, args.rounds, log=log)
  except TooManyMaps as e:
    log(str(e))
    return 2
  except jax.errors.JaxRuntimeError as e:
    if "out of memory" not in str(e).lower() and "RESOURCE_EXHAUSTED" not in str(e):
      raise
    # A cache too large for the device (--contexts=100000) was a traceback from dispatch.
    first = str(e).strip().splitlines()[0]
    log(f"error: --contexts/--batch/--shapes: a case does not fit this device ({first}); "
        f"allowed: a smaller context, batch or shape; nothing written")
    return 2
  result["preset_name"] = name
  summary.atomic_write_json(path, result, indent=1, sort_keys=False)
  print(render(result))
  print(f"wrote {path}, {plot(result, os.path.splitext(path)[0] + '.png')}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  hostmem.reexec_with_malloc_tunables("depthbench_jax.systems.decode_bench")
  sys.exit(main())
