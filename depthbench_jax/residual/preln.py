"""Pre-LN (GPT-2 / LLaMA): ``x <- x + F(N(x))``; the LM head reads ``N_final(x_L)``."""

from __future__ import annotations

from depthbench_jax.residual.base import Design, LayerWiring, check_fields


class PreLN(LayerWiring):
  """State: one stream ``x`` [B,T,d]. Param names match HF LLaMA's per-layer norms."""

  def setup(self):
    self.input_norm = self.norm("input_layernorm")
    self.post_attention_norm = self.norm("post_attention_layernorm")

  def read(self, x, sub, layer):
    return self.input_norm(x) if sub == 0 else self.post_attention_norm(x)

  def write(self, x, y, sub, layer):
    return x + y


# No fields of its own: a residual override meant for another design is refused, not ignored.
DESIGN = Design(name="preln", layer=PreLN,
                check=lambda residual, n_layers: check_fields(residual, {}),
                description="x <- x + F(N(x))")
