"""Attention Residuals (Kimi Team, 2026, arXiv 2603.15031): Full and Block AttnRes.

Every sublayer reads its input as a softmax mixture over stored sources instead of one summed
stream (paper Eq. 2-4):

  h_k = sum_i alpha_(i->k) v_i,   alpha_(i->k) = softmax_i( w_k . (g_k * N0(v_i)) ),

one zero-init pseudo-query ``w_k`` [d] and one key RMSNorm (gain ``g_k``, init 1) per sublayer,
no 1/sqrt(d) temperature; the sublayer computes ``v = F(N(h_k))`` with its usual pre-norm ``N``.

Conventions (shared by both designs, from the paper):
* Sublayers are the unit: attention and MLP are each a source, global index ``k = 2*layer + sub``
  (the paper counts every Attn and MLP as a "layer", L_AR = 2 * n_layers). ``v_0`` = embedding.
* Key RMSNorm is learnable: the paper adds "one RMSNorm and one pseudo-query vector w_l per
  layer" and the official README pseudocode uses a weighted ``RMSNorm`` for the keys. Since
  ``w . (g * N0(v)) = (w * g) . N0(v)``, the gain is folded into the query and the shared
  ``base.depth_softmax`` (gain-free keys) does the math. The PyPI reference ``attn-res==0.1.0``
  uses a gain-free key norm instead (``RMSNormNoWeight``): equal at init and whenever
  ``g = 1``; in general ``ours(w, g) == reference(w * g)`` (tests/residual/test_attnres_parity.py).
* Readout: one more aggregation over all sources with its own zero-init query (and key gain),
  then the final RMSNorm; for Block this is the paper's "the final output layer aggregates all N
  block representations", for Full the same rule (an extrapolation shared by the reimplementations
  the spec cites). ``attn-res==0.1.0`` instead returns the plain *sum* of the final sources; at
  init (zero readout query) ours is that sum divided by the number of sources ``S``, which the
  parity test checks.
* Presence and the diagnostics gate: the state carries ``presence`` [S] (1 = written, 0 = not yet
  written or its layer absent). A source's softmax weight is ``p_i e^(z_i) / sum_j p_j e^(z_j)``,
  so unwritten slots are masked and a layer with gate 0 simply disappears from every later
  sublayer's source set (and from the readout), as if the network did not contain it. ``skip``
  only blends ``presence`` (and, for Block, the one or two block slots the layer touched), never
  the whole buffer.
* ``hidden(state)``: the residual-equivalent stream ``x = sum_i p_i v_i`` (embedding plus every
  present sublayer output). It is what a Pre-LN network with the same sublayer outputs would carry,
  is the same quantity for Full and Block (block slots sum the same outputs), and needs no query of
  the next layer. (The latest stored output is available from ``return_layers['update']``.)

Diagnostics (``intermediates``, once per sublayer): ``depth_weights`` [S,B,T] (zero on absent
slots) and, Block only, ``own_block_weight`` [B,T] (weight on the current block's partial sum, 0 for
a block's first sublayer).
"""

from __future__ import annotations

import math
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from depthbench_jax.model.layers import dtype_of
from depthbench_jax.residual.base import (Design, LayerWiring, RunningBuffer, StateIO,
                                          check_fields, depth_softmax, inverse_rms,
                                          static_prefix, write_slot)

Array = jax.Array


# ---------------------------------------------------------------------------------------------
# Pieces both designs share.
# ---------------------------------------------------------------------------------------------

