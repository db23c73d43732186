"""XLA's own view of a prefill: ``cost_analysis()`` FLOPs and ``memory_analysis()`` bytes.

Everything is an abstract compile, ``jax.jit(forward).lower(ShapeDtypeStruct...).compile()``:
params and tokens are shapes only, nothing is allocated, so a 400M model at T=4096 compiles on a
laptop CPU in seconds (the scanned layer stack is compiled once whatever the depth).

``cost_analysis`` counts a ``while`` loop's body once, not once per trip, so the scanned model's
count misses ``L - 1`` layers. ``xla_prefill_flops`` adds them back from a second compile of one
``Block`` on the same state (``total(scan) + (L - 1) * block``); the tests check this against an
unrolled compile. XLA counts a multiply-add as 2 FLOPs and also counts elementwise work (a few
percent of a backbone) and counts the attention as computed (the blocked causal share: off-GPU
both kernel settings run the blocked attention), so compare it with the analytic
``causal=False`` ("computed") column.

Not for the designs that read a depth buffer (Full/Block AttnRes, MoDA): their terms are
elementwise-heavy and looped. Per layer beyond Pre-LN's, against ``design_costs``' computed
term (d=128, T=256, 6..18 layers, 2L+1 = 13..37 slots): bf16 counts 1.8-2.5x it (each slot's
bf16 -> fp32 convert is a FLOP per element, as many as the term's own), fp32 1.0x at 13 slots
falling to 0.3x at 33 (the depth read's slot loops, ``base.slot_pieces``, count once). The
systems table's 70x640 Full AttnRes total is 8% over the analytic one for that reason; the
tests check these terms only where the loops are unrolled (3 layers, fp32).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from depthbench_jax.model.layers import dtype_of, rope_table
from depthbench_jax.model.transformer import Block, Transformer, abstract_params
from depthbench_jax.residual import registry


def _cost(compiled) -> dict:
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):  # Older jax: one dict per device program.
    cost = cost[0] if cost else {}
  return dict(cost or {})


def inference_config(cfg, dtype: str = "bfloat16"):
  """``cfg`` with params and compute in ``dtype`` and no remat (a prefill has no backward)."""
  return dataclasses.replace(cfg, dtype=dtype, param_dtype=dtype, remat_policy="none")


def abstract_inference_params(cfg) -> Any:
  """Unboxed ShapeDtypeStruct params of ``cfg`` (its own ``param_dtype``), nothing allocated."""
  return nn.unbox(abstract_params(cfg))


def peak_bytes(memory) -> int:
  """Live bytes at the peak of the program: arguments + outputs + temporaries - aliased."""
  return int(memory.argument_size_in_bytes + memory.output_size_in_bytes +
             memory.temp_size_in_bytes - memory.alias_size_in_bytes)


def _block_flops(cfg, params, batch: int, seq_len: int) -> float:
  """XLA FLOPs of one scanned layer on the design's state (``Block.apply`` on abstract inputs)."""
  design = registry.get(cfg.design)
  dtype = dtype_of(cfg.dtype)
  x0 = jax.ShapeDtypeStruct((batch, seq_len, cfg.d_model), dtype)
  state = jax.eval_shape(
      lambda p, x: design.io(cfg).apply({"params": p}, x, method=lambda m, v: m.init_state(v)),
      params.get("residual_io", {}), x0)
  layer_params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype),
                              params["layers"])
  xs = {"layer": jax.ShapeDtypeStruct((), jnp.int32)}   # no gate: the training layer
  positions = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32)
  rope = jax.eval_shape(  # the (cos, sin) table every layer reads, shaped as the model makes it
      lambda pos: rope_table(pos, cfg.head_dim, cfg.rope_theta), positions)
  fn = lambda p, s, x, rope: Block(cfg).apply({"params": p}, s, x, rope)[0]
  compiled = jax.jit(fn).lower(layer_params, state, xs, rope).compile()
  return float(_cost(compiled).get("flops", 0.0))


def prefill_analysis(cfg, seq_len: int, batch: int = 1, dtype: str = "bfloat16") -> dict:
  """Abstract compile of the prefill forward (``tokens [B,T] -> logits [B,T,V]``).

  Returns ``xla_flops`` (per sequence, every layer counted), ``xla_flops_scanned`` (what
  ``cost_analysis`` reports for the scanned program), ``peak_bytes``, ``temp_bytes``,
  ``argument_bytes``, ``output_bytes`` and ``compile_s``.
  """
  cfg = inference_config(cfg, dtype)
  params = abstract_inference_params(cfg)
  tokens = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32)
  model = Transformer(cfg)
  start = time.perf_counter()
  compiled = jax.jit(lambda p, t: model.apply({"params": p}, t)).lower(params, tokens).compile()
  compile_s = time.perf_counter() - start
  scanned = float(_cost(compiled).get("flops", 0.0))
  if cfg.scan_layers and cfg.n_layers > 1:
    total = scanned + (cfg.n_layers - 1) * _block_flops(cfg, params, batch, seq_len)
  else:
    total = scanned
  memory = compiled.memory_analysis()
  return {"xla_flops": total / batch, "xla_flops_scanned": scanned / batch,
          "peak_bytes": peak_bytes(memory), "temp_bytes": int(memory.temp_size_in_bytes),
          "argument_bytes": int(memory.argument_size_in_bytes),
          "output_bytes": int(memory.output_size_in_bytes), "compile_s": compile_s,
          "batch": batch, "dtype": dtype, "backend": jax.default_backend()}
