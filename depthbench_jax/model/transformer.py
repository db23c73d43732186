"""The LLaMA-like backbone with a pluggable residual design.

``tokens [B,T] -> embed -> state = io.init_state(x0) -> L x Block (nn.scan + remat) ->
io.readout(state) -> LM head -> logits [B,T,V]``.

Each ``Block`` runs attention then SwiGLU through the design's ``LayerWiring`` (DEVELOPERS.md).
The scan carries the residual state; its per-layer inputs are the layer index and the
diagnostics gate, so skipping a layer (gate 0) or collecting per-layer hidden states needs no
second code path. Permuted layer order is a pure transform of the stacked params
(``permute_layers``).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from depthbench_jax.model import append_stack, buffer_stack, running_stack
from depthbench_jax.model.config import ModelConfig
from depthbench_jax.model.layers import Attention, SwiGLU, dtype_of, normal_init, rope_table
from depthbench_jax.model.matmul import PROJECTION, projection_dot_general
from depthbench_jax.residual import attnres, registry

Array = jax.Array

# The projections are dots too: their custom-VJP outputs (model/matmul.py) carry the name
# PROJECTION, which the policies that save dots also save.
_cp = jax.checkpoint_policies
_POLICIES = {
    "nothing_saveable": _cp.nothing_saveable,
    "dots_saveable": _cp.save_from_both_policies(
        _cp.dots_saveable, _cp.save_only_these_names(PROJECTION)),
    "dots_with_no_batch_dims_saveable": _cp.save_from_both_policies(
        _cp.dots_with_no_batch_dims_saveable, _cp.save_only_these_names(PROJECTION)),
    "everything_saveable": _cp.everything_saveable,
}


class Block(nn.Module):
  """One Transformer layer: ``(state, {layer[, gate]}) -> (state, per-layer outputs)``."""

  cfg: ModelConfig
  return_layers: bool = False
  decode: bool = False  # KV-cached attention (model/decode.py); inference only.

  def setup(self):
    cfg = self.cfg
    design = registry.get(cfg.design)
    scales = design.init_scales(cfg)
    dtype, param_dtype = dtype_of(cfg.dtype), dtype_of(cfg.param_dtype)
    self.wiring = design.layer(cfg, name="residual")
    self.attn = Attention(
        cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, qk_norm=cfg.qk_norm,
        norm_eps=cfg.norm_eps, init_std=cfg.init_std,
        out_init_scale=scales.attn_out, value_init_scale=scales.attn_value, dtype=dtype,
        param_dtype=param_dtype, use_fused_kernel=cfg.attention_kernel == "fused",
        decode=self.decode, name="self_attn")
    self.mlp = SwiGLU(cfg.d_model, cfg.ffn_dim, init_std=cfg.init_std,
                      in_init_scale=scales.mlp_in, out_init_scale=scales.mlp_out, dtype=dtype,
                      param_dtype=param_dtype, name="mlp")

  def __call__(self, state, xs, rope):
    wiring, layer = self.wiring, xs["layer"]
    state_in = state
    state, y_attn, y_mlp = _sublayers(self, state, layer, rope, xs.get("output_gate"))
    if "gate" in xs:  # only a diagnostics gate blends: with none, no pass over the state
      state = wiring.skip(state_in, state, xs["gate"])

    outputs = None
    if self.return_layers:
      outputs = {"hidden": wiring.hidden(state), "update": y_attn + y_mlp}
    return state, outputs

  def append_layer(self, x, buffers, layer, rope):
    """The layer for ``model/append_stack.py``: ``(x, buffers) -> (x', writes)`` with the
    presence of an ungated stack before ``layer``; writes = its slots of each buffer. The
    buffers may be a prefix of the slots (the stack's segments); presence is cut to match."""
    spec = registry.get(self.cfg.design).append_buffer
    n_slots = buffers[spec.names[0]].shape[spec.axis]
    state = {"x": x, **buffers, "presence": spec.presence(self.cfg, layer)[:n_slots]}
    state, _, _ = _sublayers(self, state, layer, rope)
    writes = {n: jax.lax.dynamic_slice_in_dim(state[n], spec.width * layer, spec.width, spec.axis)
              for n in spec.names}
    return state["x"], writes

  def running_layer(self, values, inv_rms, layer, rope):
    """The layer for ``model/running_stack.py``: ``(values, inv_rms) -> (values, inv_rms)``
    with the presence of an ungated stack before ``layer``."""
    spec = registry.get(self.cfg.design).running_buffer
    state = {"values": values, "inv_rms": inv_rms, "presence": spec.presence(self.cfg, layer),
             "slot": spec.first_slot(self.cfg, layer)}
    state, _, _ = _sublayers(self, state, layer, rope)
    return state["values"], state["inv_rms"]

  def depth_query(self, sub: int):
    return self.wiring.depth_query(sub)

  def branch(self, h, sub: int, rope):
    """``F_sub(N_sub(h))``: one sublayer on its aggregated input ``h`` [B,T,d], for designs
    whose ``read`` is an aggregation followed by the pre-norm (``wiring.pre_norm``; AttnRes)."""
    u = self.wiring.pre_norm(h, sub)
    return self.attn(u, rope) if sub == 0 else self.mlp(u)


def _sublayers(block: Block, state, layer, rope, output_gate=None):
  """Attention then MLP through the block's wiring: ``(state, y_attn, y_mlp)``; ``output_gate``
  scales both sublayers' outputs ``F`` before the design writes them (0: the causal score's
  'update set to zero'). A function, not a method: flax would add a ``_sublayers`` scope to
  every op name (profile_step's parts)."""
  wiring = block.wiring
  gated = ((lambda y: y) if output_gate is None else
           (lambda y: (output_gate * y).astype(y.dtype)))

  def attention(u, s):
    y, s = wiring.attend(block.attn, u, rope, s, layer)
    return gated(y), s

  state, y_attn = wiring.sublayer(state, 0, layer, attention)
  state, y_mlp = wiring.sublayer(state, 1, layer, lambda u, s: (gated(block.mlp(u)), s))
  return state, y_attn, y_mlp


def _block_class(cfg: ModelConfig, decode: bool = False) -> type[nn.Module]:
  if cfg.remat_policy == "none" or decode:  # No backward pass when decoding: nothing to remat.
    return Block
  return nn.remat(Block, policy=_POLICIES[cfg.remat_policy], prevent_cse=not cfg.scan_layers)


def embedding_rows(table: Array, tokens: Array, cfg: ModelConfig) -> Array:
  """``x0 [B,T,d] = table[tokens]`` in the stream's dtype: the compute dtype, or with
  ``model.stream_dtype='float32'`` fp32 straight from the table, never rounded through the
  compute dtype (PyTorch autocast's embedding output: its weight's dtype).

  Looked up in the table's own dtype, then cast: the same values as ``embed(tokens)``, but its
  gradient, a scatter-add of every occurrence of a token into its row, then sums in fp32. In
  bf16 a row stagnates once its sum is ~500x an addend (on 131k Zipf-drawn tokens, rows seen
  over 1000 times erred by a median 5-58%, worst 91%)."""
  stream = jnp.float32 if cfg.stream_dtype == "float32" else dtype_of(cfg.dtype)
  return jnp.take(table, tokens, axis=0).astype(stream)


def batch_sharded(tree: Any, mesh, batch: int, seq: int) -> Any:
  """Every array of ``tree`` with a ``[.., B, T, ..]`` pair of axes (``x [B,T,d]``, HC's
  streams ``[B,T,n,d]``, AttnRes's slots ``[S,B,T,d]``, logits, microbatches ``[k,B/k,T]``)
  pinned to rows split over the mesh's ``data x fsdp`` (MaxText's activation constraint; a
  no-op without a mesh). Without it XLA's propagation takes the fsdp-sharded ``embed`` axis of
  the weights for the activations and every device holds the whole batch: the 1.6B suite's
  train step on 16 devices had 383 GiB of temporaries per device (XLA:CPU), 41 GiB with it
  (Pre-LN); HC's streams need the pin on the state too (222 -> 95 GiB; Block AttnRes 481 ->
  419), and Full AttnRes's buffer stack inside its scans (``buffer_stack.source_buffer_stack``'s
  ``pin``)."""
  if mesh is None:
    return tree
  from depthbench_jax.train.sharding import BATCH_AXES  # Local: train imports the model.

  def pin(x):
    shape = tuple(getattr(x, "shape", ()))
    axes = [i for i in range(len(shape) - 1) if shape[i:i + 2] == (batch, seq)]
    if not axes:
      return x
    spec = [None] * len(shape)
    spec[axes[0]] = BATCH_AXES
    return jax.lax.with_sharding_constraint(
        x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec)))
  return jax.tree.map(pin, tree)


