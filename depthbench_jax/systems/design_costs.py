"""Design-specific forward FLOPs per token, beyond the shared backbone (``systems/flops.py``).

Computed from the model config alone (the residual modules stay free of cost bookkeeping). Same
convention as ``flops.py``: a multiply-add is 2 FLOPs and only contractions count (dots and
einsums; norms, softmaxes, Sinkhorn rounds and elementwise gates are left out). Every term is per
token of the forward pass, summed over the ``2 L`` sublayers (``k = 2*layer + sub``). ``n`` =
HC/mHC streams, ``S`` = AttnRes source slots, ``H``/``K``/``hd`` = query heads, KV heads, head
width.

Two counts are given for the designs whose cross-layer reads are masked:
``causal=True`` (the default, the convention of ``flops.py``'s sequence attention) counts only
what the math needs: sublayer ``k`` of Full AttnRes reads ``k + 1`` sources, MoDA's layer ``l``
reads ``2 l`` depth slots. ``causal=False`` counts what the scanned layer stack computes: every
slot of the preallocated buffer, masked or not (what XLA's ``cost_analysis`` sees of the systems
table's scanned compile). The unrolled layer loop knows each layer's index and reads only the
written slots, rounded up to 8 (``residual.base.static_prefix``), so for Full AttnRes and MoDA,
whose buffers hold ``2 L + 1`` and ``2 L`` slots, its compile counts close to the causal term
(``tests/systems/test_systems.py``). Block AttnRes's buffer holds ``n_blocks + 1`` (9 by
default): rounded to 8 (with a floor of 8), every read covers 8 or all 9 slots, the first
block's included, near the whole buffer's count.

* ``matmul_params`` (MoDA only: its FFN depth-KV projections ``2 d K hd`` per layer): parameters
  that multiply every token once, like the backbone's; 2 FLOPs each.
* HC (dynamic): per sublayer the width/depth weights from each stream's d-vector
  ``2 n d (n + 2)`` (``W_alpha`` [d, n+1], ``W_beta`` [d]), the read ``A_m^T H`` ``2 n d``, the
  stream mix ``A_r^T H`` ``2 n^2 d`` and the write ``B^T y`` ``2 n d``. Static HC drops the first.
* mHC: ``phi`` on the flattened streams ``2 n d (n^2 + 2 n)``, plus the same read/mix/write.
* Full AttnRes: a depth softmax over ``S`` sources costs ``4 S d`` (logits ``w . N0(v_i)`` and the
  weighted sum); per sublayer ``S = k + 1`` (causal) or ``2 L + 1`` (buffer), plus the readout
  over all ``2 L + 1``.
* Block AttnRes: ``S`` = completed blocks + the partial sum when there is one (causal) or the
  whole ``n_blocks + 1`` buffer; plus the readout.
* MoDA: depth attention ``4 H hd`` per depth slot (``q . Kd`` and ``p Vd``) for ``2 l`` slots at
  layer ``l`` (causal; ``l`` with ``ffn_kv=False``, which writes no FFN slot) or all ``2 L`` (the
  buffer is ``2 L`` slots either way); plus the FFN KV projections above.
"""

from __future__ import annotations

from typing import Any, Callable

from depthbench_jax.residual.attnres import block_schedule_of


def _streams(cfg) -> int:
  return int(cfg.residual_option("n_streams", 4))


def _hc(cfg, causal: bool) -> float:
  n, d = _streams(cfg), cfg.d_model
  per_sublayer = 2 * n * d + 2 * n * n * d + 2 * n * d
  if cfg.residual_option("dynamic", True):
    per_sublayer += 2 * n * d * (n + 2)
  return 2 * cfg.n_layers * per_sublayer


def _mhc(cfg, causal: bool) -> float:
  n, d = _streams(cfg), cfg.d_model
  per_sublayer = 2 * n * d * (n * n + 2 * n) + 2 * n * d + 2 * n * n * d + 2 * n * d
  return 2 * cfg.n_layers * per_sublayer


def _attnres_full(cfg, causal: bool) -> float:
  d, sublayers = cfg.d_model, 2 * cfg.n_layers
  slots = sublayers + 1
  reads = sum(k + 1 for k in range(sublayers)) if causal else sublayers * slots
  return 4 * d * (reads + slots)  # sublayers + readout


def _attnres_block(cfg, causal: bool) -> float:
  d = cfg.d_model
  per_block, n_blocks = block_schedule_of(cfg)
  slots = n_blocks + 1
  if causal:
    # Sublayer i (0-based) of block n reads b_0..b_(n-1), plus b_n^(i-1) when i >= 1.
    reads = sum((k // per_block + 1) + (1 if k % per_block else 0)
                for k in range(2 * cfg.n_layers))
  else:
    reads = 2 * cfg.n_layers * slots
  return 4 * d * (reads + slots)


def _moda(cfg, causal: bool) -> float:
  L = cfg.n_layers
  written_per_layer = 2 if cfg.residual_option("ffn_kv", True) else 1  # attention slot only
  slots = sum(written_per_layer * l for l in range(L)) if causal else L * 2 * L
  return 4 * cfg.n_heads * cfg.head_dim * slots


def _moda_params(cfg) -> int:
  if not cfg.residual_option("ffn_kv", True):
    return 0
  return cfg.n_layers * 2 * cfg.d_model * cfg.n_kv_heads * cfg.head_dim


# design name -> forward FLOPs per token beyond the backbone (excluding ``matmul_params``).
EXTRA_FLOPS: dict[str, Callable[[Any, bool], float]] = {
    "hc": _hc,
    "mhc": _mhc,
    "attnres_full": _attnres_full,
    "attnres_block": _attnres_block,
    "moda": _moda,
}
# design name -> extra parameters that take part in a per-token matmul.
EXTRA_MATMUL_PARAMS: dict[str, Callable[[Any], int]] = {"moda": _moda_params}


def extra_matmul_params(cfg) -> int:
  fn = EXTRA_MATMUL_PARAMS.get(cfg.design)
  return int(fn(cfg)) if fn else 0


def extra_flops_per_token(cfg, causal: bool = True) -> float:
  """Design-specific forward FLOPs per token, other than ``2 * extra_matmul_params``."""
  fn = EXTRA_FLOPS.get(cfg.design)
  return float(fn(cfg, causal)) if fn else 0.0
