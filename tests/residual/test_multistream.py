"""HC and mHC: update equations by hand (d=4, n=2), invariants, the shared checks."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from depthbench_jax.errors import ConfigError
from depthbench_jax.model.transformer import Transformer, permute_layers
from depthbench_jax.residual import registry
from depthbench_jax.residual.base import sinkhorn_knopp
from depthbench_jax.residual.hc import home_stream
from depthbench_jax.residual.mhc import static_logits
from residual_testkit import (init, jit, perturb, rms, run, shared_checks_test, text_batch,
                              tiny_cfg, transplant, wiring_call)

DESIGNS = ("hc", "mhc")
EPS = 1e-6
RNG = np.random.RandomState(0)
H = RNG.standard_normal((1, 3, 2, 4)).astype(np.float32)     # [B=1, T=3, n=2, d=4]
Y = RNG.standard_normal((1, 3, 4)).astype(np.float32)
G_IN = np.array([1.0, 0.5, 2.0, 1.5], np.float32)


def small(name, **residual):
  return tiny_cfg(name, d_model=4, n_heads=2, residual={"n_streams": 2, **residual})


def sigmoid(v):
  return 1.0 / (1.0 + np.exp(-v))


# ----- update equations on a hand-computed case ----------------------------------------------

def hc_reference(p, h, y, g_in, use_tanh=True):
  """HC Eq. 10-13 written out stream by stream (numpy, float64); h [B,T,n,d], h[i] stream i."""
  act = np.tanh if use_tanh else (lambda v: v)
  n = h.shape[-2]
  h = np.moveaxis(h.astype(np.float64), -2, 0)
  h_bar = [h[i] / rms(h[i]) * p["norm"]["scale"] for i in range(n)]
  alpha = [p["static_alpha"][i] + p["dynamic_alpha_scale"] * act(h_bar[i] @ p["dynamic_alpha"])
           for i in range(n)]                                   # each [B,T,1+n]
  beta = [p["static_beta"][i] + p["dynamic_beta_scale"] * act(h_bar[i] @ p["dynamic_beta"])
          for i in range(n)]                                    # each [B,T]
  x = sum(alpha[i][..., 0:1] * h[i] for i in range(n))
  u = x / rms(x) * g_in
  new = np.stack([sum(alpha[i][..., 1 + j:2 + j] * h[i] for i in range(n)) + beta[j][..., None] * y
                  for j in range(n)], -2)
  mixing = np.stack([np.stack([alpha[i][..., 1 + j] for i in range(n)], -1) for j in range(n)], -2)
  return u, new, mixing


def random_hc_params(n=2, d=4, seed=0):
  rng = np.random.RandomState(seed)
  f = lambda *shape: rng.standard_normal(shape).astype(np.float32)
  return {"static_alpha": f(n, n + 1), "static_beta": f(n), "dynamic_alpha": f(d, n + 1),
          "dynamic_beta": f(d), "dynamic_alpha_scale": np.float32(0.7),
          "dynamic_beta_scale": np.float32(-0.4), "norm": {"scale": 1 + 0.3 * f(d)}}


def assert_sublayer_is_read_then_write(cfg, params, sub, layer, u_ref, new_ref, mixing_ref):
  """What the model runs: the wiring's own ``sublayer`` (the maps computed once), not ``read``
  and ``write``. The branch reads ``u_ref`` and the streams become ``new_ref``; random,
  non-symmetric maps, where init's symmetric M and equal streams hid a transposed M or a read
  through the write map."""
  seen = []
  (new, y), sown = wiring_call(cfg, params, "sublayer", H, sub, jnp.int32(layer),
                               lambda u, h: (seen.append(u) or jnp.asarray(Y), h))
  np.testing.assert_allclose(seen[-1], u_ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(new, new_ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(y, Y)
  (mixing,) = sown["intermediates"]["mixing"]
  np.testing.assert_allclose(mixing, mixing_ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("use_tanh", [True, False])
def test_hc_update_by_hand(use_tanh):
  cfg = small("hc", tanh=use_tanh)
  conn = random_hc_params()
  params = {"hc_mlp": conn, "post_attention_layernorm": {"scale": G_IN}}
  u_ref, new_ref, mixing_ref = hc_reference(conn, H, Y, G_IN, use_tanh)
  u, _ = wiring_call(cfg, params, "read", H, 1, jnp.int32(1))
  new, sown = wiring_call(cfg, params, "write", H, Y, 1, jnp.int32(1))
  np.testing.assert_allclose(u, u_ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(new, new_ref, rtol=1e-5, atol=1e-6)
  (mixing,) = sown["intermediates"]["mixing"]
  np.testing.assert_allclose(mixing, mixing_ref, rtol=1e-5, atol=1e-6)   # M = A_r^T
  assert mixing.shape == (1, 3, 2, 2)
  assert_sublayer_is_read_then_write(cfg, params, 1, 1, u_ref, new_ref, mixing_ref)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_hc_rms_projection_value_and_vjp_match_autodiff(dtype):
  """hc.rms_projection's hand-written VJP (``dh`` as e multiply-adds, the 1/RMS term, ``dW``)
  against autodiff of ``rsqrt(mean h^2 + eps) (h W)``; with bf16 streams the cotangent keeps
  the streams' dtype."""
  from depthbench_jax.residual.hc import rms_projection
  keys = jax.random.split(jax.random.PRNGKey(3), 3)
  h = (3.0 * jax.random.normal(keys[0], (2, 5, 4, 16))).astype(dtype)           # [B,T,n,d]
  w = jax.random.normal(keys[1], (16, 6))
  g = jax.random.normal(keys[2], (2, 5, 4, 6))

  def reference(h, w):
    h32 = h.astype(jnp.float32)
    return jax.lax.rsqrt(jnp.mean(h32 ** 2, -1, keepdims=True) + 1e-6) * (h32 @ w)
  want, vjp = jax.vjp(reference, h, w)
  got, got_vjp = jax.vjp(lambda h, w: rms_projection(h, w, 1e-6), h, w)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  (want_h, want_w), (got_h, got_w) = vjp(g), got_vjp(g)
  assert got_h.dtype == dtype
  tol = 1e-5 if dtype == jnp.float32 else 1e-2
  np.testing.assert_allclose(np.float32(got_h), np.float32(want_h), rtol=tol, atol=tol)
  np.testing.assert_allclose(got_w, want_w, rtol=1e-4, atol=1e-4)


