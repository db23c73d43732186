"""``python -m depthbench_jax.bench``: step time, MFU, memory and compile time, side by side.

Everything is measured in one process on whatever device is present, and every ratio is taken
between candidates timed *interleaved*: each round times one step of every candidate in turn
(each round in another order, ``round_order``), and a candidate's figure is its median over the
rounds, so load from other processes hits all of them alike; the interquartile range of the
per-round ratios is reported beside each ratio. Measured:

* ``matmul_peak``: the FLOP/s of a square matmul in the bench dtype, timed as one more
  interleaved candidate (the same run's ceiling, under the same load).
* ``stream_bandwidth``: the bytes/s of chained ``y = a y + x`` passes over arrays of
  ``stream_mib`` MiB, one more candidate, and with it the host's balance, matmul peak over
  bandwidth in FLOP/byte: the designs' extra work is mostly memory passes and the backbone's
  GEMMs, so where the balance is higher their step over Pre-LN is higher (benchmarks/README.md;
  the Zen 5 host: about 6.5 FLOP/byte).
* ``train``: for each design at one shape, the jitted AdamW train step (``train/step.py``, the
  one training uses, params donated): step time, model FLOP/s (``flops.train_flops_per_token``:
  6 N + attention + design terms; remat recompute is not counted) and MFU = that / matmul_peak;
  step time and peak memory (``memory_analysis`` of the compiled step) as ratios to Pre-LN.
  With several shapes (``--shapes=8x512,32x256``), shape by shape, the first shape's Pre-LN
  timed again in each later shape's rounds: ``step_over_first_preln`` is the cost of depth.
* ``compile``: abstract compile time of the Pre-LN train step at ``deep`` vs ``shallow`` layers
  (scan keeps it flat), interleaved, median.
* ``hf``: our Pre-LN step against Hugging Face ``LlamaForCausalLM`` (torch, same device type
  only on CPU) at the same shape and batch: forward, cross-entropy, backward, clip, AdamW.

Writes ``OUT/results-<device>.json`` (``--out``, default ``benchmarks``) and its picture
``results-<device>.png`` (``bench_plot.py``), and prints the table and a verdict against the
targets (``bench_verdict.py``: thresholds live there, never in tests). A file in OUT of other
designs or shapes is refused before anything is timed (``--overwrite`` replaces it).
``--replot=JSON`` re-renders a saved result without timing anything.
``--preset=quick`` is the tiny CI mode; ``--preset=gpu400m`` the bf16 400M shapes for an
accelerator.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import os
import platform
import statistics
import sys
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from depthbench_jax import hostmem, revision
from depthbench_jax.bench_verdict import STEP_TARGETS, TARGETS, render, verdict
from depthbench_jax.errors import OneLineParser
from depthbench_jax.train import summary


# Remat policy per design (the fastest measured on 2 CPU cores at 8x512, batch 8 x 128,
# interleaved; benchmarks/README.md): save the matmul outputs, recompute the elementwise work.
# Full AttnRes trains through model/buffer_stack.py under any remat policy (the source buffer
# saved once); under dots_saveable it replays each branch's VJP from the saved matmuls:
# 1.13x Pre-LN vs 1.17x recomputing them (nothing_saveable), at 1.06x vs 0.95x Pre-LN's peak.
REMAT = {"default": "dots_saveable"}
ANCHOR = "preln@first_shape"
REMAT_CHOICES = ("none", "nothing_saveable", "dots_saveable")


@dataclasses.dataclass(frozen=True)
class Preset:
  d_model: int = 512
  n_layers: int = 8
  n_heads: int = 8
  vocab_size: int = 50257
  seq_len: int = 128
  batch: int = 8
  dtype: str = "float32"
  designs: tuple[str, ...] = ()          # () = every registered design
  shapes: tuple[str, ...] = ()           # extra "LxD" shapes (gpu400m); () = (n_layers x d)
  rounds: int = 7
  matmul_n: int = 2048
  matmul_reps: int = 16
  stream_mib: int = 64                   # bandwidth probe: arrays of this size, out of cache
  stream_reps: int = 8
  compile_layers: tuple[int, int] = (16, 70)
  compile_rounds: int = 6
  hf: bool = True
  attention_kernel: str = "xla"          # 'fused' = cuDNN flash attention (GPU, bf16)
  remat: str = ""                        # one policy for every design; "" = REMAT's


PRESETS = {
    "cpu": Preset(),
    "quick": Preset(d_model=32, n_layers=2, n_heads=2, vocab_size=64, seq_len=16, batch=2,
                    designs=("preln", "hc"), rounds=2, matmul_n=128, matmul_reps=2,
                    stream_mib=1, stream_reps=2, compile_layers=(1, 2),
                    compile_rounds=1),
    "gpu400m": Preset(d_model=1216, n_layers=16, n_heads=16, vocab_size=50257, seq_len=2048,
                      batch=8, dtype="bfloat16", designs=("preln", "hc"),
                      shapes=("16x1216", "32x896"), rounds=10, matmul_n=8192, matmul_reps=20,
                      stream_mib=1024, stream_reps=20,
                      compile_layers=(16, 70), compile_rounds=2, hf=False,
                      attention_kernel="fused"),
}


def device_name() -> str:
  """``cpu`` or the accelerator's kind, lower-case with dashes (``nvidia-h200``)."""
  d = jax.devices()[0]
  if d.platform == "cpu":
    return "cpu"
  return "-".join(d.device_kind.lower().replace("_", " ").split())


