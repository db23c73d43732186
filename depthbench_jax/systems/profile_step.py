"""``python -m depthbench_jax.systems.profile_step --design=hc``: where a train step's time goes.

Profiles the bench's train step (``bench.py``'s preset and remat policy) with
``jax.profiler`` and maps every XLA op of the trace back to the model code that emitted it
(the ``op_name`` metadata of the compiled HLO, ``hlo_text.py``), then prints the time per op,
with its calls, the bytes it moves and the bandwidth that makes, and per part of the
model: ``fwd``/``bwd`` (autodiff's ``transpose(jvp(...))``) x the module path, e.g.
``bwd residual.sublayer/mlp`` or ``fwd lm_head``. On CPU it sets
``--xla_cpu_enable_xprof_traceme`` so XLA records one event per fusion. Op times on XLA:CPU
can overlap (independent ops run concurrently), so their sum exceeds the step; compare
designs with the interleaved bench, use this to see what to fix.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import os
import re
import sys
import tempfile
import warnings
from typing import Sequence

# XLA:CPU records one event per fusion only with traceme on. XLA:GPU replays runs of kernels
# as command buffers (CUDA graphs), which the trace shows as one ``command_buffer_N`` event
# each (the first H200 profile: five events per step, nothing mapped to the model); with
# command buffers off each kernel is its own event (the eighth session's H200 profiles,
# benchmarks/logs-nvidia-h200/profile-*.txt).
_FLAGS = ("--xla_cpu_enable_xprof_traceme=true", "--xla_gpu_enable_command_buffer=")
for _flag in _FLAGS:  # before jax initialises its backends
  if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

import jax  # noqa: E402

from depthbench_jax import bench  # noqa: E402
from depthbench_jax.errors import OneLineParser  # noqa: E402
from depthbench_jax.systems.hlo_text import op_bytes, op_names, op_shapes  # noqa: E402

# jax's profiler bindings warn on every read of a GPU event's stats (python 3.12).
warnings.filterwarnings("ignore", message="builtin type event_stats has no __module__")

_SKIP = ("PjRt", "Thunk", "jit_", "Execute", "SlinkyThreadPool", "PjitFunction")
_CONTROL_FLOW = ("while", "call", "conditional")
# eval_jaxpr: a call frame like closed_call in newer jax (0.11, the H200 profiles' parts).
_FRAMES = {"while", "body", "closed_call", "eval_jaxpr", "checkpoint", "rematted_computation",
           "layers", "cond"}


UNMAPPED = "(no HLO op of the step)"


def model_part(op_name: str, depth: int) -> str:
  """``'bwd residual.sublayer/mlp'`` from ``jit(train_step)/transpose(jvp(Transformer))/while/
  body/closed_call/checkpoint/layers/residual.sublayer/mlp/...`` (``depth`` path components
  after the autodiff and loop frames are dropped)."""
  if op_name == UNMAPPED:
    return op_name
  direction = "bwd" if "transpose(" in op_name else "fwd"
  parts = [p for p in op_name.split("/")
           if p not in _FRAMES and not re.match(r"(jit|jvp|transpose)\(", p)]
  return f"{direction} {'/'.join(parts[:depth]) or '(top level)'}"


def _event_name(event) -> str:
  """A GPU kernel's HLO op (its ``hlo_op`` stat: a cuBLAS kernel is named by cuBLAS), else the
  event's own name (XLA:CPU names its events by the HLO op)."""
  for key, value in event.stats:
    if key == "hlo_op":
      return str(value)
  return event.name


def event_seconds(xplane_path: str, steps: int
                  ) -> tuple[dict[str, float], dict[str, float], list[str]]:
  """Seconds and calls per step of each named trace event: the GPU's kernels where the trace
  has a GPU (the host's launch events would count each op twice), else every event; and the
  names of the planes read (``/device:GPU:0``, ``/host:CPU``)."""
  data = jax.profiler.ProfileData.from_file(xplane_path)
  planes = [p for p in data.planes if p.name.startswith("/device:GPU")] or list(data.planes)
  if os.environ.get("DEPTHBENCH_PROFILE_SAMPLES"):
    _print_samples(planes)
  total: collections.Counter = collections.Counter()
  calls: collections.Counter = collections.Counter()
  for plane in planes:
    for line in plane.lines:
      for event in line.events:
        name = _event_name(event)
        if not name.startswith(_SKIP):
          total[name] += event.duration_ns / 1e9 / steps
          calls[name] += 1 / steps
  return dict(total), dict(calls), [p.name for p in planes]