class _DepthQueries(LayerWiring):
  """Per-layer params of both designs: two pseudo-queries, two key gains, two pre-norms."""

  hidden_state: ClassVar[str] = ("the sum of the present sources (residual-equivalent: Pre-LN's "
                                 "x), not a layer's own read h_l")

  def setup(self):
    d = self.cfg.d_model
    vec = lambda init, name: self.param(
        name, nn.with_logical_partitioning(init, ("norm",)), (d,), jnp.float32)
    # [sub] -> param; sub 0 = attention, 1 = MLP. Zero queries: uniform weights at init (AR §5).
    self.queries = (vec(nn.initializers.zeros, "attn_res_query_attn"),
                    vec(nn.initializers.zeros, "attn_res_query_mlp"))
    self.key_gains = (vec(nn.initializers.ones, "attn_res_key_norm_attn"),
                      vec(nn.initializers.ones, "attn_res_key_norm_mlp"))
    self.input_norm = self.norm("input_layernorm")
    self.post_attention_norm = self.norm("post_attention_layernorm")

  def depth_query(self, sub: int) -> Array:
    """``w * g`` [d]: sublayer ``sub``'s pseudo-query with its key gain folded in."""
    return self.queries[sub] * self.key_gains[sub]

  def aggregate(self, state, sub: int, n_read: int | None = None) -> tuple[Array, Array]:
    """``h = sum_i softmax_i((w * g) . N0(v_i)) v_i`` over present slots; also the weights [S,..].

    ``n_read``: a static bound on the slots written so far (the unrolled loop knows its layer,
    ``static_prefix``); the read then skips the slots after it, which are absent (weight 0
    either way), and the weights are padded back. Under ``nn.scan`` every slot is read.
    """
    values, inv_rms, presence = state["values"], state["inv_rms"], state["presence"]
    n_slots = values.shape[0]
    if n_read is not None:
      values, inv_rms, presence = values[:n_read], inv_rms[:n_read], presence[:n_read]
    h, weights = depth_softmax(self.depth_query(sub), values, presence, self.cfg.norm_eps,
                               inv_rms=inv_rms)
    weights = jnp.pad(weights, ((0, n_slots - weights.shape[0]), (0, 0), (0, 0)))
    self.sow("intermediates", "depth_weights", weights)
    return h, weights

  def pre_norm(self, h: Array, sub: int) -> Array:
    return self.input_norm(h) if sub == 0 else self.post_attention_norm(h)

  def hidden(self, state) -> Array:
    """Residual-equivalent stream ``sum_i p_i v_i`` [B,T,d] (see the module docstring)."""
    p = state["presence"].astype(state["values"].dtype)
    return jnp.einsum("s,sbtd->btd", p, state["values"])


class DepthReadout(StateIO):
  """Final aggregation with its own zero-init query and key gain, then the final RMSNorm."""

  def setup(self):
    super().setup()
    d = self.cfg.d_model
    self.readout_query = self.param(
        "readout_query", nn.with_logical_partitioning(nn.initializers.zeros, ("norm",)), (d,),
        jnp.float32)
    self.readout_key_gain = self.param(
        "readout_key_norm", nn.with_logical_partitioning(nn.initializers.ones, ("norm",)), (d,),
        jnp.float32)

  def n_slots(self) -> int:
    raise NotImplementedError

  def init_state(self, x0: Array):
    """``values`` [S,B,T,d] zeros with slot 0 = embedding; ``presence`` [S] = e_0.

    Built by concatenation, each ``inv_rms`` from its own slot: a scatter of ``x0`` into the
    zeros, and 1/RMS over the result, made XLA:CPU an fp32 copy of the whole buffer (the 1.6B
    Full AttnRes step: 40 GiB per device)."""
    n, eps = self.n_slots(), self.cfg.norm_eps
    unwritten = (n - 1,) + x0.shape
    values = jnp.concatenate([x0[None], jnp.zeros(unwritten, x0.dtype)])
    inv_rms = jnp.concatenate([inverse_rms(x0, eps)[None],
                               jnp.broadcast_to(inverse_rms(jnp.zeros((1,), x0.dtype), eps),
                                                unwritten[:-1])])
    presence = jnp.zeros((n,), jnp.float32).at[0].set(1.0)
    return depth_state(values, presence, jnp.zeros((), jnp.int32), eps, inv_rms)

  def readout(self, state) -> Array:
    h, weights = depth_softmax(self.readout_query * self.readout_key_gain, state["values"],
                               state["presence"], self.cfg.norm_eps, inv_rms=state["inv_rms"])
    self.sow("intermediates", "readout_depth_weights", weights)
    return self.final_norm(h.astype(dtype_of(self.cfg.dtype)))


