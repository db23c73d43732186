"""DeepNorm (Wang et al., 2022, "DeepNet", arXiv 2203.00555; microsoft/torchscale decoder)."""

from __future__ import annotations

import jax.numpy as jnp

from depthbench_jax.residual.base import Design, InitScales, LayerWiring, StateIO, check_fields


def deepnorm_alpha(n_layers: int) -> float:
  """Decoder-only skip weight ``alpha = (2 N)^(1/4)``, N = number of layers (blocks)."""
  return (2.0 * n_layers) ** 0.25


def deepnorm_beta(n_layers: int) -> float:
  """Decoder-only init gain ``beta = (8 N)^(-1/4)``."""
  return (8.0 * n_layers) ** -0.25


class DeepNorm(LayerWiring):
  """Post-LN with an up-weighted skip: ``x <- N(alpha * x + F(x))``, ``alpha = (2L)^(1/4)``.

  torchscale ``DecoderLayer.residual_connection(x, residual) = residual * alpha + x``, then the
  layer norm (``normalize_before=False``); the branch reads the state itself (no pre-norm).
  Init: the value, output and MLP projections (torchscale ``v_proj``, ``out_proj``, ``fc1``,
  ``fc2``; here SwiGLU's gate/up/down) have their std multiplied by ``beta = (8L)^(-1/4)``
  (``Design.init_scales``), q/k unscaled. L counts layers (blocks): L=32 gives alpha 2.83,
  beta 0.25. RMSNorm replaces torchscale's LayerNorm (the backbone's norm). Readout: the
  Post-LN output goes to the head with no extra final norm, as torchscale does when
  ``decoder_normalize_before`` is off (``PostLNIO``).

  Precision: ``alpha x + y`` is summed in fp32 inside the norm (which reads fp32 anyway, so it
  costs no memory); the state stays in the compute dtype, as Pre-LN's. In bf16 the sum at
  alpha = 3.4 (L=70) was rounded once more before the norm: 1.0% error per update against
  fp32, 0.6% with the fp32 sum (torchscale under fp16 rounds it too; nothing here needs that).
  """

  def setup(self):
    self.post_norms = (self.norm("post_attention_layernorm"),
                       self.norm("post_feedforward_layernorm"))

  def read(self, x, sub, layer):
    return x

  def write(self, x, y, sub, layer):
    alpha = deepnorm_alpha(self.cfg.n_layers)
    return self.post_norms[sub](alpha * x.astype(jnp.float32) + y.astype(jnp.float32)
                                ).astype(x.dtype)


class PostLNIO(StateIO):
  """Readout of a Post-LN state, which is already normalised: the head reads it as is."""

  def setup(self):
    pass

  def readout(self, state):
    return state


def _init_scales(cfg) -> InitScales:
  beta = deepnorm_beta(cfg.n_layers)
  return InitScales(attn_value=beta, attn_out=beta, mlp_in=beta, mlp_out=beta)


DESIGN = Design(name="deepnorm", layer=DeepNorm, io=PostLNIO, init_scales=_init_scales,
                check=lambda residual, n_layers: check_fields(residual, {}),
                description="x <- N((2L)^(1/4) x + F(x)); v/o/MLP init std * (8L)^(-1/4)")
