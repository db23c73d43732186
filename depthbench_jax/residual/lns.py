"""LNS, LayerNorm Scaling (Sun et al., 2025, "The Curse of Depth in LLMs", arXiv 2502.05795)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from depthbench_jax.residual.base import Design, LayerWiring, check_fields


class LNS(LayerWiring):
  """``x <- x + F(N(x) / sqrt(l + 1))`` for both sublayers of 0-based layer ``l``.

  As in the official code (lmsdss/LayerNorm-Scaling ``peft_pretraining/modeling_llama.py``):
  the constant ``1/sqrt(layer_index + 1)`` multiplies the output of ``input_layernorm`` and of
  ``post_attention_layernorm``, the same factor for both sublayers of a layer. It is not a
  parameter; the gains stay learnable (init 1). It depends on the position, so
  ``permute_layers`` leaves it with the position. Layer 0 is exactly Pre-LN. State ``x``
  [B,T,d]; readout: final norm, as Pre-LN.
  """

  def setup(self):
    self.input_norm = self.norm("input_layernorm")
    self.post_attention_norm = self.norm("post_attention_layernorm")

  def read(self, x, sub, layer):
    u = self.input_norm(x) if sub == 0 else self.post_attention_norm(x)
    return (u * jax.lax.rsqrt(jnp.asarray(layer, jnp.float32) + 1.0)).astype(u.dtype)

  def write(self, x, y, sub, layer):
    return x + y


DESIGN = Design(name="lns", layer=LNS, check=lambda residual, n_layers: check_fields(residual, {}),
                description="x <- x + F(N(x) / sqrt(l)), l the 1-based layer index")