class Transformer(nn.Module):
  """``tokens [B,T] int32 -> logits [B,T,V] float32`` (plus per-layer outputs on request).

  ``decode=True`` keeps attention K/V in the mutable ``cache`` collection (``model/decode.py``
  drives it); the default path is unchanged by it.
  """

  cfg: ModelConfig
  decode: bool = False
  mesh: Any = None  # jax.sharding.Mesh: activations pinned to batch rows (batch_sharded).

  @nn.compact
  def __call__(self, tokens: Array, gate: Array | None = None, return_layers: bool = False,
               positions: Array | None = None, logits_at: Array | None = None,
               gate_outputs: bool = False):
    """Logits [B,T,V]; with ``logits_at`` [B] only that position's per row, [B,1,V] (a prefill
    reads one row: the LM head over all T was ~half a 512-token prefill's FLOPs at 8x512).

    ``gate`` [L] (diagnostics): each layer's state blended with its input (``LayerWiring.skip``,
    gate 0 = the layer absent), or with ``gate_outputs`` its sublayers' outputs scaled (gate 0
    = its update set to zero, the design's own write still applied)."""
    cfg = self.cfg
    design = registry.get(cfg.design)
    dtype = dtype_of(cfg.dtype)
    batch, seq = tokens.shape
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32), (batch, seq))
    rope = rope_table(positions, cfg.head_dim, cfg.rope_theta)  # once, read by every layer
    embed = nn.Embed(cfg.vocab_size, cfg.d_model, dtype=dtype,
                     param_dtype=dtype_of(cfg.param_dtype),
                     embedding_init=normal_init(cfg.init_std, "vocab", "embed"), name="embed")
    io = design.io(cfg, name="residual_io")
    pin = lambda tree: batch_sharded(tree, self.mesh, batch, seq)
    x0 = embedding_rows(embed.embedding, tokens, cfg)
    state = pin(io.init_state(pin(x0)))  # HC's streams lose the split without it.
    xs = {"layer": jnp.arange(cfg.n_layers, dtype=jnp.int32)}
    if gate is not None:
      xs["output_gate" if gate_outputs else "gate"] = gate.astype(dtype)
    block_cls = _block_class(cfg, self.decode)
    variable_axes = {"params": 0, "intermediates": 0}
    if self.decode:
      variable_axes["cache"] = 0
    # A design with a buffer state trains through its own O(L)-memory stack (model/*_stack.py)
    # wherever nothing but the loss is asked; everything else takes the plain scan.
    custom_stack = self._plain_training_stack(gate, return_layers)
    if custom_stack and design.source_buffer:         # Full AttnRes: buffer_stack.py
      state = self._run_source_buffer_stack(state, rope, pin)
      layer_outputs = None
    elif custom_stack and design.append_buffer:       # MoDA: append_stack.py
      state = self._run_append_buffer_stack(design.append_buffer, state, rope)
      layer_outputs = None
    elif custom_stack and design.running_buffer:      # Block AttnRes: running_stack.py
      state = self._run_running_buffer_stack(design.running_buffer, state, rope, pin)
      layer_outputs = None
    elif cfg.scan_layers:
      stack = nn.scan(
          block_cls, variable_axes=variable_axes,
          split_rngs={"params": True}, in_axes=(0, nn.broadcast), length=cfg.n_layers,
          metadata_params={nn.PARTITION_NAME: "layers"})
      state, layer_outputs = stack(cfg, return_layers, self.decode, name="layers")(
          state, xs, rope)
    else:
      per_layer = []
      for i in range(cfg.n_layers):
        # The layer index as a Python int: a design may then read only the slots written so
        # far (``residual.base.static_prefix``); remat still traces it.
        xs_i = {**jax.tree.map(lambda a: a[i], xs), "layer": i}
        state, out = block_cls(cfg, return_layers, self.decode, name=f"layers_{i}")(
            state, xs_i, rope)
        per_layer.append(out)
      layer_outputs = (jax.tree.map(lambda *a: jnp.stack(a), *per_layer) if return_layers
                       else None)
    h = io.readout(state)
    if logits_at is not None:
      h = jnp.take_along_axis(h, logits_at[:, None, None], axis=1)
    if cfg.tie_embeddings:
      logits = embed.attend(h.astype(dtype))
    else:
      logits = nn.DenseGeneral(
          cfg.vocab_size, use_bias=False, dtype=dtype, param_dtype=dtype_of(cfg.param_dtype),
          kernel_init=normal_init(cfg.init_std, "embed", "vocab"),
          dot_general=projection_dot_general, name="lm_head")(h)
    logits = pin(logits.astype(jnp.float32))
    return (logits, layer_outputs) if return_layers else logits

  def _plain_training_stack(self, gate, return_layers) -> bool:
    """A scanned, rematerialised (any policy but 'none') stack of which nothing but the loss
    is asked (no gate, per-layer outputs, sown diagnostics or KV cache): where the buffer
    stacks (``Design.source_buffer``, ``append_buffer``, ``running_buffer``) replace
    ``nn.scan``."""
    cfg = self.cfg
    return (cfg.scan_layers and cfg.remat_policy != "none" and gate is None
            and not return_layers and not self.decode and not self.is_initializing()
            and not self.is_mutable_collection("intermediates"))

  def _run_running_buffer_stack(self, spec, state, rope, pin):
    cfg = self.cfg
    block = Block(cfg)
    layer = lambda p, v, r, l: block.apply({"params": p}, v, r, l, rope,
                                           method=Block.running_layer)
    values, inv_rms = running_stack.running_buffer_stack(
        layer, lambda l: spec.first_slot(cfg, l), nn.unbox(self.variables["params"]["layers"]),
        state["values"], state["inv_rms"], policy=_POLICIES[cfg.remat_policy], pin=pin,
        shared=rope)
    return attnres.written_state(values, inv_rms, cfg.norm_eps)

  def _run_append_buffer_stack(self, spec, state, rope):
    block = Block(self.cfg)
    layer = lambda p, x, buffers, l: block.apply({"params": p}, x, buffers, l, rope,
                                                 method=Block.append_layer)
    params = nn.unbox(self.variables["params"]["layers"])
    x, buffers = append_stack.append_buffer_stack(
        layer, spec.axis, spec.width, params, state["x"], {n: state[n] for n in spec.names},
        policy=_POLICIES[self.cfg.remat_policy], shared=rope)
    return {**state, "x": x, **buffers,
            "presence": spec.presence(self.cfg, jnp.asarray(self.cfg.n_layers))}

  def _run_source_buffer_stack(self, state, rope, pin):
    cfg = self.cfg
    block = Block(cfg)
    branch = lambda p, h, sub: block.apply({"params": p}, h, sub, rope, method=Block.branch)
    query = lambda p, sub: block.apply({"params": p}, sub, method=Block.depth_query)
    params = nn.unbox(self.variables["params"]["layers"])
    values, inv_rms = buffer_stack.source_buffer_stack(
        branch, query, cfg.norm_eps, params, state["values"], state["inv_rms"],
        policy=_POLICIES[cfg.remat_policy], pin=pin, shared=rope)
    return attnres.written_state(values, inv_rms, cfg.norm_eps)