def test_static_hc_has_no_dynamic_part():
  cfg = small("hc", dynamic=False)
  conn = {k: v for k, v in random_hc_params().items() if k.startswith("static")}
  params = {"hc_attn": conn, "input_layernorm": {"scale": G_IN}}
  zero = dict(random_hc_params(), dynamic_alpha_scale=np.float32(0),
              dynamic_beta_scale=np.float32(0))
  zero.update(conn)
  u_ref, new_ref, _ = hc_reference(zero, H, Y, G_IN)
  u, _ = wiring_call(cfg, params, "read", H, 0, jnp.int32(0))
  new, _ = wiring_call(cfg, params, "write", H, Y, 0, jnp.int32(0))
  np.testing.assert_allclose(u, u_ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(new, new_ref, rtol=1e-5, atol=1e-6)


def sinkhorn_reference(logits, iterations):
  """``exp`` then ``iterations`` x (normalise columns, then rows), entry by entry."""
  m = np.exp(np.asarray(logits, np.float64))
  for _ in range(iterations):
    m = m / m.sum(axis=-2, keepdims=True)
    m = m / m.sum(axis=-1, keepdims=True)
  return m


def mhc_reference(p, h, y, g_in, iterations):
  """mHC Eq. 3, 7-9 for n=2 written out (numpy, float64); h [B,T,n,d], h[i] stream i."""
  n = h.shape[-2]
  h = np.moveaxis(h.astype(np.float64), -2, 0)
  flat = np.concatenate([h[0], h[1]], axis=-1)                  # vec(H): stream-major [B,T,n*d]
  proj = (flat / rms(flat)) @ p["phi"]                           # [B,T, 2n + n^2]
  pre = sigmoid(p["alpha_pre"] * proj[..., 0:2] + p["b_pre"])
  post = 2 * sigmoid(p["alpha_post"] * proj[..., 2:4] + p["b_post"])
  logits = p["alpha_res"] * proj[..., 4:8].reshape(*proj.shape[:-1], 2, 2) + p["b_res"]
  res = sinkhorn_reference(logits, iterations)
  x = pre[..., 0:1] * h[0] + pre[..., 1:2] * h[1]
  u = x / rms(x) * g_in
  new = np.stack([res[..., j, 0:1] * h[0] + res[..., j, 1:2] * h[1] + post[..., j:j + 1] * y
                  for j in range(n)], -2)
  return u, new, res


def random_mhc_params(n=2, d=4, seed=0):
  rng = np.random.RandomState(seed)
  f = lambda *shape: rng.standard_normal(shape).astype(np.float32)
  return {"b_pre": f(n), "b_post": f(n), "b_res": f(n, n), "phi": f(n * d, 2 * n + n * n),
          "alpha_pre": np.float32(0.5), "alpha_post": np.float32(-0.3),
          "alpha_res": np.float32(0.8)}


def test_mhc_update_by_hand():
  cfg = small("mhc", sinkhorn_iters=7)
  conn = random_mhc_params()
  params = {"mhc_attn": conn, "input_layernorm": {"scale": G_IN}}
  u_ref, new_ref, res_ref = mhc_reference(conn, H, Y, G_IN, 7)
  u, _ = wiring_call(cfg, params, "read", H, 0, jnp.int32(0))
  new, sown = wiring_call(cfg, params, "write", H, Y, 0, jnp.int32(0))
  np.testing.assert_allclose(u, u_ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(new, new_ref, rtol=1e-5, atol=1e-6)
  (mixing,) = sown["intermediates"]["mixing"]
  np.testing.assert_allclose(mixing, res_ref, rtol=1e-5, atol=1e-6)      # M = H_res
  assert_sublayer_is_read_then_write(cfg, params, 0, 0, u_ref, new_ref, res_ref)


def test_sinkhorn_matches_reference_and_is_doubly_stochastic():
  logits = np.random.RandomState(1).standard_normal((64, 4, 4)).astype(np.float32) * 0.5
  m = np.asarray(sinkhorn_knopp(jnp.asarray(logits), 20))
  np.testing.assert_allclose(m, sinkhorn_reference(logits, 20), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(m.sum(-1), 1, atol=1e-6)           # rows: normalised last
  np.testing.assert_allclose(m.sum(-2), 1, atol=1e-5)           # columns: to convergence
  assert (m >= 0).all()


def test_sinkhorn_converges_slowly_near_the_identity():
  """The documented caveat of the identity-like start (mhc.py): near a permutation matrix the
  contraction per round is ~lambda_2^2 ~ 0.98, so 20 rounds leave column sums off by ~1e-3 for
  logit noise 0.1 around ``6I - 3``, while rows stay exact; the symmetric init itself is exact."""
  noise = np.random.RandomState(1).standard_normal((256, 4, 4)).astype(np.float32) * 0.1
  b_res = static_logits(jnp.int32(0), 4, "identity")[2]
  exact = np.asarray(sinkhorn_knopp(b_res, 20))
  np.testing.assert_allclose(exact.sum(-2), 1, atol=1e-6)
  m = np.asarray(sinkhorn_knopp(b_res + noise, 20))
  np.testing.assert_allclose(m.sum(-1), 1, atol=1e-6)
  column_error = np.abs(m.sum(-2) - 1).max()
  assert 1e-5 < column_error < 5e-3, column_error
  longer = np.abs(np.asarray(sinkhorn_knopp(b_res + noise, 200)).sum(-2) - 1).max()
  assert longer < column_error / 10


# ----- invariants ----------------------------------------------------------------------------

@functools.cache
def sown_mixing(cfg):
  """Jitted ``(params, tokens) -> (logits, mixing)``, mixing a 2-tuple of [L,B,T,n,n]."""
  def f(params, tokens):
    logits, state = Transformer(cfg).apply({"params": params}, tokens, mutable=["intermediates"])
    return logits, state["intermediates"]["layers"]["residual"]["mixing"]
  return jit(f)


@pytest.mark.parametrize("name, res_init", [("hc", None), ("mhc", "identity"),
                                            ("mhc", "uniform")])
def test_multistream_at_init_equals_preln(name, res_init):
  """Pre-LN's weights in HC / mHC at init give Pre-LN's logits; moving off init changes them."""
  tokens = jnp.asarray(text_batch(2, 12))
  pre = tiny_cfg("preln")
  pre_params = perturb(init(pre), scale=0.05)
  want = run(pre, pre_params, tokens)[0]
  cfg = tiny_cfg(name)
  params = transplant(pre_params, init(cfg))
  if res_init == "uniform":  # res_init only sets b_res's init value: reuse the compiled model
    assert static_logits(0, 4, "uniform")[2].sum() == 0
    for conn in params["layers"]["residual"].values():
      if "b_res" in conn:
        conn["b_res"] = jnp.zeros_like(conn["b_res"])
  # Equal up to the norms' eps: the final norm sees n x_L (mHC's block norms 1.095 x) for x.
  np.testing.assert_allclose(run(cfg, params, tokens)[0], want, atol=1e-4, rtol=2e-4)
  moved = perturb(params, scale=0.3)
  moved = transplant(pre_params, moved)                          # only the connection params move
  assert not np.allclose(run(cfg, moved, tokens)[0], want, atol=1e-3)


def test_static_hc_with_one_stream_is_preln():
  """n = 1, static weights A_m = A_r = B = 1: ``H <- H + F(N(H))`` and the readout ``N_f(H)`` are
  Pre-LN's equations, so with the same (perturbed, off-init) backbone every layer's hidden state
  and the logits equal Pre-LN's, not only at init."""
  tokens = jnp.asarray(text_batch(2, 12))
  pre = tiny_cfg("preln")
  pre_params = perturb(init(pre), scale=0.1)
  want_logits, want = run(pre, pre_params, tokens)
  cfg = tiny_cfg("hc", residual={"n_streams": 1, "dynamic": False})
  params = transplant(pre_params, init(cfg))
  for name in ("hc_attn", "hc_mlp"):
    conn = params["layers"]["residual"][name]
    assert set(conn) == {"static_alpha", "static_beta"}                 # no dynamic part
    np.testing.assert_array_equal(conn["static_alpha"], 1.0)
    np.testing.assert_array_equal(conn["static_beta"], 1.0)
  logits, got = run(cfg, params, tokens)
  np.testing.assert_allclose(got["hidden"], want["hidden"], atol=1e-6, rtol=1e-6)
  np.testing.assert_allclose(logits, want_logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["hc", "mhc"])
def test_hidden_and_readout_read_the_sum_of_distinct_streams(name):
  """``hidden`` (what every diagnostic measures) is sum_i H_i and the head reads N_f(sum_i H_i),
  checked where the streams differ: at init they are n equal copies, and the final norm would
  hide a readout of one stream."""
  cfg = tiny_cfg(name)
  h = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, 4, 32)), jnp.float32)  # [B,T,n,d]
  hidden, _ = wiring_call(cfg, {}, "hidden", h)
  np.testing.assert_allclose(hidden, np.sum(np.asarray(h), -2), rtol=1e-6, atol=1e-6)
  gain = np.linspace(0.5, 1.5, 32).astype(np.float32)
  io = registry.get(name).io(cfg)
  out = io.apply({"params": {"final_norm": {"scale": jnp.asarray(gain)}}}, h,
                 method=type(io).readout)
  total = np.sum(np.asarray(h, np.float64), -2)
  np.testing.assert_allclose(out, total / rms(total) * gain, rtol=1e-5, atol=1e-6)
  # End to end, off init: logits = N_f(hidden of the last layer) @ W_head.
  params = perturb(init(cfg), scale=0.3)
  logits, layers = run(cfg, params, jnp.asarray(text_batch(2, 12)))
  last = np.asarray(layers["hidden"][-1], np.float64)
  head = (last / rms(last) * np.asarray(params["residual_io"]["final_norm"]["scale"])
          ) @ np.asarray(params["lm_head"]["kernel"])
  np.testing.assert_allclose(logits, head, rtol=1e-4, atol=1e-4)


