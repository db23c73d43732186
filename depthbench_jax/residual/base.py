"""The residual-design interface and the math several designs share.

A design is two small Flax modules (see DEVELOPERS.md):

* ``LayerWiring``: created once per Transformer layer inside the scanned ``Block`` (its params are
  stacked on the layer axis). ``read`` gives the input of sublayer ``F`` (norms included),
  ``write`` applies the design's update equation, ``skip`` implements the diagnostics gate
  under ``causal_skip='absent'`` (the default scales ``F``'s output, ``Transformer``'s
  ``gate_outputs``).
* ``StateIO``: top level. ``init_state`` turns the embedding into the carried state, ``readout``
  turns the final state into the (normalised) hidden state the LM head reads.

Sublayers: ``sub=0`` attention, ``sub=1`` MLP; ``layer`` is the 0-based layer index: traced
under ``nn.scan`` and remat, a Python int in the unrolled, un-rematerialised loop (decoding),
where a design may use it to read only what earlier layers wrote (``static_prefix``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from depthbench_jax.model.layers import RMSNorm, dtype_of

Array = jax.Array
State = Any


def static_prefix(n_written, n_slots: int, multiple: int = 8) -> int | None:
  """How many leading slots of a buffer a read covers, given ``n_written``, the slots earlier
  sublayers may have written (computed from the layer index). The unrolled loop's index is a
  Python int, so then is ``n_written``: it is rounded up to a ``multiple``, at most ``n_slots``
  (the slots in between are absent and masked, as under the scan). Traced (``nn.scan``, or
  remat, which traces its arguments): None, read every slot.

  Rounded so that the unrolled layers share a few buffer shapes: with one shape per layer,
  XLA:CPU's compile of a 64x176 Full AttnRes decode step and prefill added 16,700 memory maps
  to the process (8,100 reading the whole buffer, 8,700 rounded to 8 slots), and the decode
  bench's 48 programs hit ``vm.max_map_count`` (65,530) and aborted."""
  if not isinstance(n_written, (int, np.integer)):
    return None
  return min(-(-int(n_written) // multiple) * multiple, n_slots)


class LayerWiring(nn.Module):
  """Per-layer residual wiring. Subclasses define ``setup``, ``read`` and ``write``."""

  cfg: Any  # depthbench_jax.model.config.ModelConfig
  # True when an ``attend`` override handles a ``decode=True`` attention (writes its K/V through
  # ``attn.kv_cache`` and attends to the cache), so KV-cached decoding is exact for the design.
  # The default ``attend`` does; an override that says nothing decodes by full recompute.
  attend_handles_kv_cache: ClassVar[bool] = False
  # What ``hidden`` returns, in words, for diagnostics.json and the report (the spec: "report
  # which one" of the layer's own input and a residual-equivalent state).
  hidden_state: ClassVar[str] = "the residual stream x"

  def norm(self, name: str, use_scale: bool = True, dtype=None) -> RMSNorm:
    """An RMSNorm in ``dtype`` (default: the compute dtype; KEEL and DeepNorm ask fp32)."""
    return RMSNorm(self.cfg.norm_eps, use_scale=use_scale,
                   dtype=dtype or dtype_of(self.cfg.dtype), name=name)

  def read(self, state: State, sub: int, layer: Array) -> Array:
    raise NotImplementedError

  def write(self, state: State, y: Array, sub: int, layer: Array) -> State:
    raise NotImplementedError

  def sublayer(self, state: State, sub: int, layer: Array,
               fn: Callable[[Array, State], tuple[Array, State]]) -> tuple[State, Array]:
    """One sublayer: ``u = read(state)``, ``y, state = fn(u, state)``, ``write(state, y)``.

    Returns (new state, y): ``y`` is the layer's update the causal score compares
    (``Block``'s ``update``). ``fn`` is the sublayer ``F`` (attention through ``attend``, or the
    MLP). Designs whose read and write share work (HC/mHC: the connection maps) override this
    to do it once; Sandwich-LN returns ``N_post(y)``, the increment it adds.
    """
    u = self.read(state, sub, layer)
    y, state = fn(u, state)
    return self.write(state, y, sub, layer), y

  def attend(self, attn: nn.Module, u: Array, rope: tuple[Array, Array], state: State,
             layer: Array) -> tuple[Array, State]:
    """Runs the attention sublayer on its input ``u`` (``rope``: the RoPE table,
    ``layers.rope_table``); MoDA overrides this to add depth keys."""
    return attn(u, rope), state

  def hidden(self, state: State) -> Array:
    """The residual-equivalent hidden state [B,T,d] the diagnostics compare across layers."""
    return state

  def skip(self, old: State, new: State, gate: Array) -> State:
    """``gate * new + (1 - gate) * old``: gate 0 leaves the state as if the layer were absent.

    This is Csordas et al.'s skip (``h_(s+1) := h_s``) for every design whose state is a plain
    pytree; designs with a preallocated buffer may override it to touch only what they wrote.
    """
    return jax.tree.map(lambda n, o: (gate * n + (1.0 - gate) * o).astype(n.dtype), new, old)


class StateIO(nn.Module):
  """Top-level ends of the residual: embedding -> state, final state -> normalised hidden."""

  cfg: Any

  def setup(self):
    self.final_norm = RMSNorm(self.cfg.norm_eps, dtype=dtype_of(self.cfg.dtype), name="final_norm")

  def init_state(self, x0: Array) -> State:
    return x0

  def readout(self, state: State) -> Array:
    return self.final_norm(state)


@dataclasses.dataclass(frozen=True)
class InitScales:
  """Multipliers on the init std of the projections (DeepNorm's beta; HC keeps 1, see hc.HC)."""
  attn_value: float = 1.0
  attn_out: float = 1.0
  mlp_in: float = 1.0
  mlp_out: float = 1.0


@dataclasses.dataclass(frozen=True)
class AppendBuffer:
  """An append-only buffer in a dict state: layer ``l`` writes slots ``[width*l, width*(l+1))``
  of each array in ``names`` along ``axis`` and reads earlier slots only, masked by the state's
  ``presence``, which ``presence(cfg, l)`` gives as it stands before layer ``l`` (ungated).
  Trainable with O(L) memory by model/append_stack.py."""
  names: tuple[str, ...]
  axis: int
  width: int
  presence: Callable[[Any, Array], Array]


@dataclasses.dataclass(frozen=True)
class RunningBuffer:
  """A source buffer in a dict state (``values``, ``inv_rms``, ``presence``, ``slot``) of
  finished slots and one running slot: layer ``l`` adds into slot ``first_slot(cfg, l)`` (and
  may open the next), writes no slot below it and reads only what is present,
  ``presence(cfg, l)`` as it stands before layer ``l`` (ungated). Trainable with O(L) memory by
  model/running_stack.py."""
  first_slot: Callable[[Any, Array], Array]
  presence: Callable[[Any, Array], Array]


@dataclasses.dataclass(frozen=True)
class Design:
  """A registry entry: the two modules, default hyperparameters, checks and init scales."""
  name: str
  layer: type[LayerWiring]
  io: type[StateIO] = StateIO
  defaults: dict = dataclasses.field(default_factory=dict)
  # Options of ``defaults`` that choose how the same math runs, not what it is (mHC's Sinkhorn
  # kernel): a run that sets one is the design itself, not a variant (``sweep.design_label``).
  implementation_options: tuple[str, ...] = ()
  init_scales: Callable[[Any], InitScales] = lambda cfg: InitScales()
  check: Callable[[Any, int], None] = lambda residual, n_layers: None
  description: str = ""
  # The state is an append-only source buffer (values/inv_rms/presence/slot; sublayer k reads
  # slots 0..k through ``pre_norm(depth read)`` and writes slot k+1): trainable with O(L d)
  # memory by model/buffer_stack.py.
  source_buffer: bool = False
  append_buffer: AppendBuffer | None = None
  running_buffer: RunningBuffer | None = None
  # The design's sublayers attend through ``model/layers.Attention`` (so
  # ``config.model.attention_kernel='fused'``, cuDNN on GPU, applies); False where the design
  # attends with its own einsums (MoDA's depth keys), which stay blocked XLA attention.
  backbone_attention: bool = True
  # Parameter names, besides the backbone's ``kernel``/``embedding``, that AdamW's weight decay
  # applies to: a design's dynamic projections (HC Sec. 4: dynamic weights decayed, static not).
  decayed: tuple[str, ...] = ()
  # What the design adds to the backbone's analytic cost (systems/flops.py: MFU, the sweep's
  # plan, the systems table), from the ModelConfig: parameters that multiply every token (a
  # projection of its own), and other forward FLOPs per token, ``(cfg, causal)``: causal=False
  # counts attention-like work as computed (systems/flops.py). None: the entry in
  # systems/design_costs.py, else nothing (a design with no contraction of its own).
  extra_matmul_params: Callable[[Any], int] | None = None
  extra_flops_per_token: Callable[[Any, bool], float] | None = None

  def validate(self, residual, n_layers: int) -> None:
    self.check(residual, n_layers)


# ---------------------------------------------------------------------------------------------
# Shared math, written once.
# ---------------------------------------------------------------------------------------------

def rms_norm_nogain(x: Array, eps: float = 1e-6, axis: int | tuple[int, ...] = -1) -> Array:
  """``N0(x) = x / sqrt(mean(x^2) + eps)`` over ``axis``, in fp32, no learned gain."""
  x32 = x.astype(jnp.float32)
  return x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=axis, keepdims=True) + eps)


