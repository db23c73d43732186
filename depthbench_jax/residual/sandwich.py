"""Sandwich-LN (CogView, Ding et al., 2021; the layout of Gemma-2)."""

from __future__ import annotations

from depthbench_jax.residual.base import Design, LayerWiring, check_fields


class Sandwich(LayerWiring):
  """``x <- x + N_post(F(N_pre(x)))``: four RMSNorms per layer, all gains initialised to 1.

  The LNS repo ships this as ``NORM_TYPE=sandwich``. Param names follow HF Gemma-2, which has
  exactly this layout (there ``post_attention_layernorm`` normalises the attention *output*).
  State ``x`` [B,T,d]; readout: final norm, as Pre-LN.
  """

  def setup(self):
    self.pre_norms = (self.norm("input_layernorm"), self.norm("pre_feedforward_layernorm"))
    self.post_norms = (self.norm("post_attention_layernorm"),
                       self.norm("post_feedforward_layernorm"))

  def read(self, x, sub, layer):
    return self.pre_norms[sub](x)

  def write(self, x, y, sub, layer):
    return x + self.post_norms[sub](y).astype(x.dtype)

  def sublayer(self, x, sub, layer, fn):
    """``read``, ``F``, ``write``, returning ``N_post(y)``: what the sublayer adds to ``x``, so
    the causal score's update is the state change ``h_(t+1) - h_t`` here as in Pre-LN (``y``
    itself would count changes of scale that ``N_post`` removes)."""
    y, x = fn(self.read(x, sub, layer), x)
    z = self.post_norms[sub](y)
    return x + z.astype(x.dtype), z


DESIGN = Design(name="sandwich", layer=Sandwich,
                check=lambda residual, n_layers: check_fields(residual, {}),
                description="x <- x + N_post(F(N_pre(x)))")