def test_hc_static_init_is_onehot_identity_ones_and_moves_with_its_layer():
  """A_m one-hot at stream k mod n: L = 3, n = 4 has sublayers k = 0..5, so layer 2 wraps to
  streams 0 and 1 (at L = 2 the mod never wrapped, and a one-hot at k, zero from k = n on,
  passed)."""
  cfg = tiny_cfg("hc", n_layers=3)
  params = init(cfg)
  conn = params["layers"]["residual"]
  for sub, name in enumerate(("hc_attn", "hc_mlp")):
    alpha = np.asarray(conn[name]["static_alpha"])              # [L, n, 1+n]
    for layer in range(3):
      np.testing.assert_array_equal(alpha[layer, :, 0], np.eye(4)[(2 * layer + sub) % 4])
      np.testing.assert_array_equal(alpha[layer, :, 1:], np.eye(4))
    np.testing.assert_array_equal(conn[name]["static_beta"], np.ones((3, 4)))
    np.testing.assert_array_equal(conn[name]["dynamic_alpha"], 0)
    np.testing.assert_allclose(conn[name]["dynamic_alpha_scale"], 0.01)   # HC Sec. 4: s_alpha,
    np.testing.assert_allclose(conn[name]["dynamic_beta_scale"], 0.01)    # s_beta init 0.01
    np.testing.assert_array_equal(conn[name]["dynamic_beta"], 0)
  np.testing.assert_array_equal(home_stream(jnp.arange(6), 4), np.eye(4)[[0, 1, 2, 3, 0, 1]])
  swapped = permute_layers(params, jnp.array([1, 0, 2]))["layers"]["residual"]["hc_attn"]
  np.testing.assert_array_equal(swapped["static_alpha"][0, :, 0], np.eye(4)[2])
  _, mixing = sown_mixing(cfg)(params, jnp.asarray(text_batch(2, 12)))
  assert len(mixing) == 2 and mixing[0].shape == (3, 2, 12, 4, 4)
  np.testing.assert_allclose(mixing[1], np.broadcast_to(np.eye(4), mixing[1].shape), atol=1e-7)