def host_cpu() -> str:
  """The host CPU (``/proc/cpuinfo`` on Linux): step-time ratios and the GEMM ceilings differ
  between hosts by more than between the designs, so a result names its host. A VM may report
  only "AMD EPYC", so the family/model numbers and the vector width follow the name:
  ``'AMD EPYC (family 26 model 2, AVX-512)'`` (a Zen 5, whose fp32 GEMM under XLA is 2.3x that
  of the AVX2 EPYC of the earlier runs, on the same 2 cores)."""
  try:
    with open("/proc/cpuinfo") as f:
      block = f.read().split("\n\n")[0]
  except OSError:
    block = ""
  return describe_cpuinfo(block)


def describe_cpuinfo(block: str) -> str:
  """One processor's ``/proc/cpuinfo`` block as ``'name (family F model M, AVX-512)'``; the
  name from ``platform`` where the block has none (no ``/proc/cpuinfo``: an empty block)."""
  fields = {}
  for line in block.splitlines():
    key, _, value = line.partition(":")
    fields.setdefault(key.strip(), value.strip())
  flags = set(fields.get("flags", "").split())
  detail = []
  if "cpu family" in fields and "model" in fields:
    detail.append(f"family {fields['cpu family']} model {fields['model']}")
  if "avx512f" in flags or "avx2" in flags:
    detail.append("AVX-512" if "avx512f" in flags else "AVX2")
  name = fields.get("model name") or platform.processor() or platform.machine()
  return f"{name} ({', '.join(detail)})" if detail else name


def run_record(p: Preset) -> dict[str, Any]:
  """What a result needs to be read later: the device, host CPU, versions, the code revision
  (read now, before an edit during the run can land), the preset, the time and the host malloc.
  Every bench's result starts with it."""
  return {
      "device": device_name(), "device_kind": jax.devices()[0].device_kind,
      "backend": jax.default_backend(), "cpu_count": os.cpu_count(), "host_cpu": host_cpu(),
      "jax": jax.__version__, "python": platform.python_version(), "code": revision.code_revision(),
      "preset": dataclasses.asdict(p), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
      "host_malloc": hostmem.describe()}


def torch_version() -> str | None:
  """The installed torch's version (the HF baseline's), read without importing torch."""
  from importlib import metadata
  try:
    return metadata.version("torch")
  except metadata.PackageNotFoundError:
    return None


def hf_missing() -> str | None:
  """Why the HF baseline cannot run here, else None: torch or transformers not installed
  (``setup.py`` lists them under the ``test`` extra only), or installed and failing to import
  (``hf_runner`` once returned None then, and the check left the verdict without a word)."""
  import importlib
  import importlib.util
  absent = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
  if absent:
    return f"{' and '.join(absent)} not installed (pip install -e '.[test]')"
  for module in ("torch", "transformers"):
    try:
      importlib.import_module(module)
    except Exception as e:  # pylint: disable=broad-except  # a broken install: any error
      return f"{module} fails to import ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
  return None


# ---------------------------------------------------------------------------------------------
# Timing.
# ---------------------------------------------------------------------------------------------

def round_order(names: Sequence[str], r: int) -> list[str]:
  """Round r's calling order: from candidate ``r mod k`` in steps of ``s``, the ``(r mod m)``-th
  of the m step sizes coprime to k. Each candidate runs first once every k rounds, and the
  neighbour it follows changes with ``s`` (a plain rotation, s = 1, kept a candidate behind the
  same neighbour in every round but the one it started: 7 of the CPU bench's 14 candidates,
  the XLA matmul ceiling always behind torch's, in its 7 rounds)."""
  k = len(names)
  steps = [s for s in range(1, k) if math.gcd(s, k) == 1] or [1]
  s = steps[r % len(steps)]
  return [names[(r + i * s) % k] for i in range(k)]


def interleaved(candidates: dict[str, Callable[[], Any]], rounds: int, warmup: int = 2,
                log: Callable[[str], None] | None = None) -> dict[str, list[float]]:
  """Seconds per call of each candidate: ``rounds`` rounds, each calling every candidate once
  (each call must block until its result is ready) in ``round_order``, so no candidate always
  runs first or always follows the same neighbour (a heavy GEMM chain, torch's thread pool
  winding down). ``log`` gets a line before the warm-up and one per round (elapsed, ETA)."""
  start_all = time.perf_counter()
  if log is not None:
    log(f"  timing {len(candidates)} candidates x {rounds} rounds, after {warmup} warm-up "
        f"calls each")
  for fn in candidates.values():
    for _ in range(warmup):
      fn()
  names = list(candidates)
  times: dict[str, list[float]] = {k: [] for k in names}
  timed_start = time.perf_counter()
  for r in range(rounds):
    for name in round_order(names, r):
      start = time.perf_counter()
      candidates[name]()
      times[name].append(time.perf_counter() - start)
    if log is not None:
      now = time.perf_counter()
      eta = (now - timed_start) / (r + 1) * (rounds - r - 1)
      log(f"  round {r + 1}/{rounds}: {now - start_all:.0f}s elapsed, ETA {eta:.0f}s")
  return times


def paired_ratio_band(num: Sequence[float], den: Sequence[float]) -> dict[str, float]:
  """Quartiles of the per-round ratios ``num[i] / den[i]`` (both timed in the same round).

  The reported ratio stays the ratio of medians; this band shows how far a single round's
  ratio strays (machine speed drifts between rounds, and pairing within a round cancels most
  of it), so a verdict a hair over its target can be read against the run's own noise.
  """
  ratios = [a / b for a, b in zip(num, den)]
  if len(ratios) < 2:
    return {"q1": ratios[0], "median": ratios[0], "q3": ratios[0]}
  q1, med, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
  return {"q1": q1, "median": med, "q3": q3}