def _print_samples(planes, limit: int = 12) -> None:
  """The first event of each trace line (plane, line, name, stats) on stderr: what a new
  backend's trace looks like (``DEPTHBENCH_PROFILE_SAMPLES=1``)."""
  lines = [(plane, line) for plane in planes for line in plane.lines]
  for plane, line in lines[:limit]:
    e = next(iter(line.events), None)
    if e is not None:
      print(f"{plane.name} | {line.name} | {e.name[:50]} | "
            f"{[(k, str(v)[:40]) for k, v in e.stats][:8]}", file=sys.stderr)


def profile(design: str, preset: bench.Preset, steps: int = 2, hlo_out: str = "") -> dict:
  """Per-op and per-part seconds of ``steps`` train steps of ``design`` (after 2 warm-up);
  ``hlo_out``: a file for the compiled step's HLO text (fusions and shapes, to read offline)."""
  c = bench.compile_train_step(design, bench.bench_config(preset, design))
  run = bench.step_runner(c)
  for _ in range(2):
    run()
  with tempfile.TemporaryDirectory() as tmp:
    jax.profiler.start_trace(tmp)
    for _ in range(steps):
      run()
    jax.profiler.stop_trace()
    (xplane,) = glob.glob(os.path.join(tmp, "**", "*.xplane.pb"), recursive=True)
    seconds, calls, planes = event_seconds(xplane, steps)
  hlo = c.step.as_text()
  if hlo_out:
    with open(hlo_out, "w") as f:
      f.write(hlo)
  names, shapes, moved = op_names(hlo), op_shapes(hlo), op_bytes(hlo)
  on_gpu = any(p.startswith("/device:GPU") for p in planes)
  # A loop or call's event spans its body's events: count the body only. On a GPU every
  # kernel is step time, so one that names no HLO op of the step is listed as unmapped.
  ops = {n: (s, names.get(n, UNMAPPED)) for n, s in seconds.items()
         if (n in names or on_gpu) and not n.startswith(_CONTROL_FLOW)}
  return {"design": design, "ops": ops, "remat_policy": c.cfg.remat_policy, "planes": planes,
          "mapped": sum(n in names for n in ops),
          "shapes": {n: shapes.get(n, "") for n in ops},
          "calls": {n: calls[n] for n in ops}, "bytes": {n: moved.get(n, 0) for n in ops}}


def bandwidth(result: dict, name: str) -> float:
  """GB/s an op reached: its bytes per call (``hlo_text.op_bytes``) x calls / time."""
  seconds = result["ops"][name][0]
  return result["bytes"][name] * result["calls"][name] / seconds / 1e9 if seconds else 0.0


def by_part(ops: dict, depth: int) -> list[tuple[str, float]]:
  parts: collections.Counter = collections.Counter()
  for seconds, op_name in ops.values():
    parts[model_part(op_name, depth)] += seconds
  return parts.most_common()


def part_difference(ops: dict, base_ops: dict, depth: int) -> list[tuple[str, float, float]]:
  """``(part, seconds, baseline seconds)`` for every part of either profile, the parts a
  design adds most time to first (a part missing from one side counts 0 there)."""
  ours, theirs = dict(by_part(ops, depth)), dict(by_part(base_ops, depth))
  parts = set(ours) | set(theirs)
  rows = [(p, ours.get(p, 0.0), theirs.get(p, 0.0)) for p in parts]
  return sorted(rows, key=lambda r: (r[2] - r[1], r[0]))


