"""HC, Hyper-Connections (Zhu et al., ICLR 2025, arXiv 2409.19606), dynamic ("DHC") by default.

State: ``H`` [B, T, n, d], n residual streams (``n_streams``, 4). Streams start as n copies of
the embedding; the readout sums them, then the final norm (HC Algorithm 1). ``StreamIO`` and the
stream helpers here are shared with mHC (``residual/mhc.py``).
"""

from __future__ import annotations

import functools
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from depthbench_jax.model.matmul import PROJECTION, weight_gradient
from depthbench_jax.residual.base import Design, LayerWiring, StateIO, check_fields
from depthbench_jax.residual.streams import (collapse_streams, copy_streams, stream_update,
                                             sum_streams)

Array = jax.Array


def home_stream(k: Array, n: int) -> Array:
  """``e_(k mod n)`` [n], the one-hot stream sublayer ``k = 2*layer + sub`` reads at init."""
  return jax.nn.one_hot(jnp.asarray(k) % n, n, dtype=jnp.float32)


def normed_projection(h: Array, w: Array, gain: Array | None, eps: float) -> Array:
  """``N(H_i) W`` per stream: h [B,T,n,d], w [d,e], gain [d] or None -> [B,T,n,e] (fp32).

  Computed as ``rsqrt(mean_d H_i^2 + eps) * (H_i (g * W))``: the gain folds into ``W`` and the
  per-token scale is applied after the matmul, so the normalised copy of the streams is never
  written (a pass over ``n d`` per token saved forward and backward; same value).
  """
  w = w if gain is None else gain[:, None] * w
  return checkpoint_name(rms_projection(h, w, eps), PROJECTION)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def rms_projection(h: Array, w: Array, eps: float) -> Array:
  """``p = r (h W)`` with ``r = rsqrt(mean_d h^2 + eps)``: h [...,d], w [d,e] -> [...,e] fp32.

  VJP for a cotangent ``g``, with ``z = h W``:
    ``dh = sum_e (r g_e) W[:, e] - (sum_e g_e z_e) r^3 h / d``,   ``dW = h^T (r g)``.
  ``dh`` is written as ``e`` broadcast multiply-adds, an elementwise expression, so XLA fuses
  it into the sum of the streams' other cotangents; as autodiff's ``g W^T`` it was a GEMM
  writing an fp32 [B,T,n,d] that the sum read back (on an H200 at 16x1216: 1.2 ms of the step
  per sublayer kind, plus the read). ``dW`` is one GEMM contracting the streams and tokens as
  axes, in ``weight_gradient``'s narrow-output form (a batch-sharded ``B`` stays sharded).
  """
  return _rms_projection_fwd(h, w, eps)[0]


def _rms_projection_fwd(h, w, eps):
  h32 = h.astype(jnp.float32)
  inv_rms = jax.lax.rsqrt(jnp.mean(h32 * h32, axis=-1, keepdims=True) + eps)
  z = jax.lax.dot_general(h32, w.astype(jnp.float32), (((h.ndim - 1,), (0,)), ((), ())))
  return z * inv_rms, (h, w, inv_rms, z)


def _rms_projection_bwd(eps, res, g):
  h, w, inv_rms, z = res
  h32, w32 = h.astype(jnp.float32), w.astype(jnp.float32)
  g_z = g * inv_rms
  dh = (-jnp.sum(g * z, axis=-1, keepdims=True) * inv_rms ** 3 / h.shape[-1]) * h32
  for e in range(w.shape[1]):
    dh = dh + g_z[..., e:e + 1] * w32[:, e]
  dw = weight_gradient(h32, g_z)
  return dh.astype(h.dtype), dw.astype(w.dtype)


rms_projection.defvjp(_rms_projection_fwd, _rms_projection_bwd)


def _param(module: nn.Module, name: str, init, *args, axes=None):
  """A float32 connection parameter, boxed with logical axis names (all replicated by default)."""
  def boxed_init(rng, *a):
    value = init(rng, *a)
    return nn.LogicallyPartitioned(value, axes or (None,) * value.ndim)
  return nn.unbox(module.param(name, boxed_init, *args))


def constant(value):
  return lambda rng, shape: jnp.full(shape, value, jnp.float32)