def matmul_runner(n: int, dtype, reps: int) -> Callable[[], None]:
  """``reps`` chained ``a @ b`` of ``n x n`` operands (``2 n^3 reps`` FLOPs) in one call: the
  device's matmul ceiling, timed as one more interleaved candidate (and about as long as a
  train step) so it sees the same load as the steps it is the denominator of."""
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
  b = jax.random.normal(jax.random.PRNGKey(1), (n, n), dtype) / n ** 0.5
  f = jax.jit(lambda a, b: jax.lax.fori_loop(0, reps, lambda i, x: x @ b, a))
  return lambda: f(a, b).block_until_ready()


def stream_runner(mib: int, dtype, reps: int) -> Callable[[], None]:
  """``reps`` chained ``y = 0.5 y + x`` over arrays of ``mib`` MiB: each pass reads x and y and
  writes y in place, ``3 * mib MiB * reps`` bytes a call, the memory traffic of AdamW-like
  elementwise work out of cache. One more interleaved candidate, as ``matmul_runner``; y is
  donated and fed back, so no call copies it first."""
  n = mib * 2**20 // jnp.dtype(dtype).itemsize
  x = jnp.ones((n,), dtype)
  f = jax.jit(lambda x, y: jax.lax.fori_loop(0, reps, lambda i, y: 0.5 * y + x, y),
              donate_argnums=1)
  y = [jnp.zeros((n,), dtype)]

  def run():
    y[0] = f(x, y[0])
    y[0].block_until_ready()
  return run


def stream_bytes(p: Preset) -> int:
  return 3 * p.stream_mib * 2**20 * p.stream_reps


# ---------------------------------------------------------------------------------------------
# Our train step.
# ---------------------------------------------------------------------------------------------

def design_spec(spec: str, flag: str = "--designs") -> tuple[str, dict[str, Any]]:
  """``'mhc:sinkhorn_kernel=pallas:sinkhorn_iters=10'`` -> ``('mhc', {...})``: a design and
  overrides of its ``config.model.residual`` fields (ints, floats and true/false parsed), so
  that two forms of one design are timed side by side (``--designs=mhc,mhc:sinkhorn_kernel=
  pallas``). A malformed entry or an unknown design raises ValueError naming ``flag``."""
  from depthbench_jax.residual import registry
  name, *pairs = spec.split(":")
  if name not in registry.names():
    raise ValueError(f"{flag} entry {spec!r}: unknown design {name!r}; allowed: "
                     f"{', '.join(registry.names())} (each optionally :field=value)")
  overrides = {}
  for pair in pairs:
    key, sep, value = pair.partition("=")
    if not sep or not key:
      raise ValueError(f"{flag} entry {spec!r}: {pair!r} is not key=value; allowed: "
                       "design[:field=value...], e.g. mhc:sinkhorn_kernel=pallas")
    overrides[key] = _parse_value(value)
  return name, overrides


def shape_spec(spec: str, n_heads: int, flag: str = "--shapes") -> tuple[int, int]:
  """``'32x256'`` -> ``(32, 256)``: layers x d_model, both positive, d_model a multiple of the
  preset's ``n_heads``. Anything else raises ValueError naming ``flag`` and the entry."""
  layers, sep, width = spec.strip().partition("x")
  if not (sep and layers.isdigit() and width.isdigit() and int(layers) > 0 and int(width) > 0):
    raise ValueError(f"{flag} entry {spec!r}: not LxD; allowed: positive integers "
                     f"n_layers x d_model, e.g. 8x512,32x256")
  if int(width) % n_heads:
    raise ValueError(f"{flag} entry {spec!r}: d_model {width} is not a multiple of the "
                     f"preset's n_heads {n_heads}; allowed: a multiple of {n_heads}")
  return int(layers), int(width)


def canonical_shapes(specs: Sequence[str], n_heads: int, flag: str = "--shapes"
                     ) -> tuple[str, ...]:
  """``specs``, each checked (``shape_spec``), in one spelling ('LxD') and once: '08x512'
  beside '8x512' was a second row (or decode case) of one shape, and a rerun with the usual
  spelling was refused as other shapes."""
  return tuple(dict.fromkeys(f"{l}x{d}" for l, d in (shape_spec(s, n_heads, flag)
                                                      for s in specs)))


def check_model(p: Preset, spec: str, shape: str, flag: str = "--designs") -> None:
  """Validates the model of ``spec`` at ``shape`` (``model_config_from``) before anything is
  compiled: a bad residual field or value would otherwise show only as that candidate's failed
  row after every other one was timed. ValueError naming ``flag``, the entry and the field; a
  shape no design can take (an odd head_dim) names ``--shapes`` (it blamed ``--designs``)."""
  from depthbench_jax.errors import ConfigError
  from depthbench_jax.model.config import model_config_from
  n_layers, d_model = shape_spec(shape, p.n_heads)
  for named, candidate in ((f"--shapes entry {shape!r}", "preln"),
                           (f"{flag} entry {spec!r} at {shape}", spec)):
    try:
      model_config_from(bench_config(p, candidate, n_layers, d_model).model)
    except ConfigError as e:
      raise ValueError(f"{named}: {e}") from e