def sinkhorn_knopp(logits: Array, iterations: int = 20, eps: float = 0.0) -> Array:
  """Projects ``exp(logits)`` [..., n, n] towards the doubly stochastic matrices.

  ``M0 = exp(logits - max)``; then ``iterations`` rounds of column- then row-normalisation
  (``M <- T_r(T_c(M))``), in fp32, as in mHC (Xie et al., 2025, Eq. 9). After the last round
  rows sum to 1 exactly and columns to within the method's convergence. The max shift cancels
  in the normalisation, so it carries no gradient (``stop_gradient``, as the reference code's
  ``detach``); differentiating through the max's ties gave NaN gradients under some XLA builds.
  """
  shift = jax.lax.stop_gradient(jnp.max(logits, axis=(-2, -1), keepdims=True))
  m = jnp.exp(logits.astype(jnp.float32) - shift)

  def one_round(m, _):
    m = m / (jnp.sum(m, axis=-2, keepdims=True) + eps)  # columns
    m = m / (jnp.sum(m, axis=-1, keepdims=True) + eps)  # rows
    return m, None

  m, _ = jax.lax.scan(one_round, m, None, length=iterations)
  return m


def inverse_rms(x: Array, eps: float = 1e-6) -> Array:
  """``1 / sqrt(mean(x^2) + eps)`` over the last axis, fp32: [..., d] -> [...]."""
  x32 = x.astype(jnp.float32)
  return jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1) + eps)


