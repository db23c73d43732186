"""One row of the systems table: what a (design, shape) costs, analytic and from XLA.

Bytes are for the inference dtype (bf16 unless told): ``param_bytes = params_total * 2``,
``kv_cache_bytes = 2 (K and V) * L * K * hd * T * bytes`` per sequence (``2 L d T`` elements
for MHA: 38,912 per token at 16x1216, 89,600 at 70x640), and ``residual_state_bytes`` = the
residual state a prefill carries between layers (``io.init_state`` on ``[1, T, d]``: ``T d`` for
Pre-LN, ``n T d`` for HC/mHC, ``(2L+1) T d`` for Full AttnRes, plus MoDA's depth K/V). MoDA's
depth keys are the same position's only, so its decode KV cache is the ordinary one.

Training: ``train_flops_per_token`` at the recipe's sequence length (``flops.py``), Chinchilla
tokens ``tokens_per_param * N`` (N = ``budget_params``, the trainer's: ``shapes.budget_params``;
the row's own total when not given), device-hours ``tokens * flops / (peak * mfu) / 3600``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from depthbench_jax.model.layers import dtype_of
from depthbench_jax.model.transformer import count_params, embedding_rows
from depthbench_jax.residual import registry
from depthbench_jax.systems import flops

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def kv_cache_bytes(cfg, seq_len: int, batch: int = 1, dtype: str = "bfloat16") -> int:
  """``2 * L * K * hd * T * B * bytes``: the K and V of every layer for B sequences of T."""
  return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * seq_len * batch * DTYPE_BYTES[dtype]


def kv_cache_elements_per_token(cfg) -> int:
  """``2 * L * K * hd`` (``2 L d`` for MHA)."""
  return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim


def residual_state_bytes(cfg, seq_len: int, batch: int = 1, dtype: str = "bfloat16") -> int:
  """Bytes of the design's residual state for B sequences of T (``io.init_state``, abstract, on
  the model's own ``x0``: fp32 under ``model.stream_dtype='float32'``)."""
  design = registry.get(cfg.design)
  icfg = dataclasses.replace(cfg, dtype=dtype)
  x0 = jax.eval_shape(lambda table, tokens: embedding_rows(table, tokens, icfg),
                      jax.ShapeDtypeStruct((1, cfg.d_model), dtype_of(dtype)),
                      jax.ShapeDtypeStruct((batch, seq_len), jnp.int32))
  # init_state needs no params of its own; StateIO.setup's norm gain is created lazily.
  state = jax.eval_shape(
      lambda x: design.io(icfg).init_with_output(jax.random.PRNGKey(0), x,
                                                 method=lambda m, v: m.init_state(v))[0], x0)
  return int(sum(leaf.size * jnp.dtype(leaf.dtype).itemsize for leaf in jax.tree.leaves(state)))


def device_hours(train_flops: float, peak_flops: float, mfu: float) -> float:
  return train_flops / (peak_flops * mfu) / 3600.0


def fixed_train_tokens(config) -> float | None:
  """``steps x global batch x T`` for a config (a ConfigDict, or a summary's dict of one) that
  fixes its steps (the smoke sweep), else None: steps=-1 trains the Chinchilla budget."""
  data = config.get("data") or {}
  steps = config.get("steps")
  if (isinstance(steps, int) and not isinstance(steps, bool) and steps > 0
      and data.get("global_batch_size") and data.get("seq_len")):
    return float(steps * data["global_batch_size"] * data["seq_len"])
  return None


def cost_row(cfg, *, seq_len: int, train_seq_len: int, tokens_per_param: float,
             peak_flops: float, mfu: float, dtype: str = "bfloat16",
             xla: dict | None = None, budget_params: int | None = None,
             train_tokens: float | None = None) -> dict[str, Any]:
  """Every analytic number of one (design, shape) at prefill length ``seq_len``; ``xla`` (from
  ``systems.xla.prefill_analysis``) is merged in when given."""
  counts = count_params(cfg)
  train_fpt = flops.train_flops_per_token(cfg, train_seq_len)
  # A suite that fixes its steps trains steps x batch x T tokens (``train_tokens``,
  # ``fixed_train_tokens``), not the Chinchilla budget.
  tokens = train_tokens or tokens_per_param * (budget_params or counts["total"])
  row = {
      "design": cfg.design, "shape": f"{cfg.n_layers}x{cfg.d_model}", "n_layers": cfg.n_layers,
      "d_model": cfg.d_model, "aspect_ratio": cfg.d_model / cfg.n_layers,
      "params_total": counts["total"], "params_non_embedding": counts["non_embedding"],
      "param_bytes": counts["total"] * DTYPE_BYTES[dtype],
      "remat_policy": cfg.remat_policy,   # what training recomputes: the bench may time another
      "seq_len": seq_len,
      "prefill_flops_causal": flops.prefill_flops(cfg, seq_len, causal=True),
      "prefill_flops_computed": flops.prefill_flops(cfg, seq_len, causal=False),
      "prefill_flops_paper": flops.paper_prefill_flops(cfg, seq_len),
      "design_flops_per_token": flops.design_flops_per_token(cfg)
      + 2.0 * (flops.matmul_params(cfg) - flops.backbone_matmul_params(cfg)),
      "kv_cache_bytes": kv_cache_bytes(cfg, seq_len, dtype=dtype),
      "kv_elements_per_token": kv_cache_elements_per_token(cfg),
      "residual_state_bytes": residual_state_bytes(cfg, seq_len, dtype=dtype),
      "train_seq_len": train_seq_len,
      "train_flops_per_token": train_fpt,
      "train_tokens": tokens, "train_tokens_from": "steps" if train_tokens else "chinchilla",
      "train_flops": train_fpt * tokens,
      "device_hours": device_hours(train_fpt * tokens, peak_flops, mfu),
      "peak_flops": peak_flops, "mfu": mfu, "dtype": dtype,
  }
  if xla:
    row.update(xla)
  return row