def depth_state(values: Array, presence: Array, slot: Array, eps: float,
                inv_rms: Array | None = None) -> dict:
  """The AttnRes state: ``values`` [S,B,T,d], ``inv_rms`` [S,B,T] (``1/RMS`` of each slot, kept
  beside it so a read never recomputes it; computed here unless given), ``presence`` [S],
  ``slot`` (last slot written)."""
  if inv_rms is None:
    inv_rms = inverse_rms(values, eps)
  return {"values": values, "inv_rms": inv_rms, "presence": presence, "slot": slot}


def written_state(values: Array, inv_rms: Array, eps: float) -> dict:
  """The state after a stack (``model/buffer_stack.py``, ``running_stack.py``) has run every
  layer: all ``S`` slots present, the last one written last."""
  n_slots = values.shape[0]
  return depth_state(values, jnp.ones((n_slots,), jnp.float32),
                     jnp.asarray(n_slots - 1, jnp.int32), eps, inv_rms)


def _put(state: dict, slot: Array, value: Array, eps: float) -> dict:
  """``state`` with ``values[slot] = value`` and its ``inv_rms`` (in place under jit)."""
  values, inv_rms = write_slot(state["values"], state["inv_rms"], slot, value, eps)
  return {"values": values, "inv_rms": inv_rms, "presence": state["presence"].at[slot].set(1.0),
          "slot": jnp.asarray(slot, jnp.int32)}


def _blend(old: Array, new: Array, gate: Array) -> Array:
  return (gate * new + (1.0 - gate) * old).astype(new.dtype)


# ---------------------------------------------------------------------------------------------
# Full AttnRes.
# ---------------------------------------------------------------------------------------------

class FullAttnRes(_DepthQueries):
  """Full AttnRes: every sublayer attends over the embedding and all earlier sublayer outputs.

  State: ``values`` [2L+1, B, T, d], one preallocated buffer carried by the scan (slot 0 = ``v_0``
  = embedding, slot ``k+1`` = output of global sublayer ``k = 2*layer + sub``), written with
  ``dynamic_update_slice`` at the traced index; ``presence`` [2L+1] masks slots not yet written
  (and layers gated out); ``slot`` (int32) = the last slot written. Sublayer ``k`` reads slots
  ``0..k`` (all that are present): ``h_k = sum_i softmax_i(w_k . N0(v_i)) v_i``; then
  ``v_(k+1) = F(N(h_k))`` is stored. Under ``nn.scan`` the read covers all ``2L+1`` slots, the
  later ones masked (the index is traced); the unrolled loop, whose index is a Python int,
  reads slots ``0..k`` only, rounded up to 8 slots (``base.static_prefix``; Block AttnRes
  likewise reads its block slots ``0..n``). Memory O(L d) per token (paper §3.1). Reverse-mode
  through ``nn.scan`` would save each iteration's carry (O(L^2 d) in training); under any
  ``remat_policy`` but ``'none'`` the Transformer runs ``model/buffer_stack.py`` instead,
  which saves the final buffer once (``Design.source_buffer``).
  """

  def read(self, state, sub, layer):
    n_read = static_prefix(2 * layer + sub + 1, state["values"].shape[0])  # slots 0..k
    h, _ = self.aggregate(state, sub, n_read)
    return self.pre_norm(h.astype(state["values"].dtype), sub)

  def write(self, state, y, sub, layer):
    return _put(state, 2 * layer + sub + 1, y, self.cfg.norm_eps)

  def skip(self, old, new, gate):
    """Gate 0 = layer absent: its two slots keep their values but get presence 0 (masked)."""
    return {**new, "presence": _blend(old["presence"], new["presence"], gate)}