def depth_softmax(query: Array, sources: Array, mask: Array | None = None,
                  eps: float = 1e-6, inv_rms: Array | None = None) -> tuple[Array, Array]:
  """AttnRes depth attention: ``h = sum_i softmax_i(w . N0(v_i)) v_i``.

  query: [d] pseudo-query ``w``; sources: [S, B, T, d] values ``v_i``; mask: [S] bool (False =
  source absent, weight 0) or float presence ``p_i`` in [0, 1] (weights ``p_i e^(z_i) / sum_j
  p_j e^(z_j)``: 0 = absent, 1 = present, between = a softly gated source). Keys are the gain-free
  RMS-normalised values, no 1/sqrt(d) temperature (Kimi Team, 2026, Eq. 2-4). ``inv_rms``
  [S,B,T]: the sources' ``1/RMS`` when the caller keeps it (AttnRes stores it once per written
  slot), else computed here. Returns (h [B,T,d], weights [S,B,T]).

  The logit is ``z_i = (w . v_i) * inv_rms_i``: the normalised keys are never materialised, and
  the VJP is written out (``_depth_attend``), so a read costs two passes over the buffer forward
  and three backward.
  """
  if inv_rms is None:
    inv_rms = inverse_rms(sources, eps)
  s = sources.shape[0]
  if mask is None:
    bias = jnp.zeros((s,), jnp.float32)
  else:
    present = mask > 0
    bias = jnp.where(present, jnp.log(jnp.where(present, mask, 1).astype(jnp.float32)), -jnp.inf)
  return _depth_attend(query.astype(jnp.float32), sources, inv_rms, bias)


@jax.custom_vjp
def _depth_attend(query, values, inv_rms, bias):
  """``a = softmax_s(inv_rms_s (q . v_s) + bias_s)``, ``h = sum_s a_s v_s`` -> (h, a)."""
  return _depth_attend_fwd(query, values, inv_rms, bias)[0]