class NormGain(nn.Module):
  """The learned gain ``g`` [d] of an RMSNorm (param ``scale``, init 1), for a caller that folds
  it into the next matmul (``normed_projection``); named like the RMSNorm it stands for."""

  @nn.compact
  def __call__(self, d: int) -> Array:
    return _param(self, "scale", lambda rng, shape: jnp.ones(shape, jnp.float32), (d,),
                  axes=("norm",))


class HyperConnection(nn.Module):
  """One sublayer's HC weights from the streams ``H`` [B,T,n,d] (HC Eq. 10-13).

  ``H_bar = N(H)`` per stream over d (RMSNorm with learned gain, as the reference code
  ``lucidrains/hyper-connections``; the paper's Algorithm 2 has LayerNorm). Each stream's
  weights come from its own d-vector:
    ``[A_m | A_r](H) = s_alpha * tanh(H_bar W_alpha) + [A_m | A_r]``   [n, 1+n], row = source i
    ``B(H)          = s_beta  * tanh(H_bar W_beta)  + B``              [n]
  One scale ``s_alpha`` shared by A_m and A_r, one ``s_beta``; both init 0.01, ``W`` init 0
  (so the dynamic part starts at exactly zero). ``tanh=False`` drops the tanh,
  ``dynamic=False`` gives static HC (no norm, W or s). ``W_alpha`` and ``W_beta`` run as one
  [d, n+2] matmul (``normed_projection``).

  Static init (HC Eq. 14): ``A_m = e_(k mod n)`` with ``k = 2*layer + sub`` the global sublayer
  index, ``A_r = I``, ``B = 1``. Under ``nn.scan`` the layer index is a traced scan input, so
  ``static_alpha``'s init function takes ``k`` as an init argument: the one-hot is computed from
  the traced index once, at init, and stored in the param. It is therefore an ordinary
  per-layer parameter that moves with its layer under ``permute_layers`` (spec section 6.3).
  Weight decay, HC Sec. 4 "Implementation": "The static component in Eqs. 1, 11, 12, 13 does not
  utilize weight decay, whereas the dynamic component does." ``static_*`` get none. Of the
  dynamic component ``s * tanh(N(H) W)`` we decay ``W`` (``Design.decayed``) but not the scales
  ``s`` nor the norm gain: the paper names no parameter (Sec. 2.3 calls only ``W_beta, W_m,
  W_r`` "the dynamic parameters"), so ``s`` is treated like every other scalar gain here
  (``train/optimizer.py`` decays the projections, the embedding and ``Design.decayed`` only).
  Our reading, not a stated rule.

  Returns ``a_m`` [B,T,n], ``a_r`` [B,T,n,n] (``a_r[i, j]`` = source i -> stream j) and
  ``b`` [B,T,n].
  """

  n: int
  dynamic: bool = True
  tanh: bool = True
  eps: float = 1e-6

  @nn.compact
  def __call__(self, h: Array, k: Array):
    n, d = self.n, h.shape[-1]
    batch_shape = h.shape[0:2]

    def static_alpha_init(rng, k):
      return jnp.concatenate([home_stream(k, n)[:, None], jnp.eye(n, dtype=jnp.float32)], axis=1)

    alpha = _param(self, "static_alpha", static_alpha_init, k)                       # [n, 1+n]
    beta = _param(self, "static_beta", constant(1.0), (n,))                          # [n]
    alpha = jnp.broadcast_to(alpha, (*batch_shape, n, n + 1))
    beta = jnp.broadcast_to(beta, (*batch_shape, n))
    if self.dynamic:
      act = jnp.tanh if self.tanh else (lambda v: v)
      w_alpha = _param(self, "dynamic_alpha", constant(0.0), (d, n + 1), axes=("embed", None))
      w_beta = _param(self, "dynamic_beta", constant(0.0), (d,), axes=("embed",))
      s_alpha = _param(self, "dynamic_alpha_scale", constant(0.01), ())
      s_beta = _param(self, "dynamic_beta_scale", constant(0.01), ())
      w = jnp.concatenate([w_alpha, w_beta[:, None]], axis=1)                        # [d, n+2]
      proj = act(normed_projection(h, w, NormGain(name="norm")(d), self.eps))        # [B,T,n,n+2]
      alpha = alpha + s_alpha * proj[..., :-1]
      beta = beta + s_beta * proj[..., -1]
    return alpha[..., 0], alpha[..., 1:], beta