# ---------------------------------------------------------------------------------------------
# Pure helpers over the parameter tree.
# ---------------------------------------------------------------------------------------------

def init_params(cfg: ModelConfig, rng: Array, seq_len: int = 8) -> Any:
  tokens = jnp.zeros((1, seq_len), jnp.int32)
  return Transformer(cfg).init(rng, tokens)["params"]


def abstract_params(cfg: ModelConfig, seq_len: int = 8) -> Any:
  """Param shapes from ``jax.eval_shape`` (no allocation), boxed with logical axis names."""
  tokens = jax.ShapeDtypeStruct((1, seq_len), jnp.int32)
  return jax.eval_shape(lambda t: Transformer(cfg).init(jax.random.PRNGKey(0), t), tokens)[
      "params"]


def count_params(cfg: ModelConfig) -> dict[str, int]:
  """``{'total', 'embedding', 'non_embedding'}`` from the model's own abstract init.

  ``embedding`` counts the input table plus the untied LM head (both scale with the vocabulary).
  """
  params = nn.unbox(abstract_params(cfg))
  size = lambda tree: sum(int(x.size) for x in jax.tree.leaves(tree))
  total = size(params)
  embedding = size(params["embed"]) + (size(params["lm_head"]) if "lm_head" in params else 0)
  return {"total": total, "embedding": embedding, "non_embedding": total - embedding}


