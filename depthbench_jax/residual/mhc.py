"""mHC, Manifold-Constrained Hyper-Connections (Xie et al., DeepSeek-AI, arXiv 2512.24880).

Same state and ends as HC (``H`` [B,T,n,d], n copies in, stream sum + final norm out: the paper
does not state a readout, this is HC's and the reference code's). The stream-mixing matrix is
projected onto the doubly stochastic matrices and the read/write maps are non-negative.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from depthbench_jax.errors import ConfigError
from depthbench_jax.model.matmul import projection_dot_general
from depthbench_jax.residual.base import Design, check_fields, sinkhorn_knopp
from depthbench_jax.residual.hc import (StreamIO, StreamWiring, _is_int, _param, constant,
                                         home_stream)
from depthbench_jax.residual.sinkhorn_kernel import sinkhorn_pallas

Array = jax.Array

RES_INITS = ("identity", "uniform")
SINKHORN_KERNELS = ("xla", "pallas")   # base.sinkhorn_knopp, or sinkhorn_kernel.py (GPUs)
# Static logits of the identity-like start: +3/-3 on the read map, 6I - 3 on the mixing logits.
# Our choice, not the paper's: mHC (arXiv 2512.24880v2) gives no init for b_pre, b_post, b_res or
# phi. Its only appendix, A.1 (Table 5), gives n = 4, "Gating Factor Init alpha 0.01" and
# "Sinkhorn-Knopp t_max 20"; Sec. 3 says only "gating factors initialized to small values". There
# is no A.6, so the "paper A.6 static values" a third-party Megatron/PaddleFleet port cites have
# no source there. DeepSeek's released code (DeepSeek-V4 model.py, deepseek-ai/TileKernels) is
# inference / kernels only and sets no init either.
PRE_LOGIT = 3.0
RES_DIAG_LOGIT = 6.0


def static_logits(k: Array, n: int, res_init: str) -> tuple[Array, Array, Array]:
  """Init of ``b_pre`` [n], ``b_post`` [n] and ``b_res`` [n,n] for sublayer ``k``.

  ``b_pre = 3 (2 e_(k mod n) - 1)``: ``H_pre = sigmoid(b_pre)`` = 0.953 on the home stream,
  0.047 elsewhere (HC's one-hot ``A_m``, softened). ``b_post = 0``: ``H_post = 2 sigmoid(0) = 1``
  (HC's ``B = 1``). ``b_res``: 'identity' ``6 I - 3`` -> Sinkhorn diagonal 0.9926 (HC's
  ``A_r = I``, softened); 'uniform' ``0`` -> ``H_res = 11^T / n`` from the start.
  """
  b_pre = PRE_LOGIT * (2.0 * home_stream(k, n) - 1.0)
  b_post = jnp.zeros((n,), jnp.float32)
  if res_init == "identity":
    b_res = RES_DIAG_LOGIT * jnp.eye(n, dtype=jnp.float32) - RES_DIAG_LOGIT / 2
  else:
    b_res = jnp.zeros((n, n), jnp.float32)
  return b_pre, b_post, b_res


class ManifoldConnection(nn.Module):
  """One sublayer's mHC maps from the streams ``H`` [B,T,n,d] (mHC Eq. 7-9).

    ``x' = N0(vec(H))``  over all n*d entries of a token, gain-free (the paper absorbs the norm
    weight into phi; one statistic per token, as the DeepSeek code), stream-major order.
    ``H_pre  = sigmoid(a_pre * x' phi_pre + b_pre)``          [n]     in (0, 1)
    ``H_post = 2 sigmoid(a_post * x' phi_post + b_post)``     [n]     in (0, 2)
    ``H_res  = SK(a_res * mat(x' phi_res) + b_res)``           [n, n]  doubly stochastic

  ``phi = [phi_pre | phi_post | phi_res]`` [n*d, 2n + n^2] init 0 (the paper gives no init; zero
  makes the dynamic part start at exactly zero, as HC's W; weight-decayed like HC's dynamic
  projections, the paper's wd 0.1 named per parameter nowhere). Gates ``a_*`` init 0.01 (App. A.1
  Table 5); no tanh. ``mat`` is row-major: ``H_res[j, i]`` is the weight of stream i in new
  stream j. SK = Sinkhorn-Knopp on ``exp``, columns then rows, ``sinkhorn_iters`` rounds, fp32
  (``base.sinkhorn_knopp``): rows sum to 1 exactly, columns to the method's convergence.
  Static logits: ``static_logits``. Returns pre [B,T,n], res [B,T,n,n], post [B,T,n].
  ``sinkhorn_kernel='pallas'`` runs SK as one Pallas kernel each way (``sinkhorn_kernel.py``,
  same math; for GPUs, not yet timed on one).
  """

  n: int
  sinkhorn_iters: int = 20
  res_init: str = "identity"
  sinkhorn_kernel: str = "xla"
  eps: float = 1e-6

  @nn.compact
  def __call__(self, h: Array, k: Array):
    n, d = self.n, h.shape[-1]
    b_pre = _param(self, "b_pre", lambda rng, k: static_logits(k, n, self.res_init)[0], k)
    b_post = _param(self, "b_post", lambda rng, k: static_logits(k, n, self.res_init)[1], k)
    b_res = _param(self, "b_res", lambda rng, k: static_logits(k, n, self.res_init)[2], k)
    phi = _param(self, "phi", constant(0.0), (n * d, 2 * n + n * n), axes=("embed", None))
    a_pre = _param(self, "alpha_pre", constant(0.01), ())
    a_post = _param(self, "alpha_post", constant(0.01), ())
    a_res = _param(self, "alpha_res", constant(0.01), ())

    # x' phi with x' = N0(vec(H)): a token's [n, d] block is contiguous, so vec(H) is a free
    # reshape (stream-major, as phi's rows) and the one per-token rsqrt is applied after the
    # matmul (no normalised copy of H).
    h32 = h.astype(jnp.float32)
    inv_rms = jax.lax.rsqrt(jnp.mean(h32 * h32, axis=(-2, -1)) + self.eps)[..., None]  # [B,T,1]
    vec_h = h32.reshape(*h.shape[:-2], n * d)
    proj = projection_dot_general(vec_h, phi, (((2,), (0,)), ((), ()))) * inv_rms
    pre = jax.nn.sigmoid(a_pre * proj[..., :n] + b_pre)
    post = 2.0 * jax.nn.sigmoid(a_post * proj[..., n:2 * n] + b_post)
    res_logits = a_res * proj[..., 2 * n:].reshape(*proj.shape[:-1], n, n) + b_res
    sinkhorn = sinkhorn_pallas if self.sinkhorn_kernel == "pallas" else sinkhorn_knopp
    return pre, sinkhorn(res_logits, self.sinkhorn_iters), post


class MHC(StreamWiring):
  """Per sublayer ``k = 2*layer + sub`` (mHC Eq. 3):

    ``u = N(H_pre H)``  (the block's own RMSNorm after the read map), ``y = F(u)``
    ``H <- H_res H + H_post^T y``, i.e. ``H_j <- sum_i H_res[j, i] H_i + H_post[j] y``.

  At init the streams are equal copies and ``H_res`` rows sum to 1, so every stream stays the
  Pre-LN state whatever ``res_init`` is, and the model equals Pre-LN (the read map's sum 1.095
  is removed by the block norm). ``res_init`` matters for training and for the effective-rank
  diagnostic: 'identity' (default, mirrors HC's ``A_r = I``) starts the product of mixing
  matrices near rank n, 'uniform' at rank 1. Caveat of 'identity': near a permutation matrix
  Sinkhorn contracts by only ~0.98 per round, so once the logits move off the symmetric init
  (noise 0.1) 20 rounds leave column sums off by ~1e-3 (rows stay exact); the paper's 20 rounds
  share this (its composite gain is ~1.6, not 1). 'uniform' and moderate logits converge to
  1e-7. Sows ``mixing`` = ``H_res`` [B,T,n,n] once per
  sublayer. ``hidden`` = sum of streams.

  Differences from the reference code (``hyper_connections.ManifoldConstrainedHyperConnections``
  0.4.11), where we follow the paper: (1) it computes each stream's logits from that stream's own
  per-stream-RMSNormed d-vector with a shared d x (n+1) projection; the paper flattens the n*d
  state (``phi`` here; the reference is the block-diagonal special case, equal when all streams
  have the same RMS); (2) its matrix is ``A = H_res^T`` and its Sinkhorn normalises
  ``A``'s rows (its last axis) last, i.e. ``H_res``'s columns last, where Eq. 9 ends on rows
  (equal in the limit, not bit-equal after 20 rounds); (3) its init is ``b_pre = e_k``,
  ``b_res = I``, ``b_post = 1`` (``H_res`` diagonal 0.475, ``H_post`` 1.46).
  ``tests/residual/test_hc_parity.py`` checks the exact relation.
  """

  def setup(self):
    super().setup()
    res = self.cfg.residual
    make = lambda name: ManifoldConnection(
        res["n_streams"], sinkhorn_iters=res["sinkhorn_iters"], res_init=res["res_init"],
        sinkhorn_kernel=res["sinkhorn_kernel"], eps=self.cfg.norm_eps, name=name)
    self.connections = (make("mhc_attn"), make("mhc_mlp"))

  def maps(self, h, sub, layer):
    return self.connections[sub](h, 2 * jnp.asarray(layer) + sub)


def _check(residual, n_layers):
  check_fields(residual, {
      "n_streams": (_is_int, "a positive integer (the paper uses 4)"),
      "sinkhorn_iters": (_is_int, "a positive integer (the paper uses 20)"),
      "res_init": (lambda v: v in RES_INITS, ", ".join(RES_INITS)),
      "sinkhorn_kernel": (lambda v: v in SINKHORN_KERNELS, ", ".join(SINKHORN_KERNELS)),
  })
  n = residual["n_streams"]
  if residual["sinkhorn_kernel"] == "pallas" and n & (n - 1):
    raise ConfigError(f"config.model.residual.n_streams={n} with sinkhorn_kernel='pallas'; "
                      "allowed: a power of two (Triton's block shapes), or sinkhorn_kernel='xla'")


DESIGN = Design(name="mhc", layer=MHC, io=StreamIO, check=_check,
                defaults={"n_streams": 4, "sinkhorn_iters": 20, "res_init": "identity",
                          "sinkhorn_kernel": "xla"},
                implementation_options=("sinkhorn_kernel",),
                decayed=("phi",),
                description="H <- SK(.) H + 2sig(.)^T F(N(sig(.) H)), dynamic from vec(H)")
