"""Will a training run fit? Per-device memory of the real train step, compiled, nothing allocated.

    python -m depthbench_jax.systems.train_memory --config=configs/suite_1p6b.py --devices=16 \
        [--designs=preln,hc] [--shapes=28x2048] [--grad_accum_steps=2] [--budget_gib=80]

For each (design, shape) of the suite: ``train.jitted.jitted_steps`` (the steps training runs) on
``config.mesh`` resolved against ``--devices``, then ``.lower(state, batch).compile()
.memory_analysis()``. Per device: ``state`` = arguments (params, Adam moments and the batch
shard), ``temporaries``, and ``peak`` = arguments + outputs + temporaries - aliased (the state
is donated), against ``--budget_gib``. On a CPU host the devices are XLA's fake host devices
(the command re-runs itself with ``--xla_force_host_platform_device_count``): XLA:CPU's buffer
assignment, a guide for a GPU, which runs cuDNN attention and fuses differently (README,
"Multi-host GPU pods"), compiled without one CPU-only artefact (``compile_for_memory``). A bad
config (a ``--grad_accum_steps`` that does not divide a shard's rows, a mesh that does not fit)
is one error line, exit 2, as ``main.py`` would print it, after the flags that led to it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Sequence

from depthbench_jax.errors import ConfigError, OneLineParser

_CHILD = "DEPTHBENCH_TRAIN_MEMORY_CHILD"
# XLA:CPU has no bf16 dynamic-slice: float normalisation wraps the backward's per-layer slice of
# each saved bf16 stack [L, ...] in converts (f32 stack -> slice -> bf16), and loop-invariant
# code motion then hoists the convert of the whole stack out of the backward loop: an f32 copy
# of every layer's saved carry, live beside the bf16 one. A GPU slices bf16 in place. With the
# pass off the convert stays in the loop, fused with the slice (one layer's worth). 1.6B suite,
# 56x1472 on 16 devices: Pre-LN 47.8 -> 37.7 GiB peak, HC 124 -> 72.7 (its 4 streams made the
# f32 copy 80.5 GiB). fp32 programs compile the same either way.
CPU_COMPILER_OPTIONS = {"xla_disable_hlo_passes": "while-loop-invariant-code-motion"}


def compile_for_memory(lowered):
  """``lowered.compile()``, on a CPU backend with ``CPU_COMPILER_OPTIONS`` (this compile only)."""
  import jax
  cpu = jax.default_backend() == "cpu"
  return lowered.compile(compiler_options=CPU_COMPILER_OPTIONS if cpu else None)


def row(config, design: str, shape: str, budget_gib: float) -> dict:
  """One (design, shape)'s per-device bytes on the devices here (``config.mesh`` over them)."""
  import jax
  import jax.numpy as jnp
  from depthbench_jax.systems.xla import peak_bytes
  from depthbench_jax.train import config_check, jitted, sharding
  config.data.source = "embedded"  # Where tokens come from moves no byte of the step; the
  # suite's data path need not exist on the host that asks.
  model_cfg = config_check.validate(config, jax.device_count(), process_count=1)
  mesh = sharding.make_mesh(config.mesh)
  compiled = jitted.jitted_steps(config, model_cfg, mesh, steps=100)
  batch = {"tokens": jax.ShapeDtypeStruct(
      (config.data.global_batch_size, config.data.seq_len + 1), jnp.int32)}
  lowered = compiled.step_fn.lower(compiled.abstract_state, batch)
  memory = compile_for_memory(lowered).memory_analysis()
  peak = peak_bytes(memory)
  rows = config.data.global_batch_size // sharding.data_parallel_size(mesh)
  k = config.grad_accum_steps
  return {"design": design, "shape": shape, "mesh": dict(mesh.shape), "rows": rows,
          "microbatches": k, "state_bytes": memory.argument_size_in_bytes,
          "temp_bytes": memory.temp_size_in_bytes, "peak_bytes": peak,
          "alias_bytes": memory.alias_size_in_bytes,   # the donated state, updated in place
          "fits": peak <= budget_gib * 2**30}