def replace_settings(preset: Preset | dict, asked: Preset | None = None) -> dict:
  """The settings that decide a bench result's numbers, as ``summary.check_replaceable``
  compares them: ``preset`` is the asked ``Preset`` or, with ``asked``, a result's recorded
  preset dict (a field older results lack reads as ``asked``'s). The attention kernel, dtype,
  sequence and batch are among them: ``--attention_kernel=xla`` (gpu_bench.sh's fallback) once
  replaced the committed cuDNN result, and a ``--preset=cpu`` run on a GPU the gpu400m one, of
  the same designs and shapes, without a word."""
  read = (lambda k: getattr(preset, k)) if asked is None else (
      lambda k: preset.get(k, getattr(asked, k)))
  settings = {k: read(k) for k in ("designs", "shapes", "attention_kernel", "dtype",
                                   "seq_len", "batch")}
  return {**settings, "no_hf": not read("hf")}


def replot_json_path(json_path: str, out: str | None) -> str:
  """The ``.json`` path ``--replot``'s picture is named after: ``json_path`` itself (the PNG
  lands beside it), or the same name in ``out`` when ``--out`` is given, so that a committed
  PNG is left as it is. A ConfigError (a ValueError) when ``out`` is or lies under a file."""
  if not out:
    return json_path
  summary.check_folder(out, f"--out={out}")
  os.makedirs(out, exist_ok=True)
  return os.path.join(out, os.path.basename(json_path))


def result_path(out: str, device: str, preset: str, remat: str = "", designs: bool = False,
                shapes: bool = False, kind: str = "") -> str:
  """``<out>/results-<device>[-<preset>][-remat-<policy>][-designs][-shapes][-<kind>].json``:
  the default run of a device (``cpu`` or ``gpu400m`` preset, its own designs and shapes) owns
  ``results-<device>.json``; a run that overrides any of them writes beside it, and another
  bench (``kind``, e.g. ``decode``) beside that."""
  suffix = ("" if preset in ("cpu", "gpu400m") else f"-{preset}") + (
      f"-remat-{remat}" if remat else "") + ("-designs" if designs else "") + (
      "-shapes" if shapes else "") + (f"-{kind}" if kind else "")
  return os.path.join(out, f"results-{device}{suffix}.json")


def _parse_value(text: str):
  for cast in (int, float):
    try:
      return cast(text)
    except ValueError:
      pass
  return {"true": True, "false": False}.get(text.lower(), text)


def bench_config(p: Preset, design: str, n_layers: int | None = None, d_model: int | None = None):
  """The full ``config`` (recipe from ``configs/base.py``) of a bench model; ``design`` may
  carry residual overrides (``design_spec``)."""
  from depthbench_jax import sweep
  from depthbench_jax.residual import registry
  design, overrides = design_spec(design)
  c = sweep.base_config()
  m = c.model
  m.d_model, m.n_layers = d_model or p.d_model, n_layers or p.n_layers
  m.n_heads, m.vocab_size = p.n_heads, p.vocab_size
  m.max_seq_len = max(p.seq_len, 8)
  m.dtype = p.dtype
  m.param_dtype = "float32"
  m.attention_kernel = p.attention_kernel
  m.remat_policy = p.remat or REMAT.get(design, REMAT["default"])
  m.residual = {**registry.get(design).defaults, **overrides, "name": design}
  c.data.seq_len, c.data.global_batch_size = p.seq_len, p.batch
  c.steps = 1000
  return c


@dataclasses.dataclass
class Compiled:
  name: str
  cfg: Any
  step: Callable
  state: Any
  batch: dict
  compile_s: float
  peak_bytes: int
  flops_per_step: float


def compile_train_step(name: str, config) -> Compiled:
  from depthbench_jax.model.config import model_config_from
  from depthbench_jax.model.transformer import Transformer
  from depthbench_jax.systems import flops
  from depthbench_jax.systems.xla import peak_bytes
  from depthbench_jax.train.optimizer import lr_schedule, make_optimizer
  from depthbench_jax.train.step import init_state, train_step
  cfg = model_config_from(config.model)
  model = Transformer(cfg)
  optimizer = make_optimizer(config, config.steps)
  step = jax.jit(functools.partial(train_step, model=model, optimizer=optimizer,
                                   schedule=lr_schedule(config, config.steps)),
                 donate_argnums=(0,))
  b, t = config.data.global_batch_size, config.data.seq_len
  state = jax.jit(functools.partial(init_state, model, optimizer, seq_len=t))(
      jax.random.PRNGKey(0))
  tokens = jax.random.randint(jax.random.PRNGKey(1), (b, t + 1), 0, cfg.vocab_size, jnp.int32)
  batch = {"tokens": tokens}
  start = time.perf_counter()
  compiled = step.lower(state, batch).compile()
  compile_s = time.perf_counter() - start
  return Compiled(name=name, cfg=cfg, step=compiled, state=state, batch=batch,
                  compile_s=compile_s, peak_bytes=peak_bytes(compiled.memory_analysis()),
                  flops_per_step=flops.train_flops_per_token(cfg, t) * b * t)


def attention_impl(cfg) -> str:
  """Which attention the compiled step runs: ``cudnn`` (flash attention, head dim padded to a
  multiple of 8 where it is not one) or ``xla-blocked`` (``model/layers.py``)."""
  from depthbench_jax.model.layers import cudnn_head_dim, dtype_of, uses_cudnn_attention
  from depthbench_jax.residual import registry
  if (cfg.attention_kernel != "fused" or not registry.get(cfg.design).backbone_attention
      or not uses_cudnn_attention(dtype_of(cfg.dtype), cfg.head_dim)):
    return "xla-blocked"
  padded = cudnn_head_dim(cfg.head_dim)
  return "cudnn" + (f" (hd {cfg.head_dim} padded to {padded})" if padded != cfg.head_dim else "")


