"""The layer diagnostics as pure functions on arrays (no model in sight; see ``probes.py``).

Definitions (DepthBench; the study's spec, ``residuals.md`` "Layer diagnostics", kept outside this
repository; choices where the paper is silent):

* **Late layers**: 0-based layer index ``l`` with ``l >= L/4`` (real division, so ``4 l >= L``):
  the last three quarters. A *late pair* has both indices late (causal: ``L/4 <= s < t``;
  permutation: ``L/4 <= i < j``).
* **Angular distance** ``d(a, b) = arccos(cos(a, b)) / pi`` in [0, 1], per token, then the mean
  over all ``B*T`` tokens. A zero vector has no direction: its cosine is taken as 0 (distance
  0.5), the NaN convention of the Curse-of-Depth code. Computed on ``return_layers['hidden']``,
  each design's residual-equivalent state after each layer (``LayerWiring.hidden``: Pre-LN x,
  HC/mHC the sum of streams, AttnRes the sum of present sources), so ``D`` is [L, L] over layer
  outputs (the embedding is not included) and "consecutive" is ``D[l, l+1]``, l = 0..L-2.
* **Causal score** ``C[s, t]`` for ``s < t``: ``||u_t - u_t^(skip s)|| / ||u_t||`` per token, where
  ``u_t`` is layer t's update and ``skip s`` runs the network with layer s gated off (state
  unchanged by it). Reduced over tokens by the mean (the spec and [DIAG]); ``reduction='max'``
  gives Csordas et al.'s max over sequence and prompts. Entries with ``s >= t`` are NaN. A token
  whose clean update is zero scores 0 (nothing to change). "Update" is the sum of what
  layer t's two sublayers add (under the probe's output gate, 1 for every t > s read here)
  (``LayerWiring.sublayer``): ``F`` in Pre-LN and LNS, ``N_post(F)`` in Sandwich-LN, in these
  three exactly Csordas's ``h_(t+1) - h_t``; in the others, whose state change is no sum of
  increments, the sublayer outputs ``F`` (the spec's ``f_l`` option).
  Skipping (``causal_skip``, ``CAUSAL_SKIPS``): by default the spec's "update set to zero",
  layer s's two sublayer outputs ``F`` := 0 with the design's own write still applied
  (residuals-detail 6.2: "replacing layer s's sublayer outputs by 0"); ``'absent'`` is Csordas
  et al.'s ``h_(s+1) := h_s`` through the design's own ``skip``. The two agree for Pre-LN, LNS
  and Sandwich-LN, and for AttnRes up to the pre-norm's eps (a zero source only rescales the
  sum the next norm reads); they differ where a layer does more than add ``F``: HC/mHC still
  mix the streams (``A_r``, ``H_res``) with ``F = 0``, DeepNorm and KEEL still post-normalise,
  MoDA still writes the layer's depth K/V. diagnostics.json records which.
* **Permutation score** ``P[i, j] = (loss_swapped - loss) / loss`` for ``i < j``: signed, as the
  spec and the seed's "how much swapping raises LM loss". [DIAG] takes ``|.|``; the two differ
  only for a swap that *lowers* the loss, which the signed score never counts above a positive
  threshold. All parameters stacked on the layer axis move with the layer
  (``model.transformer.permute_layers``). Entries with ``i >= j`` are NaN.
* **Shares**: the fraction of late pairs with a score strictly above a threshold; the paper uses
  0.45 (causal) and 0.15 (permutation); ``share_curve`` gives it over a grid of thresholds.
* **Effective rank** (Roy & Vetterli, 2007): ``erank(A) = exp(-sum_k p_k log p_k)``,
  ``p_k = sigma_k / sum_j sigma_j``; 1 <= erank <= rank(A) <= n. Applied per token to the product
  of the sown HC/mHC mixing matrices over a span of layers (``mixing_rank_stats``), then averaged
  over tokens.
* **Block AttnRes dead prefix**: the leading layers whose weight on their own block's partial sum
  is below a threshold (see ``dead_prefix``).
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

PAPER_CAUSAL_THRESHOLD = 0.45
PAPER_PERMUTATION_THRESHOLD = 0.15
# The causal score's skips (module doc): ``config.diagnostics.causal_skip`` -> what
# diagnostics.json records.
CAUSAL_SKIPS = {
    "zero_update": "layer s's sublayer outputs set to zero, its own write still applied (the "
                   "spec's 'update set to zero')",
    "absent": "layer s absent (Csordas et al.: the state as if it were not there); the spec's "
              "'update set to zero' in Pre-LN, LNS and Sandwich-LN only"}


def is_spec_skip(causal: dict) -> bool:
  """A diagnostics.json causal result scored with the spec's skip (``'zero_update'``); older
  ones, which record none, skipped the layer as absent."""
  return causal.get("skip") == CAUSAL_SKIPS["zero_update"]


# ---------------------------------------------------------------------------------------------
# Which layers and pairs count.
# ---------------------------------------------------------------------------------------------

def late_layers(n_layers: int) -> np.ndarray:
  """Bool [L]: ``l >= L/4`` (the last three quarters; ``4 l >= L`` avoids rounding)."""
  return 4 * np.arange(n_layers) >= n_layers


def late_pairs(n_layers: int) -> np.ndarray:
  """Bool [L, L]: ``i < j`` with both ``i`` and ``j`` late. The pair set every share uses."""
  late = late_layers(n_layers)
  upper = np.triu(np.ones((n_layers, n_layers), bool), k=1)
  return upper & late[:, None] & late[None, :]


def swap_pairs(n_layers: int, late_only: bool = False) -> np.ndarray:
  """Int [P, 2]: the pairs ``(i, j)``, ``i < j``, in row-major order (all, or late only)."""
  mask = late_pairs(n_layers) if late_only else np.triu(np.ones((n_layers,) * 2, bool), k=1)
  return np.argwhere(mask).astype(np.int32)


def swap_orders(pairs: np.ndarray, n_layers: int) -> np.ndarray:
  """Int [P, L]: layer order ``0..L-1`` with ``i`` and ``j`` exchanged, one row per pair."""
  orders = np.tile(np.arange(n_layers, dtype=np.int32), (len(pairs), 1))
  rows = np.arange(len(pairs))
  orders[rows, pairs[:, 0]] = pairs[:, 1]
  orders[rows, pairs[:, 1]] = pairs[:, 0]
  return orders


def share_above(scores: np.ndarray, mask: np.ndarray, threshold: float) -> float:
  """Fraction of the entries selected by ``mask`` with ``score > threshold`` (NaN if none)."""
  values = np.asarray(scores)[np.asarray(mask)]
  return float(np.mean(values > threshold)) if values.size else float("nan")


def share_curve(scores: np.ndarray, mask: np.ndarray,
                thresholds: Sequence[float]) -> list[float]:
  """``share_above`` at each threshold: the sensitivity curve the paper does not report."""
  return [share_above(scores, mask, t) for t in thresholds]


# ---------------------------------------------------------------------------------------------
# Angular distance.
# ---------------------------------------------------------------------------------------------

def _unit(x: Array, eps: float = 1e-12) -> Array:
  x = x.astype(jnp.float32)
  norm = jnp.linalg.norm(x, axis=-1, keepdims=True)
  return jnp.where(norm > eps, x / jnp.maximum(norm, eps), 0.0)


def _arc(cos: Array) -> Array:
  return jnp.arccos(jnp.clip(cos, -1.0, 1.0)) / jnp.pi


def angular_distance(a: Array, b: Array) -> Array:
  """``mean_tokens arccos(cos(a, b)) / pi``; a, b: [..., d] (all leading axes are tokens)."""
  return jnp.mean(_arc(jnp.sum(_unit(a) * _unit(b), axis=-1)))


def angular_distance_matrix(hidden: Array) -> Array:
  """All-pairs ``D[i, j] = angular_distance(hidden[i], hidden[j])``; hidden: [L, B, T, d] -> [L, L].

  One row at a time (``lax.map``), so memory is ``L * B * T`` cosines, not ``L^2 * B * T``. The
  cosines are fp32 dots at ``HIGHEST`` precision, like ``angular_distance``'s sum: under a GPU's
  default TF32 a per-token distance near 0.006 (nearly parallel neighbours) errs by ~3% (numpy
  emulation of TF32's rounding at d = 1024; the token mean's bias was ~0.2%).
  """
  unit = _unit(hidden.reshape(hidden.shape[0], -1, hidden.shape[-1]))  # [L, N, d]
  cosines = lambda u_i: jnp.einsum("nd,lnd->ln", u_i, unit, precision=jax.lax.Precision.HIGHEST)
  row = lambda u_i: jnp.mean(_arc(cosines(u_i)), axis=-1)
  return jax.lax.map(row, unit)


def consecutive_angular_distance(distance_matrix: np.ndarray) -> np.ndarray:
  """[L-1]: ``D[l, l+1]``, the distance between the outputs of layers l and l+1."""
  return np.diagonal(np.asarray(distance_matrix), offset=1).copy()


# ---------------------------------------------------------------------------------------------
# Causal score.
# ---------------------------------------------------------------------------------------------

def causal_score_row(update: Array, update_skipped: Array, reduction: str = "mean",
                     eps: float = 1e-12) -> Array:
  """Relative update change of every layer t when one earlier layer is skipped.

  update, update_skipped: [L, B, T, d] (clean run, run with layer s gated off).
  Returns [L]: ``reduce_tokens ||u_t - u'_t|| / ||u_t||`` (reduction 'mean' or 'max'), 0 for a
  token with ``||u_t|| <= eps``; the caller keeps only ``t > s``.
  """
  u = update.astype(jnp.float32)
  num = jnp.linalg.norm(u - update_skipped.astype(jnp.float32), axis=-1)
  den = jnp.linalg.norm(u, axis=-1)
  ratio = jnp.where(den > eps, num / jnp.maximum(den, eps), 0.0)   # zero clean update scores 0
  ratio = ratio.reshape(ratio.shape[0], -1)
  if reduction == "mean":
    return jnp.mean(ratio, axis=-1)
  if reduction == "max":
    return jnp.max(ratio, axis=-1)
  raise ValueError(f"causal reduction={reduction!r}; allowed: mean, max")


def mask_upper(matrix: np.ndarray) -> np.ndarray:
  """Copy of a square matrix with NaN on and below the diagonal (only ``i < j`` is defined)."""
  out = np.array(matrix, dtype=np.float64)
  out[~np.triu(np.ones(out.shape, bool), k=1)] = np.nan
  return out


# ---------------------------------------------------------------------------------------------
# Permutation score.
# ---------------------------------------------------------------------------------------------

def permutation_matrix(pairs: np.ndarray, swapped_losses: np.ndarray, loss: float,
                       n_layers: int) -> np.ndarray:
  """[L, L] with ``P[i, j] = (loss_swapped(i, j) - loss) / loss`` at the given pairs, NaN elsewhere."""
  out = np.full((n_layers, n_layers), np.nan)
  scores = (np.asarray(swapped_losses, np.float64) - loss) / loss
  out[pairs[:, 0], pairs[:, 1]] = scores
  return out


# ---------------------------------------------------------------------------------------------
# Effective rank of HC / mHC mixing products.
# ---------------------------------------------------------------------------------------------

def effective_rank(matrix: Array, eps: float = 1e-12) -> Array:
  """Roy & Vetterli's ``exp(H(sigma / sum sigma))``; matrix: [..., n, n] -> [...].

  Scale-invariant. ``0 log 0 = 0``; an all-zero matrix gets erank 1 by the same convention.
  """
  sigma = jnp.linalg.svd(matrix.astype(jnp.float32), compute_uv=False)
  p = sigma / jnp.maximum(jnp.sum(sigma, axis=-1, keepdims=True), eps)
  return jnp.exp(-jnp.sum(jax.scipy.special.xlogy(p, p), axis=-1))


def interleave_sublayers(attn: Array, mlp: Array) -> Array:
  """[L, ...] attn and mlp values -> [2L, ...] in sublayer order (k = 2 l + sub)."""
  return jnp.stack([attn, mlp], axis=1).reshape((-1,) + attn.shape[1:])


def suffix_products(mixing: Array) -> Array:
  """``Q_k = M_(K-1) ... M_(k+1) M_k``: the map from the state before sublayer k to the end.

  mixing: [K, ..., n, n] per-sublayer matrices with ``H_new = M H``. Returns [K, ..., n, n]
  (``Q_0`` is the whole network's residual map, ``Q_(K-1) = M_(K-1)``).
  """
  eye = jnp.broadcast_to(jnp.eye(mixing.shape[-1], dtype=jnp.float32), mixing.shape[1:])

  def step(q, m):   # HIGHEST, as the cosines: TF32 on a GPU over up to 140 products would put a
    # floor under the small singular values the effective rank reads
    q = jnp.matmul(q, m.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
    return q, q

  _, out = jax.lax.scan(step, eye, mixing, reverse=True)
  return out


def mixing_rank_stats(mixing: Array, n_layers: int) -> dict[str, Array]:
  """Effective rank of products of stream-mixing matrices, per token, then token means.

  mixing: [2L, B, T, n, n], sublayer order. For every layer start ``s`` the object is the
  residual map of layers ``s..L-1``, ``Q_s = M_(2L-1) ... M_(2s)`` (per token, since HC/mHC
  weights are dynamic). Returns:
  ``erank_by_start`` [L] (token-mean erank of ``Q_s``), ``erank_late`` (of ``Q_(s0)``,
  ``s0 = ceil(L/4)``: the product over the whole late span; the headline number),
  ``amax_forward`` / ``amax_backward`` (mHC's Amax gain of ``Q_(s0)``: max absolute row / column
  sum, token mean).
  """
  q = suffix_products(mixing)[0::2]  # [L, B, T, n, n], layer starts
  erank = jnp.mean(effective_rank(q), axis=(1, 2))
  s0 = int(np.argmax(late_layers(n_layers)))
  q_late = q[s0]
  return {
      "erank_by_start": erank,
      "erank_late": erank[s0],
      "amax_forward": jnp.mean(jnp.max(jnp.sum(jnp.abs(q_late), axis=-1), axis=-1)),
      "amax_backward": jnp.mean(jnp.max(jnp.sum(jnp.abs(q_late), axis=-2), axis=-1)),
  }


# ---------------------------------------------------------------------------------------------
# Block AttnRes dead prefix.
# ---------------------------------------------------------------------------------------------

def dead_prefix(own_weight: np.ndarray, threshold: float = 0.05) -> dict:
  """Which leading layers put (almost) no weight on their own block's computation.

  own_weight: [L, 2], the token mean of ``own_block_weight`` per (layer, sublayer). A block's first
  sublayer has no partial sum yet (weight 0 by construction), so a layer's own weight is the
  **max over its two sublayers**: a layer is *dead* when neither sublayer reads its block's
  partial sum above ``threshold``. Returns ``per_layer`` [L], ``dead_layers`` (all indices below
  the threshold) and ``dead_prefix`` (the length of the run of dead layers starting at layer 0).
  With one-sublayer blocks no sublayer ever has a partial sum, so every layer would read as
  dead: the measure needs blocks of at least two sublayers (``probes`` reports none otherwise).
  """
  per_layer = np.max(np.asarray(own_weight, np.float64), axis=-1)
  dead = per_layer < threshold
  prefix = int(np.argmin(dead)) if not dead.all() else len(dead)
  return {"per_layer": per_layer.tolist(), "dead_layers": np.flatnonzero(dead).tolist(),
          "dead_prefix": prefix, "threshold": float(threshold)}
