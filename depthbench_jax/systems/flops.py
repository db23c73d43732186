"""Model FLOPs, with the convention stated once.

Convention (PaLM appendix B / Chinchilla): a multiply-add is 2 FLOPs; the backward pass costs
twice the forward; embedding lookups are free; the LM head matmul counts. Per token of a
length-T causal sequence, the forward pass costs

    2 * N_matmul  +  2 * L * T * (H * hd)        (QK^T and AV, causal: half of 2 * 2 * T * H*hd)

where N_matmul is every parameter that takes part in a matmul (all but the embedding table and
the norm gains). Training is 3x the forward. Residual designs add their own small terms through
``Design.extra_flops_per_token`` when they define it (HC's stream mixing, AttnRes's depth
softmax, MoDA's depth keys); the XLA count (``systems/``) is reported beside this analytic one.
"""

from __future__ import annotations

from typing import Any


def matmul_params(model_cfg: Any) -> int:
  """Parameters that take part in a matmul: everything but the input table and norm gains."""
  from depthbench_jax.model.transformer import count_params
  counts = count_params(model_cfg)
  d, v, L = model_cfg.d_model, model_cfg.vocab_size, model_cfg.n_layers
  attn = d * model_cfg.head_dim * (2 * model_cfg.n_heads + 2 * model_cfg.n_kv_heads)
  mlp = 3 * d * model_cfg.ffn_dim
  head = d * v  # The LM head multiplies whether or not it is tied to the input table.
  return L * (attn + mlp) + head + _design_matmul_params(model_cfg, counts)


def _design_matmul_params(model_cfg: Any, counts: dict) -> int:
  """Design-specific matmul params beyond the backbone (e.g. HC's dynamic projections)."""
  from depthbench_jax.residual import registry
  design = registry.get(model_cfg.design)
  fn = getattr(design, "extra_matmul_params", None)
  return int(fn(model_cfg)) if fn else 0


def attention_flops_per_token(model_cfg: Any, seq_len: int) -> float:
  """``2 * L * T * H * hd``: causal QK^T plus AV, averaged over the T positions."""
  return 2.0 * model_cfg.n_layers * seq_len * model_cfg.n_heads * model_cfg.head_dim


def forward_flops_per_token(model_cfg: Any, seq_len: int) -> float:
  return 2.0 * matmul_params(model_cfg) + attention_flops_per_token(model_cfg, seq_len)


def train_flops_per_token(model_cfg: Any, seq_len: int) -> float:
  """Forward + backward (3x forward) FLOPs per trained token."""
  return 3.0 * forward_flops_per_token(model_cfg, seq_len)