def test_mhc_static_init():
  b_pre, b_post, b_res = static_logits(jnp.int32(5), 4, "identity")
  np.testing.assert_allclose(jax.nn.sigmoid(b_pre), [0.0474, 0.9526, 0.0474, 0.0474], atol=1e-4)
  np.testing.assert_allclose(2 * jax.nn.sigmoid(b_post), 1.0)
  np.testing.assert_allclose(np.diag(sinkhorn_knopp(b_res, 20)), 0.9926, atol=1e-4)
  _, _, b_uniform = static_logits(jnp.int32(5), 4, "uniform")
  np.testing.assert_allclose(sinkhorn_knopp(b_uniform, 20), np.full((4, 4), 0.25), atol=1e-7)
  for res_init, b_res in (("identity", 6 * np.eye(2) - 3), ("uniform", np.zeros((2, 2)))):
    cfg = small("mhc", res_init=res_init)                       # the option reaches the init
    module = registry.get("mhc").layer(cfg)
    params = module.init(jax.random.PRNGKey(0), H, 1, jnp.int32(1), method=type(module).read)
    conn = nn.unbox(params["params"]["mhc_mlp"])
    np.testing.assert_allclose(conn["b_res"], b_res)
    np.testing.assert_allclose(conn["b_pre"], [-3, 3])          # k = 3: home stream 1
    for gate in ("alpha_pre", "alpha_post", "alpha_res"):       # mHC App. A.1: gates init 0.01
      np.testing.assert_allclose(conn[gate], 0.01, err_msg=gate)
  # Every sublayer's home stream k = 2 l + sub mod n, in the model (L=2, n=4), as HC's test
  # checks: at k = 3 alone, `layer`, `sub` or `2 sub + layer` read the same stream.
  cfg = tiny_cfg("mhc")
  conn = init(cfg)["layers"]["residual"]
  for sub, name in enumerate(("mhc_attn", "mhc_mlp")):
    for layer in range(2):
      np.testing.assert_allclose(conn[name]["b_pre"][layer],
                                 3 * (2 * np.eye(4)[(2 * layer + sub) % 4] - 1))