class FullAttnResIO(DepthReadout):

  def n_slots(self) -> int:
    return 2 * self.cfg.n_layers + 1


def _check_full(residual, n_layers):
  check_fields(residual, {})


# ---------------------------------------------------------------------------------------------
# Block AttnRes.
# ---------------------------------------------------------------------------------------------

BLOCK_UNITS = ("sublayer", "layer")
BLOCK_DEFAULTS = {"n_blocks": 8, "block_unit": "sublayer"}


def block_schedule(n_layers: int, n_blocks: int, unit: str = "sublayer") -> tuple[int, int]:
  """(sublayers per block, number of blocks) under the Kimi K3 schedule of ``n_blocks`` blocks.

  Block size = ``ceil(units / n_blocks)`` units, and there are ``ceil(units / size) <= n_blocks``
  blocks, the last one possibly partial; the size therefore grows with depth at fixed
  ``n_blocks`` (L=16 -> 2 layers, L=32 -> 4, L=70 -> 9). Units:

  * ``'sublayer'`` (default): the AttnRes paper's S, which counts attention and MLP sublayers
    (spec 5.2: "N blocks of S = L/N sublayers"). It gives exactly 8 blocks at every suite depth
    (L=20: 5-sublayer blocks, so a boundary may fall between a layer's two sublayers), as
    DepthBench's "8 block boundaries" reads, and equals ``'layer'`` at L = 16, 24, 32, 56, 70
    and K3's 93 layers in 12-layer blocks (not at every depth where both give 8 blocks: L = 57
    is (15, 8) in sublayers, (16, 8) in layers). With ``n_blocks >= 2L`` each
    sublayer is its own block: Full AttnRes (so at L <= 4 with 8 blocks).
  * ``'layer'``: K3's wording, sizes in whole decoder layers: 7 blocks at L = 20, 28, 42.
  """
  units = n_layers if unit == "layer" else 2 * n_layers
  size = math.ceil(units / n_blocks)
  per_unit = 2 if unit == "layer" else 1
  return size * per_unit, math.ceil(units / size)


def block_schedule_of(cfg) -> tuple[int, int]:
  """``block_schedule`` of a model config (its ``residual.n_blocks`` and ``block_unit``)."""
  return block_schedule(cfg.n_layers, cfg.residual.get("n_blocks", BLOCK_DEFAULTS["n_blocks"]),
                        cfg.residual.get("block_unit", BLOCK_DEFAULTS["block_unit"]))