def markdown(rows: Sequence[dict], budget_gib: float, backend: str = "cpu") -> str:
  """The table, and under it what its peak is: XLA:``backend``'s buffer assignment."""
  gib = lambda b: f"{b / 2**30:.3g}"
  lines = ["| design | shape | mesh (data, fsdp, tensor) | rows per device / microbatches | "
           "state GiB | temporaries GiB | peak GiB | fits " + f"{budget_gib:g} GiB (spare) |",
           "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    mesh = ", ".join(str(v) for v in r["mesh"].values())
    spare = budget_gib - r["peak_bytes"] / 2**30
    lines.append(f"| {r['design']} | {r['shape']} | {mesh} | {r['rows']} / {r['microbatches']}"
                 f" | {gib(r['state_bytes'])} | {gib(r['temp_bytes'])} | "
                 f"{gib(r['peak_bytes'])} | {'yes' if r['fits'] else 'NO'} ({spare:+.3g}) |")
  # Full AttnRes 28x2048 at 78.1 GiB read 'yes' against 80 with no word on what else a GPU holds.
  where = "XLA:CPU's buffer assignment of the step, not a GPU's" if backend == "cpu" else (
      f"XLA:{backend.upper()}'s buffer assignment of the step")
  lines += ["", f"Peak: {where}. An '80 GB' H100 holds 79.6 GiB, less the CUDA context, cuDNN "
            "workspace and collective buffers (a few GiB, outside this count): a fit with little "
            "spare is not one to count on."]
  return "\n".join(lines)


def _rerun_with_devices(devices: int, argv: Sequence[str]) -> int:
  """This command again in a process whose CPU backend has ``devices`` fake devices."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", **{_CHILD: "1"})
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                      f" --xla_force_host_platform_device_count={devices}").strip()
  return subprocess.run([sys.executable, "-m", "depthbench_jax.systems.train_memory", *argv],
                        env=env, check=False).returncode


def main(argv: Sequence[str] | None = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  p = OneLineParser(prog="python -m depthbench_jax.systems.train_memory",
                    description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", required=True, help="a suite file, e.g. configs/suite_1p6b.py")
  p.add_argument("--devices", type=int, required=True, help="devices the run will have")
  p.add_argument("--designs", default="", help="comma list (default: every registered design)")
  p.add_argument("--shapes", default="", help="comma list of LxD (default: the suite's)")
  p.add_argument("--grad_accum_steps", type=int, default=0,
                 help="microbatches per step (default: the suite's config.grad_accum_steps)")
  p.add_argument("--budget_gib", type=float, default=80.0, help="memory per device, GiB")
  args = p.parse_args(argv)
  from depthbench_jax.errors import fail
  for flag, value, ok, allowed in (
      ("devices", args.devices, args.devices >= 1, "an integer >= 1"),
      ("grad_accum_steps", args.grad_accum_steps, args.grad_accum_steps >= 0,
       "an integer >= 0 (0 = the suite's)"),
      ("budget_gib", args.budget_gib, args.budget_gib > 0, "GiB > 0")):
    if not ok:   # one flag named: the line listed all three, good and bad alike
      fail(f"--{flag}={value}; allowed: {allowed}")
  import jax
  if jax.device_count() != args.devices:
    if jax.default_backend() != "cpu" or os.environ.get(_CHILD):
      fail(f"--devices={args.devices}: this host has {jax.device_count()} "
           f"{jax.default_backend()} devices; allowed: {jax.device_count()}, or any number on a "
           "CPU host (fake devices)")
    return _rerun_with_devices(args.devices, argv)
  from depthbench_jax.systems.__main__ import comma_list, suite_configs
  try:
    _, entries = suite_configs(args.config, comma_list(args.designs), comma_list(args.shapes))
    rows = []
    for design, shape, config in entries:
      if args.grad_accum_steps:
        config.grad_accum_steps = args.grad_accum_steps
      try:
        rows.append(row(config, design, shape, args.budget_gib))
      except ConfigError as e:  # The config's words; the knobs the user turned are these flags.
        given = f"--devices={args.devices}" + (
            f" --grad_accum_steps={args.grad_accum_steps}" if args.grad_accum_steps else "")
        raise ConfigError(f"{given} ({design} {shape}): {e}") from None
      print(f"  {design} {shape}: peak {rows[-1]['peak_bytes'] / 2**30:.2f} GiB", file=sys.stderr,
            flush=True)
  except ConfigError as e:
    fail(str(e))
  from depthbench_jax import revision
  # Which compiler and code: the GPU log and the CPU one otherwise differ only in their numbers.
  print(f"{jax.devices()[0].device_kind} ({jax.default_backend()}), jax {jax.__version__}, code "
        f"{revision.label([revision.code_revision()]) or 'unrecorded'}")
  print(markdown(rows, args.budget_gib, jax.default_backend()))
  return 0


if __name__ == "__main__":
  sys.exit(main())