class StreamWiring(LayerWiring):
  """The wiring HC and mHC share: ``H <- M H + w_out^T F(N(w_in^T H))`` per sublayer.

  Subclasses give ``maps(h, sub, layer) -> (w_in [B,T,n], M [B,T,n,n], w_out [B,T,n])`` with
  ``M`` row j = new stream j, and ``setup`` the two connection modules. The maps are computed
  once per sublayer in ``sublayer`` (``read``/``write`` alone each compute them). Sows
  ``mixing`` = ``M`` once per sublayer; ``hidden`` = sum of streams.
  """

  hidden_state: ClassVar[str] = ("the sum of the n streams (residual-equivalent), not a "
                                 "layer's own read w_in^T H")

  def setup(self):
    self.input_norm = self.norm("input_layernorm")
    self.post_attention_norm = self.norm("post_attention_layernorm")

  def maps(self, h: Array, sub: int, layer: Array) -> tuple[Array, Array, Array]:
    raise NotImplementedError

  def _input(self, h, w_in, sub):
    x = collapse_streams(w_in, h)
    return self.input_norm(x) if sub == 0 else self.post_attention_norm(x)

  def _output(self, h, y, m, w_out):
    self.sow("intermediates", "mixing", m)
    return stream_update(m, h, w_out, y)

  def read(self, h, sub, layer):
    w_in, _, _ = self.maps(h, sub, layer)
    return self._input(h, w_in, sub)

  def write(self, h, y, sub, layer):
    _, m, w_out = self.maps(h, sub, layer)
    return self._output(h, y, m, w_out)

  def sublayer(self, h, sub, layer, fn):
    w_in, m, w_out = self.maps(h, sub, layer)
    y, h = fn(self._input(h, w_in, sub), h)
    return self._output(h, y, m, w_out), y

  def hidden(self, h):
    return sum_streams(h)


class HC(StreamWiring):
  """Per sublayer ``k = 2*layer + sub`` (HC Eq. 2-5):

    ``u = N(A_m^T H)``  (the block's own pre-norm after the width connection, Algorithm 3)
    ``y = F(u)``;   ``H_j <- sum_i A_r[i, j] H_i + B[j] y``, i.e. ``H <- A_r^T H + B^T y``.

  At init (W = 0, A_m one-hot, A_r = I, B = 1) every stream stays equal to the Pre-LN state, so
  the sum readout is ``n x_L`` and the model equals Pre-LN after the final norm (up to eps).
  Sows ``mixing`` = ``A_r^T`` [B,T,n,n] once per sublayer. The output projections are *not*
  rescaled by sqrt(n) as in the paper's OLMo recipe: a departure, not a no-op. The final norm
  removes one overall scale, not the ratio of the sublayer updates to the embedding, which
  sqrt(n) would change; unscaled, HC equals Pre-LN at init with identical backbone weights.
  ``hidden`` = sum of streams.
  """

  def setup(self):
    super().setup()
    res = self.cfg.residual
    make = lambda name: HyperConnection(
        res["n_streams"], dynamic=res["dynamic"], tanh=res["tanh"], eps=self.cfg.norm_eps,
        name=name)
    self.connections = (make("hc_attn"), make("hc_mlp"))

  def maps(self, h, sub, layer):
    a_m, a_r, b = self.connections[sub](h, 2 * jnp.asarray(layer) + sub)
    return a_m, jnp.swapaxes(a_r, -1, -2), b


class StreamIO(StateIO):
  """``H_0`` = n copies of the embedding [B,T,n,d]; readout ``N_final(sum_i H_i)``."""

  def init_state(self, x0):
    n = self.cfg.residual["n_streams"]
    return copy_streams(x0, n)

  def readout(self, h):
    return self.final_norm(sum_streams(h))


def _is_int(v, low=1):
  return isinstance(v, int) and not isinstance(v, bool) and v >= low


def _check(residual, n_layers):
  check_fields(residual, {
      "n_streams": (_is_int, "a positive integer (the paper's best is 4)"),
      "dynamic": (lambda v: isinstance(v, bool), "True (DHC) or False (static HC)"),
      "tanh": (lambda v: isinstance(v, bool), "True or False"),
  })


DESIGN = Design(name="hc", layer=HC, io=StreamIO, check=_check,
                defaults={"n_streams": 4, "dynamic": True, "tanh": True},
                decayed=("dynamic_alpha", "dynamic_beta"),
                description="H <- A_r^T H + B^T F(N(A_m^T H)), n streams, dynamic tanh weights")