class BlockAttnRes(_DepthQueries):
  """Block AttnRes: sublayers grouped into blocks; attention over block summaries (paper §3.2).

  ``b_0`` = embedding, ``b_n`` = sum of block ``n``'s sublayer outputs, ``b_n^i`` = partial sum of
  its first ``i``. Sources of the ``i``-th sublayer of block ``n`` (paper Eq. 6): ``[b_0..b_(n-1)]``
  for ``i = 1`` and ``[b_0..b_(n-1), b_n^(i-1)]`` for ``i >= 2``; then ``b_n^i = b_n^(i-1) + v``.
  Block size: ``block_schedule`` (config ``n_blocks``, default 8, and ``block_unit``, default
  'sublayer': the paper's S, 8 blocks at every depth; 'layer' sizes blocks in whole layers).

  State, with ``N = block_schedule_of(cfg)[1]`` the blocks the schedule gives (``<= n_blocks``:
  7 at L = 20 in layer units, 5 at L = 5 in sublayers): ``values`` [N+1, B, T, d] (slot 0 =
  ``b_0``, slot ``n`` = block ``n``'s summary;
  the running partial sum ``b_n^i`` lives in its own slot ``n`` until the block completes, so no
  separate partial-sum array is needed), ``presence`` [N+1] (a block's slot turns present
  with its first written sublayer, which makes Eq. 6's "no partial sum for i = 1" automatic), and
  ``slot`` = the last slot written. Memory O(N d) per token. Reverse-mode through
  ``nn.scan`` would save every layer's copy of the whole buffer; trained with remat, the
  Transformer runs ``model/running_stack.py`` instead, which saves one slot per layer
  (``Design.running_buffer``).

  Gate 0 = layer absent: the layer's outputs are not added to its block's partial sum (the one or
  two slots it touched are restored) and a slot it opened stays absent.
  """

  def read(self, state, sub, layer):
    n = block_slot(self.cfg, 2 * layer + sub)   # reads block slots 0..n
    h, weights = self.aggregate(state, sub, static_prefix(n + 1, state["values"].shape[0]))
    self.sow("intermediates", "own_block_weight", jnp.take(weights, n, axis=0))
    return self.pre_norm(h.astype(state["values"].dtype), sub)

  def write(self, state, y, sub, layer):
    n = block_slot(self.cfg, 2 * layer + sub)
    # A slot is zero until its block's first sublayer writes, so "+=" also starts the partial sum.
    current = jax.lax.dynamic_index_in_dim(state["values"], n, axis=0, keepdims=False)
    return _put(state, n, current + y.astype(current.dtype), self.cfg.norm_eps)

  def skip(self, old, new, gate):
    # The layer touched slot new.slot and possibly new.slot - 1 (a block boundary between its
    # attention and MLP sublayers): blend a 2-slot window ending there (start clamped to >= 0).
    start = jnp.maximum(new["slot"] - 1, 0)
    window = lambda v: jax.lax.dynamic_slice_in_dim(v, start, 2, axis=0)
    blended = _blend(window(old["values"]), window(new["values"]), gate)
    put = lambda buf, v: jax.lax.dynamic_update_slice_in_dim(buf, v, start, axis=0)
    return {"values": put(new["values"], blended),
            "inv_rms": put(new["inv_rms"], inverse_rms(blended, self.cfg.norm_eps)),
            "presence": _blend(old["presence"], new["presence"], gate), "slot": new["slot"]}


def block_slot(cfg, k: Array) -> Array:
  """The block slot ``n`` that global sublayer ``k = 2*layer + sub`` adds into (slot 0 is the
  embedding): ``k // per_block + 1``."""
  per_block, _ = block_schedule_of(cfg)
  return k // per_block + 1


def block_first_slot(cfg, layer: Array) -> Array:
  """The block slot layer ``layer``'s attention sublayer adds into (its lowest write)."""
  return block_slot(cfg, 2 * layer)


def block_presence_before(cfg, layer: Array) -> Array:
  """Presence [n_blocks+1] before layer ``layer`` (ungated): slot 0 and every block whose first
  sublayer ``(n - 1) * per_block`` has run, i.e. comes before sublayer ``2 * layer``."""
  per_block, n_blocks = block_schedule_of(cfg)
  slots = jnp.arange(n_blocks + 1)
  return ((slots == 0) | ((slots - 1) * per_block < 2 * layer)).astype(jnp.float32)


class BlockAttnResIO(DepthReadout):

  def n_slots(self) -> int:
    return block_schedule_of(self.cfg)[1] + 1


def _check_block(residual, n_layers):
  check_fields(residual, {
      "n_blocks": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
                   "a positive integer (Kimi K3 schedule: 8)"),
      "block_unit": (lambda v: v in BLOCK_UNITS, ", ".join(BLOCK_UNITS)),
  })


FULL = Design(name="attnres_full", layer=FullAttnRes, io=FullAttnResIO, check=_check_full,
              source_buffer=True,
              description="h_k = sum_i softmax_i(w_k . N0(v_i)) v_i over all earlier sublayers")
BLOCK = Design(name="attnres_block", layer=BlockAttnRes, io=BlockAttnResIO,
               defaults=BLOCK_DEFAULTS, check=_check_block,
               running_buffer=RunningBuffer(block_first_slot, block_presence_before),
               description="AttnRes over block summaries + the current partial sum (Eq. 6)")