def device_memory() -> dict[str, int] | None:
  """The allocator's own counters on an accelerator (``peak_bytes_in_use``: the high-water mark
  of everything the process has run so far, ``bytes_limit``); None on CPU."""
  stats = jax.devices()[0].memory_stats()
  if not stats:
    return None
  return {k: int(stats[k]) for k in ("peak_bytes_in_use", "bytes_in_use", "bytes_limit")
          if k in stats}


def step_runner(c: Compiled) -> Callable[[], None]:
  def run():
    c.state, metrics = c.step(c.state, c.batch)
    jax.block_until_ready(metrics["loss"])
  return run


@contextlib.contextmanager
def compiles_without_disk_cache(log: Callable[[str], None]):
  """JAX's persistent compilation cache off inside, as it was after. The benches time compiles,
  and with ``JAX_COMPILATION_CACHE_DIR`` set a repeated compile is a disk read (a train step
  here: 2.3-2.6 s cold, 0.17 s cached), so the 70 / 16-layer compile ratio compared two reads.
  Unsetting the directory alone does not stop a cache already in use: ``reset_cache`` too."""
  from jax.experimental.compilation_cache import compilation_cache
  cache_dir = jax.config.jax_compilation_cache_dir
  if not cache_dir:
    yield
    return
  log(f"persistent compilation cache {cache_dir} not used: compile times are measured")
  jax.config.update("jax_compilation_cache_dir", None)
  compilation_cache.reset_cache()
  try:
    yield
  finally:
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    compilation_cache.reset_cache()


def abstract_compile_seconds(config) -> float:
  """Compile time of the train step on abstract state (nothing allocated)."""
  from depthbench_jax.model.config import model_config_from
  from depthbench_jax.model.transformer import Transformer
  from depthbench_jax.train.optimizer import lr_schedule, make_optimizer
  from depthbench_jax.train.step import init_state, train_step
  cfg = model_config_from(config.model)
  model = Transformer(cfg)
  optimizer = make_optimizer(config, config.steps)
  b, t = config.data.global_batch_size, config.data.seq_len
  state = jax.eval_shape(functools.partial(init_state, model, optimizer, seq_len=t),
                         jax.random.PRNGKey(0))
  batch = {"tokens": jax.ShapeDtypeStruct((b, t + 1), jnp.int32)}
  fn = jax.jit(functools.partial(train_step, model=model, optimizer=optimizer,
                                 schedule=lr_schedule(config, config.steps)))
  start = time.perf_counter()
  fn.lower(state, batch).compile()
  return time.perf_counter() - start


# ---------------------------------------------------------------------------------------------
# Hugging Face LLaMA (torch) at the same shape.
# ---------------------------------------------------------------------------------------------

def hf_runner(cfg, config) -> Callable[[], None]:
  """One torch train step of ``LlamaForCausalLM`` matching ``cfg`` (``hf_missing`` said None)."""
  import torch
  torch.manual_seed(0)
  torch.set_num_threads(len(os.sched_getaffinity(0)))  # the cores this process may use, as XLA
  model = hf_llama(cfg)
  model.train()
  opt = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(config.b1, config.b2),
                          weight_decay=config.weight_decay)
  b, t = config.data.global_batch_size, config.data.seq_len
  tokens = torch.randint(0, cfg.vocab_size, (b, t + 1))
  inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

  def run():
    opt.zero_grad(set_to_none=True)
    logits = model(input_ids=inputs).logits
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, cfg.vocab_size),
                                             targets.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    opt.step()
  return run


def hf_llama(cfg):
  """``LlamaForCausalLM`` (fp32, torch) of ``cfg``'s shape, set up for training."""
  import transformers  # pylint: disable=g-import-not-at-top
  hf_cfg = transformers.LlamaConfig(
      vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.ffn_dim,
      num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
      num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, rms_norm_eps=cfg.norm_eps,
      rope_theta=cfg.rope_theta, max_position_embeddings=cfg.max_seq_len,
      tie_word_embeddings=cfg.tie_embeddings, attention_bias=False, mlp_bias=False,
      use_cache=False)  # A training step: no KV cache (the default builds one, copying K, V).
  return transformers.LlamaForCausalLM(hf_cfg)


def torch_matmul_runner(n: int, reps: int) -> Callable[[], None] | None:
  """``matmul_runner``'s chain in torch (fp32): the GEMM ceiling the HF step runs against, so
  the report can tell framework overhead from a slower BLAS (None without torch)."""
  try:
    import torch
  except ImportError:
    return None
  a, b = torch.randn(n, n), torch.randn(n, n) / n ** 0.5

  def run():
    x = a
    for _ in range(reps):
      x = x @ b
  return run


# ---------------------------------------------------------------------------------------------
# The bench.
# ---------------------------------------------------------------------------------------------