def permute_layers(params: Any, order: Array) -> Any:
  """Params whose layer at position p is the original layer ``order[p]`` (stacked layout).

  Everything stacked on the layer axis moves with the layer: attention, MLP and the design's
  per-layer connection params (HC matrices including the one-hot home stream stored at init,
  AttnRes pseudo-queries). Position-dependent constants (LNS's 1/sqrt(l), KEEL's plain first
  layer) stay with the position.
  Pure and vmappable over ``order``.
  """
  if "layers" not in params:
    raise ValueError("permute_layers needs the scanned (stacked) layout: scan_layers=True")
  out = dict(params)
  out["layers"] = jax.tree.map(lambda p: jnp.take(p, order, axis=0), params["layers"])
  return out


def stack_layers(params: Any, n_layers: int) -> Any:
  """Unrolled layout (``layers_0..``) -> scanned layout (``layers`` with a leading L axis)."""
  out = {k: v for k, v in params.items() if not k.startswith("layers_")}
  out["layers"] = jax.tree.map(lambda *a: jnp.stack(a),
                               *[params[f"layers_{i}"] for i in range(n_layers)])
  return out


def unstack_layers(params: Any, n_layers: int) -> Any:
  """Scanned layout -> unrolled layout."""
  out = {k: v for k, v in params.items() if k != "layers"}
  for i in range(n_layers):
    out[f"layers_{i}"] = jax.tree.map(lambda a, i=i: a[i], params["layers"])
  return out