def _depth_attend_fwd(query, values, inv_rms, bias):
  qv = _per_slot(values, lambda v: jnp.einsum("sbtd,d->sbt", v, query.astype(v.dtype),
                                               preferred_element_type=jnp.float32))
  a = jax.nn.softmax(qv * inv_rms + bias[:, None, None], axis=0)                   # [S,B,T]
  h = _slot_weighted_sum(a, values)
  return (h.astype(values.dtype), a), (query, values, inv_rms, qv, a)


SLOT_CHUNK = 8


def slot_chunks(n_slots: Array, n_total: int, chunk: int, body: Callable, init):
  """``body(start, live, carry)`` over the slots ``0..n_slots-1`` in chunks of ``c = min(chunk,
  n_total)`` (a while loop: ``n_slots`` is traced). ``start`` is the chunk's first slot,
  clamped so that ``start + c <= n_total``; ``live`` [c] marks the chunk's slots not yet
  visited and ``< n_slots``; the others are to be left as they are.

  One iteration touches ``c`` slots in one fused pass, so an accumulator the loop carries is
  read and written once per ``c`` slots, not once per slot: on an H200 a one-slot-per-iteration
  depth read of [B,T,d] moved 5x the bytes of the slots it read (the fp32 accumulator's round
  trip per slot), benchmarks/README.md.
  """
  c = min(chunk, n_total)

  def step(i, carry):
    first = i * c
    start = jnp.minimum(first, n_total - c)
    slots = start + jnp.arange(c)
    return body(start, (slots >= first) & (slots < n_slots), carry)
  return jax.lax.fori_loop(0, (n_slots + c - 1) // c, step, init)


def _slot_weighted_sum(a: Array, values: Array, n_slots: Array | None = None,
                       chunk: int = SLOT_CHUNK) -> Array:
  """``sum_s a_s v_s``: a [S,B,T], values [S,B,T,d] -> [B,T,d] fp32, as a loop over slots.

  Over slots ``0..n_slots-1`` (all when None; a traced ``n_slots`` runs a while loop over
  chunks of ``chunk`` slots, ``slot_chunks``, else the loop is unrolled by 8). A reduce over
  the leading slot axis of the broadcast product runs 3x (S=17) to 50x (S=141) slower on
  XLA:CPU than accumulating one slot at a time; a chunk's slots are summed unrolled.
  """
  zero = jnp.zeros(values.shape[1:], jnp.float32)
  if n_slots is None:
    def add_slot(s, acc):
      return acc + a[s][..., None] * values[s].astype(jnp.float32)
    return jax.lax.fori_loop(0, values.shape[0], add_slot, zero, unroll=min(8, values.shape[0]))

  def add_chunk(start, live, acc):
    c = live.shape[0]
    w = jnp.where(live[:, None, None], jax.lax.dynamic_slice_in_dim(a, start, c, 0), 0.0)
    v = jax.lax.dynamic_slice_in_dim(values, start, c, 0)
    for j in range(c):
      acc = acc + w[j][..., None] * v[j].astype(jnp.float32)
    return acc
  return slot_chunks(n_slots, values.shape[0], chunk, add_chunk, zero)


def write_slot(values: Array, inv_rms: Array, slot: Array, value: Array,
               eps: float) -> tuple[Array, Array]:
  """``values[slot] = value`` [B,T,d] and ``inv_rms[slot] = 1/RMS(value)`` (in place under jit):
  a write to a source buffer that keeps each slot's 1/RMS beside it (AttnRes)."""
  value = value.astype(values.dtype)
  return (jax.lax.dynamic_update_slice_in_dim(values, value[None], slot, 0),
          jax.lax.dynamic_update_slice_in_dim(inv_rms, inverse_rms(value, eps)[None], slot, 0))


def _depth_attend_bwd(res, cotangents):
  """``da_s = <v_s, g_h> + g_a``, ``dz = a (da - sum_s a da)``; then ``dv_s = a_s g_h + dz_s
  inv_rms_s q``, ``dq = sum dz inv_rms v``, ``d inv_rms = dz (q . v)``, ``d bias = sum_bt dz``.

  Two passes over the buffer (``da``, ``dq``), ``SLOT_CHUNK`` slots at a time; ``dv`` reads no
  slot (one elementwise expression, written in the buffer's dtype).
  ``dq`` is a dot contracting a chunk's slots and its ``B*T`` tokens (0.77 ms at [9, 8, 128, 512]
  on 2 CPU cores, the einsum "sbt,sbtd->d" 2.9); not over ``S*B*T`` flattened rows, which
  all-gathered a batch-sharded buffer (FSDP and data parallel alike).
  """
  query, values, inv_rms, qv, a = res
  g_h, g_a = cotangents
  g_h = g_h.astype(jnp.float32)

  da = _per_slot(values, lambda v: jnp.sum(v.astype(jnp.float32) * g_h[None], axis=-1)) + g_a
  dz = a * (da - jnp.sum(a * da, axis=0, keepdims=True))
  dz_scaled = dz * inv_rms

  dv = (a[..., None] * g_h[None] + dz_scaled[..., None] * query).astype(values.dtype)

  def dq_chunk(start, v, dq):
    c = v.shape[0]
    w_z = jax.lax.dynamic_slice_in_dim(dz_scaled, start, c, 0).reshape(c, -1)
    v32 = v.astype(jnp.float32).reshape(c, -1, v.shape[-1])
    return dq + jax.lax.dot_general(w_z, v32, (((0, 1), (0, 1)), ((), ())))
  dq = slot_pieces(values, dq_chunk, jnp.zeros(query.shape, jnp.float32))
  return dq, dv, (dz * qv).astype(inv_rms.dtype), jnp.sum(dz, axis=(1, 2))


def _per_slot(values: Array, reduce: Callable) -> Array:
  """[S, B, T] fp32: ``reduce(v)`` ([c, B, T, d] -> [c, B, T]) of each piece ``v`` of the buffer
  (``slot_pieces``), written at the piece's slots."""
  put = lambda start, v, out: jax.lax.dynamic_update_slice_in_dim(out, reduce(v), start, 0)
  return slot_pieces(values, put, jnp.zeros(values.shape[:-1], jnp.float32))


def slot_pieces(values: Array, body: Callable, init, chunk: int = SLOT_CHUNK):
  """``body(start, v, carry)`` over the buffer ``values`` [S, ...] in chunks ``v`` of ``chunk``
  slots (a loop over the whole chunks, then the remainder); a buffer of at most ``2 * chunk``
  slots is one piece (Block AttnRes's 9: a loop of one chunk and a remainder of one was 5%
  slower in the step at 8x512).

  So no op converts the whole buffer to fp32: one chunk at a time. A whole-buffer fp32 operand (a
  dot's, or a convert that several ops share) is a materialised copy: in the 1.6B Full AttnRes
  readout (113 slots of bf16 [32, 2048, 1472] per device) 40 GiB each, three of them in the
  step.
  """
  if values.shape[0] <= 2 * chunk:
    chunk = values.shape[0]
  n_full, rest = divmod(values.shape[0], chunk)
  piece = lambda start, size, carry: body(
      start, jax.lax.dynamic_slice_in_dim(values, start, size, 0), carry)
  carry = init
  if n_full:
    carry = jax.lax.fori_loop(0, n_full, lambda i, c: piece(i * chunk, chunk, c), carry)
  if rest:
    carry = piece(n_full * chunk, rest, carry)
  return carry


_depth_attend.defvjp(_depth_attend_fwd, _depth_attend_bwd)


def check_fields(residual, spec: dict[str, tuple[Callable[[Any], bool], str]]) -> None:
  """Validates a design's ``config.model.residual`` (already merged with ``Design.defaults``).

  spec: field -> (predicate on the value, text naming the allowed values). Unknown fields and
  values failing their predicate raise ``ConfigError`` naming ``config.model.residual.<field>``.
  """
  from depthbench_jax.errors import ConfigError  # pylint: disable=g-import-not-at-top

  known = {"name", *spec}
  for key in residual.keys():
    if key not in known:
      raise ConfigError(f"config.model.residual.{key}: not a field of design "
                        f"{residual.get('name')!r}; allowed: {', '.join(sorted(known))}")
  for key, (ok, allowed) in spec.items():
    value = residual.get(key)
    if not ok(value):
      raise ConfigError(f"config.model.residual.{key}={value!r}; allowed: {allowed}")