def run_bench(p: Preset, log=print, save_partial: Callable[[dict], None] | None = None,
              hf_left_out: str | None = None) -> dict:
  """The bench; ``save_partial(result)`` is called once the train section is in, so a run cut
  off later (a device lease running out in the compile section) keeps its step times.
  ``hf_left_out``: why the HF baseline could not run (``hf_missing``), recorded for the
  verdict."""
  from depthbench_jax.residual import registry
  dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[p.dtype]
  designs = p.designs or registry.names()
  if "preln" not in designs:
    designs = ("preln",) + tuple(designs)
  shapes = p.shapes or (f"{p.n_layers}x{p.d_model}",)
  result: dict[str, Any] = {**run_record(p), "torch": torch_version(), "targets": TARGETS,
                            "remat": REMAT}
  if hf_left_out:
    result["hf_left_out"] = hf_left_out
  log(f"device {result['device']} ({result['device_kind']}), {os.cpu_count()} CPUs "
      f"({result['host_cpu']}), host malloc {result['host_malloc']}")
  matmul = matmul_runner(p.matmul_n, dtype, p.matmul_reps)
  stream = stream_runner(p.stream_mib, dtype, p.stream_reps)
  peaks, bandwidths = [], []

  train_rows = []
  # Pre-LN at the first shape, timed again beside every later shape: each design's step over it
  # (``step_over_first_preln``) is the cost of depth at iso-parameters, paired per round.
  anchor = None
  for shape in shapes:
    n_layers, d_model = shape_spec(shape, p.n_heads)
    compiled = {}
    for design in designs:
      try:
        c = compile_train_step(design, bench_config(p, design, n_layers, d_model))
        step_runner(c)()   # the first step allocates: an out-of-memory shows here
      except Exception as e:  # pylint: disable=broad-except
        if design == "preln":
          raise
        # One candidate that does not compile or fit (an untried kernel, memory) must not
        # cost the others' measurements: it is named in the result and the log instead.
        message = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        result.setdefault("failed", {})[f"{design} {shape}"] = message
        log(f"  FAILED {design} {shape}: {message}")
        continue
      compiled[design] = c
      log(f"  compiled {design} {shape}: {c.compile_s:.1f}s, peak {c.peak_bytes / 2**20:.0f} MiB, "
          f"attention {attention_impl(c.cfg)}")
    runners = {k: step_runner(c) for k, c in compiled.items()}
    hf_time = None
    if p.hf and shape == shapes[0] and jax.default_backend() == "cpu":   # main drops it else
      runners["hf_llama_torch"] = hf_runner(compiled["preln"].cfg,
                                            bench_config(p, "preln", n_layers, d_model))
      runners["matmul_torch"] = torch_matmul_runner(p.matmul_n, p.matmul_reps)
    runners["matmul"] = matmul
    runners["stream"] = stream
    if anchor is not None:
      runners[ANCHOR] = step_runner(anchor)
    times = interleaved(runners, p.rounds, log=log)
    first = times.pop(ANCHOR, times["preln"])
    result.setdefault("first_preln_s_all", {})[shape] = first
    med = {k: statistics.median(v) for k, v in times.items()}
    hf_time = med.pop("hf_llama_torch", None)
    torch_peak = 2.0 * p.matmul_n ** 3 * p.matmul_reps / med.pop("matmul_torch", float("inf"))
    peak = 2.0 * p.matmul_n ** 3 * p.matmul_reps / med.pop("matmul")
    bandwidth = stream_bytes(p) / med.pop("stream")
    peaks.append(peak)
    bandwidths.append(bandwidth)
    log(f"  matmul peak ({p.matmul_n}^3 x {p.matmul_reps} {p.dtype}): "
        f"{peak / 1e9:.1f} GFLOP/s; stream bandwidth ({p.stream_mib} MiB x {p.stream_reps}): "
        f"{bandwidth / 1e9:.1f} GB/s")
    base = compiled["preln"]
    for design, c in compiled.items():
      t = med[design]
      row = {"design": design, "shape": shape, "step_s": t, "step_s_all": times[design],
             "tokens_per_s": p.batch * p.seq_len / t, "model_flops_per_step": c.flops_per_step,
             "model_flops_per_s": c.flops_per_step / t, "mfu": c.flops_per_step / t / peak,
             "matmul_peak_flops": peak,  # this shape's rounds' ceiling, the MFU's denominator
             "step_over_preln": t / med["preln"],
             "step_over_preln_rounds": paired_ratio_band(times[design], times["preln"]),
             "step_over_first_preln": t / statistics.median(first),
             "step_over_first_preln_rounds": paired_ratio_band(times[design], first),
             "peak_bytes": c.peak_bytes,
             "peak_over_preln": c.peak_bytes / base.peak_bytes, "compile_s": c.compile_s,
             "remat_policy": c.cfg.remat_policy, "attention": attention_impl(c.cfg)}
      if design == "preln" and hf_time is not None:
        row["hf_step_s"] = hf_time
        row["hf_step_s_all"] = times["hf_llama_torch"]
        row["ours_over_hf"] = t / hf_time
        row["ours_over_hf_rounds"] = paired_ratio_band(times[design], times["hf_llama_torch"])
        # ours/HF with the BLAS difference taken out (XLA:CPU's fp32 GEMM vs torch's), two ways.
        row["hf_matmul_peak_flops"] = torch_peak
        row["hf_mfu"] = c.flops_per_step / hf_time / torch_peak
        (row["ours_over_hf_at_equal_gemm"],
         row["ours_over_hf_gemms_moved"]) = ours_over_hf_at_equal_gemm(
             t, hf_time, c.flops_per_step, peak, torch_peak)
      train_rows.append(row)
    if anchor is None:
      anchor = base
    del compiled, runners
    # The allocator's high-water mark after this shape (cumulative: it is never reset).
    result.setdefault("device_memory", {})[shape] = device_memory()
  result["train"] = train_rows
  result["matmul_peak_flops"] = max(peaks)  # per shape in each row's matmul_peak_flops
  result["stream_bandwidth"] = max(bandwidths)  # bytes/s
  result["machine_balance"] = result["matmul_peak_flops"] / result["stream_bandwidth"]
  if save_partial is not None:
    save_partial(result)

  shallow, deep = p.compile_layers
  width = shape_spec(shapes[0], p.n_heads)[1]
  cfgs = {L: bench_config(p, "preln", L, width) for L in (shallow, deep)}
  # One XLA:CPU compile of the same step varies 2.6-3.9 s on the 2-core host (a 16L median of
  # three read 0.89 and 1.41 of the 70L's in two runs of one code): each round times both,
  # first one then the other in turn, and the per-round ratios give the verdict's band.
  ct = compile_times(cfgs, shallow, deep, p.compile_rounds)
  result["compile"] = {"shallow_layers": shallow, "deep_layers": deep,
                       "shallow_s": statistics.median(ct[shallow]),
                       "deep_s": statistics.median(ct[deep]),
                       "shallow_s_all": ct[shallow], "deep_s_all": ct[deep],
                       "deep_over_shallow_rounds": paired_ratio_band(ct[deep], ct[shallow])}
  result["compile"]["deep_over_shallow"] = (result["compile"]["deep_s"] /
                                            result["compile"]["shallow_s"])
  result["verdict"] = verdict(result)
  return result