def main(argv: Sequence[str] | None = None) -> int:
  ap = OneLineParser(prog="python -m depthbench_jax.systems.profile_step",
                     description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--design", default="preln",
                  help="a design, optionally with residual overrides: mhc:sinkhorn_kernel=pallas")
  ap.add_argument("--preset", default="cpu", choices=sorted(bench.PRESETS))
  ap.add_argument("--steps", type=int, default=2)
  ap.add_argument("--top", type=int, default=25, help="parts and ops listed")
  ap.add_argument("--depth", type=int, default=3, help="module path components per part")
  ap.add_argument("--hlo_out", default="", help="write the compiled step's HLO text here")
  ap.add_argument("--baseline", default="",
                  help="a second design profiled the same way (e.g. preln): the parts are then "
                       "also listed by the time --design adds over it (exact on a GPU, where "
                       "kernels do not overlap; indicative on a CPU)")
  args = ap.parse_args(argv)
  # --steps=0 once compiled and ran the warm-up, then divided by it; --top=-1 listed all but
  # the last, --depth=-2 cut each part name's last two components: each after the profile.
  for flag in ("steps", "top", "depth"):
    if getattr(args, flag) < 1:
      ap.error(f"--{flag}={getattr(args, flag)}; allowed: an integer >= 1")
  folder = os.path.dirname(os.path.abspath(args.hlo_out))
  if args.hlo_out and (os.path.isdir(args.hlo_out) or not os.path.isdir(folder)):
    # Written after the compile and the profiled steps: a traceback at the end once.
    ap.error(f"--hlo_out={args.hlo_out}: " + ("a folder" if os.path.isdir(args.hlo_out) else
                                              f"no folder {folder}")
             + "; allowed: a file path in an existing folder")
  specs = {"--design": args.design}
  if args.baseline:
    specs["--baseline"] = args.baseline
  preset = dataclasses.replace(bench.PRESETS[args.preset], designs=(args.design,))
  for flag, spec in specs.items():
    try:
      bench.design_spec(spec, flag)
      bench.check_model(preset, spec, f"{preset.n_layers}x{preset.d_model}", flag)
    except ValueError as e:
      ap.error(str(e))
  result = profile(args.design, preset, args.steps, args.hlo_out)
  ops = result["ops"]
  print(f"{args.design} ({result['remat_policy']}), preset {args.preset}: "
        f"{sum(s for s, _ in ops.values()) * 1e3:.0f} ms of op time per step; "
        f"{result['mapped']} of {len(ops)} ops mapped to the model; planes read: "
        f"{', '.join(result['planes'])}")
  print("\nper part (ms/step):")
  for part, seconds in by_part(ops, args.depth)[:args.top]:
    print(f"  {seconds * 1e3:9.1f}  {part}")
  print(f"\ntop {args.top} ops: ms/step, calls/step, MB moved per call (result + operands "
        f"read), GB/s reached")
  for name, (seconds, op_name) in sorted(ops.items(), key=lambda kv: -kv[1][0])[:args.top]:
    print(f"  {seconds * 1e3:9.1f} {result['calls'][name]:5.0f} "
          f"{result['bytes'][name] / 1e6:8.1f} {bandwidth(result, name):7.0f}  "
          f"{name[:60]:28s} {result['shapes'][name]:24s} {model_part(op_name, 8)}")
  if args.baseline:
    base = profile(args.baseline, preset, args.steps)["ops"]
    total, base_total = (sum(s for s, _ in o.values()) for o in (ops, base))
    print(f"\n{args.design} over {args.baseline}: {total * 1e3:.0f} vs {base_total * 1e3:.0f} ms "
          f"of op time per step; per part (ms/step: added, {args.design}, {args.baseline}):")
    for part, seconds, base_seconds in part_difference(ops, base, args.depth)[:args.top]:
      print(f"  {(seconds - base_seconds) * 1e3:+9.1f} {seconds * 1e3:9.1f} "
            f"{base_seconds * 1e3:9.1f}  {part}")
  return 0


if __name__ == "__main__":
  from depthbench_jax import hostmem
  hostmem.reexec_with_malloc_tunables("depthbench_jax.systems.profile_step")
  sys.exit(main())
