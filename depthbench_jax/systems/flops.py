"""Model FLOPs, with the convention stated once.

Convention (PaLM appendix B / Chinchilla): a multiply-add is 2 FLOPs; the backward pass costs
twice the forward; embedding lookups are free; the LM head matmul counts; only contractions
count (norms, softmax and elementwise work are left out). Per token of a length-T causal
sequence, the forward pass costs

    2 * N_matmul  +  2 * L * T * (H * hd)  +  design extras

where N_matmul is the backbone's kernels (attention, SwiGLU, LM head) plus a design's
``extra_matmul_params`` (MoDA's depth K/V projections; the connection weights of HC, mHC and
AttnRes are counted in their design terms instead) and the middle term is QK^T and AV counted
*causally*: query t sees t keys (t = 1..T, so (T+1)/2 on average), taken as T/2, half of the
``4 * L * T * H * hd`` that a full (unmasked) T x T attention computes, as the paper's
``2 L T^2 d`` does. ``causal=False`` counts the attention as this implementation computes it,
which is what XLA's ``cost_analysis`` sees: ``causal_fraction(T) = (n + 1) / 2n`` of the full
T x T for the blocked XLA attention (``model/layers.py``, n query blocks), which every kernel
setting runs off-GPU. On a GPU ``attention_kernel='fused'`` is cuDNN flash attention: a custom
call that ``cost_analysis`` cannot see into, skipping masked tiles itself (close to the causal
count).
Over a sequence the causal term is ``2 L T^2 H hd`` (``2 L T^2 d`` for MHA): the ``T^2 L d``
term that makes depth expensive at long context. Training is 3x the forward.

Residual designs add their own terms (HC's stream mixing, AttnRes's depth softmax, MoDA's depth
keys and FFN KV projections): ``Design.extra_matmul_params(cfg)`` / ``Design.extra_flops_per_token
(cfg, causal)`` when a design defines them, else the table in ``systems/design_costs.py``. The XLA
count (``systems/xla.py``) is reported beside this analytic one.

The paper's approximation (``paper_prefill_flops``), ``2 * 12 L d^2 T + 2 L T^2 d``, is the
backbone without the LM head and with SwiGLU at exactly 8/3 d; it gives 2.98 and 4.32 TFLOPs at
T=4096 for 16x1216 and 70x640 (the paper quotes about 3.0 and 4.4).
"""

from __future__ import annotations

from typing import Any


def backbone_matmul_params(model_cfg: Any) -> int:
  """Per-token matmul parameters of the shared backbone: attention, SwiGLU, LM head."""
  d, v, L = model_cfg.d_model, model_cfg.vocab_size, model_cfg.n_layers
  attn = d * model_cfg.head_dim * (2 * model_cfg.n_heads + 2 * model_cfg.n_kv_heads)
  mlp = 3 * d * model_cfg.ffn_dim
  head = d * v  # The LM head multiplies whether or not it is tied to the input table.
  return L * (attn + mlp) + head


def matmul_params(model_cfg: Any) -> int:
  """N_matmul: the backbone's kernels plus a design's ``extra_matmul_params`` (the connection
  weights of HC, mHC and AttnRes are FLOPs of their design terms, not here)."""
  return backbone_matmul_params(model_cfg) + _design_matmul_params(model_cfg)


def _design(model_cfg: Any):
  from depthbench_jax.residual import registry
  return registry.get(model_cfg.design)


def _design_matmul_params(model_cfg: Any) -> int:
  """Design-specific matmul params beyond the backbone (e.g. MoDA's FFN depth-KV projections)."""
  fn = getattr(_design(model_cfg), "extra_matmul_params", None)
  if fn:
    return int(fn(model_cfg))
  from depthbench_jax.systems import design_costs
  return design_costs.extra_matmul_params(model_cfg)


def design_flops_per_token(model_cfg: Any, causal: bool = True) -> float:
  """Design-specific forward FLOPs per token other than its matmul params (see module doc)."""
  fn = getattr(_design(model_cfg), "extra_flops_per_token", None)
  if fn:
    return float(fn(model_cfg, causal))
  from depthbench_jax.systems import design_costs
  return design_costs.extra_flops_per_token(model_cfg, causal=causal)


def attention_flops_per_token(model_cfg: Any, seq_len: int, causal: bool = True) -> float:
  """``2 * L * T * H * hd``: causal QK^T plus AV, averaged over the T positions.

  ``causal=False``: what is computed, ``computed_attention_share`` of the full T x T products
  ``4 * L * T * H * hd``.
  """
  full = 4.0 * model_cfg.n_layers * seq_len * model_cfg.n_heads * model_cfg.head_dim
  return full / 2 if causal else full * computed_attention_share(model_cfg, seq_len)


def computed_attention_share(model_cfg: Any, seq_len: int) -> float:
  """Share of the full T x T attention that XLA computes: the blocked causal attention's
  ``causal_fraction(T)``, for every design and kernel setting (cuDNN, the GPU's ``'fused'``, is
  opaque to XLA's count; see the module docstring)."""
  del model_cfg  # The same for every design: MoDA's sequence part is blocked the same way.
  from depthbench_jax.model.layers import causal_fraction
  return causal_fraction(seq_len)


def forward_flops_per_token(model_cfg: Any, seq_len: int, causal: bool = True) -> float:
  return (2.0 * matmul_params(model_cfg) + attention_flops_per_token(model_cfg, seq_len, causal)
          + design_flops_per_token(model_cfg, causal))


def train_flops_per_token(model_cfg: Any, seq_len: int) -> float:
  """Forward + backward (3x forward) FLOPs per trained token."""
  return 3.0 * forward_flops_per_token(model_cfg, seq_len)


def prefill_flops(model_cfg: Any, seq_len: int, causal: bool = True) -> float:
  """Forward FLOPs of one length-T sequence (all T logits): ``T * forward_flops_per_token``."""
  return seq_len * forward_flops_per_token(model_cfg, seq_len, causal)


def paper_prefill_flops(model_cfg: Any, seq_len: int) -> float:
  """The paper's approximation ``2 * 12 L d^2 T + 2 L T^2 d`` (no LM head, no design terms)."""
  L, d, T = model_cfg.n_layers, model_cfg.d_model, seq_len
  return 24.0 * L * d * d * T + 2.0 * L * T * T * d