def compile_times(cfgs: dict, shallow: int, deep: int, rounds: int) -> dict[int, list[float]]:
  """``{layers: [seconds per round]}``: each round compiles both depths, the shallow first in
  even rounds and the deep first in odd ones (all of one before the other read 1.408 for a
  ratio whose paired rounds give 0.93)."""
  ct: dict[int, list[float]] = {shallow: [], deep: []}
  for r in range(rounds):
    for L in ((shallow, deep) if r % 2 == 0 else (deep, shallow)):
      ct[L].append(abstract_compile_seconds(cfgs[L]))
  return ct


def read_result(path: str, keys: Sequence[str], written_as: str, flag: str = "--replot") -> dict:
  """A saved result JSON for ``--replot`` (or another ``flag`` that reads one); ValueError naming
  the flag and path when it cannot be read as JSON or lacks any of ``keys`` (so it was not
  written by that command, as ``written_as``)."""
  try:
    with open(path) as f:
      result = json.load(f)
  except (OSError, ValueError) as e:
    raise ValueError(f"{flag}={path!r}: cannot read it as JSON: {e}") from e
  if not isinstance(result, dict) or not set(keys) <= result.keys():
    raise ValueError(f"{flag}={path!r}: not a result of that command (a {written_as} "
                     f"written by it, with {', '.join(repr(k) for k in keys)})")
  return result


def ours_over_hf_at_equal_gemm(ours_s: float, hf_s: float, flops: float, xla_peak: float,
                               torch_peak: float) -> tuple[float, float | None]:
  """ours/HF as if both ran their GEMMs at one speed, two bounds of it.

  Scaled: ``(F / hf_s / torch_peak) / (F / ours_s / xla_peak)``, HF's MFU over ours, each
  against its own ceiling, i.e. every part of our step sped up or slowed down by the ratio of
  the ceilings. Moved: ``(ours_s - F / xla_peak + F / torch_peak) / hf_s``, only the model
  FLOPs' time at the ceiling moved from XLA's ceiling to torch's, the rest of our step held.
  The non-GEMM work does not change with the BLAS and our GEMMs do not all run at the ceiling,
  so the truth lies between the two: where the ceilings are close they agree, and where they
  are not (2.1x on a Zen 5 with AVX-512) the band is what the host can tell. Moved is None
  where a step beats its "ceiling" (MFU > 1: the quick preset's 128^3 matmul is no ceiling),
  as its ideal GEMM time would then exceed the step."""
  scaled = (flops / hf_s / torch_peak) / (flops / ours_s / xla_peak)
  if flops / xla_peak > ours_s or flops / torch_peak > hf_s:
    return scaled, None
  moved = (ours_s - flops / xla_peak + flops / torch_peak) / hf_s
  return scaled, moved


def write_plot(result: dict, json_path: str) -> str:
  """``results-<device>.png`` beside ``json_path``; a note instead where matplotlib is missing
  (a bare accelerator image), so the timed result is never lost to the picture."""
  try:
    from depthbench_jax import bench_plot
  except ImportError as e:
    return f"no plot ({e}; replot later with --replot={json_path})"
  # The run's own thresholds (a replotted result keeps the targets it was judged by).
  targets = {design: result["targets"][key] for design, (_, key) in STEP_TARGETS.items()
             if key in result.get("targets", {})}
  p = result["preset"]
  # The host's CPU names a CPU run; an accelerator run is named by its device, not its host.
  machine = (result.get("host_cpu", result["device_kind"]) if result.get("backend", "cpu") == "cpu"
             else result["device_kind"])
  title = (f"{result['device']} ({machine}), "
           f"{p['dtype']}, batch {p['batch']} x {p['seq_len']}, {p['rounds']} rounds, "
           f"code {revision.result_label(result)}")
  return bench_plot.plot_bench(result["train"], os.path.splitext(json_path)[0] + ".png",
                               targets, title)


