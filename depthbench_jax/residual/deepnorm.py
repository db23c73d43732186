"""DeepNorm (Wang et al., 2022, "DeepNet", arXiv 2203.00555; microsoft/torchscale decoder)."""

from __future__ import annotations

import jax.numpy as jnp

from depthbench_jax.model.layers import dtype_of
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

  Precision: the state is fp32 whatever ``config.model.dtype`` (``PostLNIO``), and
  ``alpha x + y`` and the post-norm run in fp32. The state has unit RMS and a sublayer moves it
  by ``~y / alpha`` with ``y`` beta-scaled at init, so in a bf16 state the rounding is a large
  part of each update: at 4 layers with init std 0.1, bf16 vs fp32 compute, 12.5% error per
  layer update (8.6% with the sum in fp32; Pre-LN 1.3%; with this fp32 state 0.6%). torchscale
  trains it in fp16, 8x finer than bf16. Same choice and cost as KEEL (``residual/keel.py``).
  """

  def setup(self):
    self.post_norms = (self.norm("post_attention_layernorm", dtype=jnp.float32),
                       self.norm("post_feedforward_layernorm", dtype=jnp.float32))

  def read(self, x, sub, layer):
    return x.astype(dtype_of(self.cfg.dtype))

  def write(self, x, y, sub, layer):
    alpha = deepnorm_alpha(self.cfg.n_layers)
    return self.post_norms[sub](alpha * x.astype(jnp.float32) + y.astype(jnp.float32)
                                ).astype(x.dtype)


class PostLNIO(StateIO):
  """A Post-LN state: the embedding in fp32 (see ``DeepNorm``); the readout is the state as is,
  already normalised (the head casts it to the compute dtype)."""

  def setup(self):
    pass

  def init_state(self, x0):
    return x0.astype(jnp.float32)

  def readout(self, state):
    return state


def _init_scales(cfg) -> InitScales:
  beta = deepnorm_beta(cfg.n_layers)
  return InitScales(attn_value=beta, attn_out=beta, mlp_in=beta, mlp_out=beta)


DESIGN = Design(name="deepnorm", layer=DeepNorm, io=PostLNIO, init_scales=_init_scales,
                check=lambda residual, n_layers: check_fields(residual, {}),
                description="x <- N((2L)^(1/4) x + F(x)); v/o/MLP init std * (8L)^(-1/4)")