def test_mhc_mixing_is_doubly_stochastic_in_the_model():
  cfg = tiny_cfg("mhc")
  params = perturb(init(cfg), scale=0.1)
  conn = params["layers"]["residual"]
  rng = np.random.RandomState(3)
  for name in ("mhc_attn", "mhc_mlp"):        # off init: logits of std ~0.5, varying per token
    conn[name]["b_res"] = jnp.asarray(0.3 * rng.standard_normal((2, 4, 4)), jnp.float32)
    conn[name]["alpha_res"] = jnp.full((2,), 0.3, jnp.float32)
  _, mixing = sown_mixing(cfg)(params, jnp.asarray(text_batch(2, 12)))
  for m in mixing:
    m = np.asarray(m)                                           # [L,B,T,n,n]
    assert m.std(axis=(1, 2)).max() > 1e-3                      # dynamic: varies per token
    assert (m >= 0).all()
    np.testing.assert_allclose(m.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(m.sum(-2), 1.0, atol=1e-5)


def test_config_checks():
  assert dict(tiny_cfg("hc").residual) == {"name": "hc", "n_streams": 4, "dynamic": True,
                                           "tanh": True}
  assert tiny_cfg("mhc").residual["sinkhorn_iters"] == 20
  for name, field, value in (("hc", "n_streams", 0), ("hc", "dynamic", "yes"),
                             ("mhc", "res_init", "eye"), ("mhc", "sinkhorn_iters", 0),
                             ("mhc", "sinkhorn_kernel", "cuda"),
                             ("mhc", "n_streams", 3)):          # 3 only with the xla kernel
    if (name, field) == ("mhc", "n_streams"):
      with pytest.raises(ConfigError, match=r"n_streams=3 with sinkhorn_kernel='pallas'.*allowed"):
        tiny_cfg(name, residual={field: value, "sinkhorn_kernel": "pallas"})
      tiny_cfg(name, residual={field: value})
      continue
    with pytest.raises(ConfigError, match=rf"config\.model\.residual\.{field}=.*allowed"):
      tiny_cfg(name, residual={field: value})
  with pytest.raises(ConfigError, match=r"config\.model\.residual\.tanh.*allowed"):
    tiny_cfg("mhc", residual={"tanh": True})


# ----- the checks every design passes --------------------------------------------------------

test_shared_checks = shared_checks_test(DESIGNS)