def main(argv: Sequence[str] | None = None) -> int:
  ap = OneLineParser(prog="python -m depthbench_jax.bench", description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--preset", default=None, choices=sorted(PRESETS),
                  help="default: gpu400m on an accelerator, cpu otherwise")
  ap.add_argument("--out", default=None,
                  help="directory for results-<device>.json (default benchmarks); with "
                       "--replot, for the PNG (default: beside the JSON)")
  ap.add_argument("--designs", default="",
                  help="comma list, each design[:field=value...] (overrides the preset; writes "
                       "results-<device>-designs.json)")
  ap.add_argument("--rounds", type=int, default=None)
  ap.add_argument("--no_hf", action="store_true")
  ap.add_argument("--shapes", default="", help="comma list of LxD (overrides the preset's)")
  ap.add_argument("--remat", default="", choices=("",) + REMAT_CHOICES,
                  help="one remat policy for every design (default: REMAT, per design); the "
                       "result file is then results-<device>-remat-<policy>[-designs][-shapes].json")
  ap.add_argument("--attention_kernel", default=None, choices=("xla", "fused"),
                  help="overrides the preset's ('fused' = cuDNN flash attention on GPU, bf16)")
  ap.add_argument("--replot", default="", metavar="JSON",
                  help="re-render a results JSON (table, verdict, PNG); no timing")
  ap.add_argument("--overwrite", action="store_true",
                  help="replace a result file of other designs or shapes (else refused)")
  args = ap.parse_args(argv)
  if args.replot:
    try:
      result = read_result(args.replot, ("train", "preset", "verdict"), "results-<device>.json")
      picture = replot_json_path(args.replot, args.out)
    except ValueError as e:
      ap.error(str(e))
    print(render(result))
    print(f"wrote {write_plot(result, picture)}", file=sys.stderr)
    return 0
  args.out = args.out or "benchmarks"
  try:
    # The result is written there after the run: a file would lose every measurement.
    summary.check_folder(args.out, f"--out={args.out}")
  except ValueError as e:
    ap.error(str(e))
  name = args.preset or ("cpu" if jax.default_backend() == "cpu" else "gpu400m")
  p = PRESETS[name]
  if args.designs:
    # Once each: '--designs=hc,hc' compiled HC twice, timed one row and recorded both.
    p = dataclasses.replace(p, designs=tuple(dict.fromkeys(
        s.strip() for s in args.designs.split(","))))
    for spec in p.designs:
      try:
        design_spec(spec)
      except ValueError as e:
        ap.error(str(e))
  if args.rounds is not None:
    if args.rounds < 1:  # 0 once fell through to the preset's rounds.
      ap.error(f"--rounds={args.rounds}; allowed: an integer >= 1")
    p = dataclasses.replace(p, rounds=args.rounds)
  if args.no_hf:
    p = dataclasses.replace(p, hf=False)
  hf_left_out = None
  if p.hf and jax.default_backend() != "cpu":   # as --no_hf: recorded so (the replace guard)
    print(f"HF LlamaForCausalLM left out: torch runs it on the CPU, ours runs on "
          f"{jax.default_backend()}", file=sys.stderr, flush=True)
    p = dataclasses.replace(p, hf=False)
  if p.hf and (hf_left_out := hf_missing()):
    # As --no_hf, said: the check left the verdict without a word, and the replace guard
    # (no_hf) let the run replace a result that holds ours/HF.
    print(f"HF LlamaForCausalLM left out: {hf_left_out}", file=sys.stderr, flush=True)
    p = dataclasses.replace(p, hf=False)
  if args.attention_kernel:
    p = dataclasses.replace(p, attention_kernel=args.attention_kernel)
  if args.shapes:
    try:
      p = dataclasses.replace(p, shapes=canonical_shapes(args.shapes.split(","), p.n_heads))
    except ValueError as e:
      ap.error(str(e))
  if args.remat:
    p = dataclasses.replace(p, remat=args.remat)
  from depthbench_jax.residual import registry
  for spec in p.designs or registry.names():   # () is every design (the cpu preset).
    for shape in p.shapes or (f"{p.n_layers}x{p.d_model}",):
      try:
        check_model(p, spec, shape)
      except ValueError as e:
        ap.error(str(e))
  os.makedirs(args.out, exist_ok=True)
  path = result_path(args.out, device_name(), name, args.remat, bool(args.designs),
                     bool(args.shapes))
  try:
    summary.check_replaceable(  # Before timing: a finished result is never lost (--no_hf
        path, replace_settings(p), args.overwrite,   # dropped ours/HF).
        flag=lambda k: f"--{k}" if hasattr(args, k) else f"--preset={name}'s {k}",
        recorded=lambda r: replace_settings(r["preset"], p),
        rounds=(p.rounds, lambda r: r["preset"]["rounds"]))
  except ValueError as e:
    ap.error(str(e))

  def save(result, path=path):
    result["preset_name"] = name
    summary.atomic_write_json(path, result, indent=1, sort_keys=False)

  log = lambda s: print(s, file=sys.stderr, flush=True)
  partial = os.path.splitext(path)[0] + "-partial.json"
  with compiles_without_disk_cache(log):
    result = run_bench(p, log=log, save_partial=lambda r: save(r, partial),
                       hf_left_out=hf_left_out)
  save(result)
  if os.path.exists(partial):
    os.remove(partial)
  print(render(result))
  print(f"wrote {path}, {write_plot(result, path)}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  hostmem.reexec_with_malloc_tunables("depthbench_jax.bench")
  sys.exit(main())
