"""LNS, Sandwich-LN, DeepNorm, KEEL: update equations by hand, invariants, the shared checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from depthbench_jax.errors import ConfigError
from depthbench_jax.model.transformer import Transformer
from depthbench_jax.residual.deepnorm import deepnorm_alpha, deepnorm_beta
from residual_testkit import (init, perturb, rms, run, shared_checks_test, text_batch, tiny_cfg,
                              wiring_call)

DESIGNS = ("lns", "sandwich", "deepnorm", "keel")
EPS = 1e-6
X = np.array([[[1.0, 2.0, 3.0, 4.0]]], np.float32)        # [B=1, T=1, d=4]; mean(x^2) = 7.5
Y = np.array([[[0.5, -1.0, 2.0, 0.0]]], np.float32)       # a sublayer output; mean(y^2) = 1.3125
G1 = np.array([1.0, 0.5, 2.0, 1.0], np.float32)
G2 = np.array([2.0, 1.0, 1.0, 0.5], np.float32)


def small(name, n_layers=4, **residual):
  return tiny_cfg(name, n_layers=n_layers, d_model=4, n_heads=2, residual=residual)


def scales(**gains):
  return {name: {"scale": jnp.asarray(g)} for name, g in gains.items()}


# ----- update equations on a hand-computed case ----------------------------------------------

def test_lns_update_by_hand():
  cfg = small("lns")
  params = scales(input_layernorm=G1, post_attention_layernorm=G2)
  u, _ = wiring_call(cfg, params, "read", X, 1, jnp.int32(2))   # layer 3 (1-based): 1/sqrt(3)
  np.testing.assert_allclose(u, X / np.sqrt(7.5 + EPS) * G2 / np.sqrt(3.0), rtol=1e-6)
  u0, _ = wiring_call(cfg, params, "read", X, 0, jnp.int32(0))  # layer 1: factor 1
  np.testing.assert_allclose(u0, X / np.sqrt(7.5 + EPS) * G1, rtol=1e-6)
  u0, _ = wiring_call(cfg, params, "read", X, 0, jnp.int32(2))  # the attention's read too
  np.testing.assert_allclose(u0, X / np.sqrt(7.5 + EPS) * G1 / np.sqrt(3.0), rtol=1e-6)
  new, _ = wiring_call(cfg, params, "write", X, Y, 0, jnp.int32(2))
  np.testing.assert_allclose(new, X + Y)


def test_sandwich_update_by_hand():
  cfg = small("sandwich")
  params = scales(input_layernorm=G1, pre_feedforward_layernorm=G2,
                  post_attention_layernorm=G2, post_feedforward_layernorm=G1)
  u, _ = wiring_call(cfg, params, "read", X, 1, jnp.int32(0))
  np.testing.assert_allclose(u, X / np.sqrt(7.5 + EPS) * G2, rtol=1e-6)
  u, _ = wiring_call(cfg, params, "read", X, 0, jnp.int32(0))
  np.testing.assert_allclose(u, X / np.sqrt(7.5 + EPS) * G1, rtol=1e-6)
  new, _ = wiring_call(cfg, params, "write", X, Y, 0, jnp.int32(0))
  np.testing.assert_allclose(new, X + Y / np.sqrt(1.3125 + EPS) * G2, rtol=1e-6)
  new, _ = wiring_call(cfg, params, "write", X, Y, 1, jnp.int32(0))
  np.testing.assert_allclose(new, X + Y / np.sqrt(1.3125 + EPS) * G1, rtol=1e-6)
  # What the model runs: Sandwich's own ``sublayer`` (not ``read`` and ``write``): the branch
  # reads N_pre(x) (each sublayer its own gain; a read of x, or of the other pre-norm, passed
  # when only the output was checked), returning N_post(y).
  for sub, pre, post in ((0, G1, G2), (1, G2, G1)):
    seen = []
    (new, z), _ = wiring_call(cfg, params, "sublayer", X, sub, jnp.int32(0),
                              lambda u, x: (seen.append(u) or jnp.asarray(Y), x))
    np.testing.assert_allclose(seen[-1], X / np.sqrt(7.5 + EPS) * pre, rtol=1e-6)
    np.testing.assert_allclose(z, Y / np.sqrt(1.3125 + EPS) * post, rtol=1e-6)
    np.testing.assert_allclose(new, X + z, rtol=1e-6)


def test_deepnorm_update_by_hand():
  cfg = small("deepnorm", n_layers=8)                          # alpha = 16^(1/4) = 2
  params = scales(post_attention_layernorm=G1, post_feedforward_layernorm=G2)
  u, _ = wiring_call(cfg, params, "read", X, 0, jnp.int32(3))
  np.testing.assert_allclose(u, X)                             # the branch reads x itself
  z = 2.0 * X + Y                                              # [2.5, 3, 8, 8]: mean z^2 = 35.8125
  new, _ = wiring_call(cfg, params, "write", X, Y, 1, jnp.int32(3))
  np.testing.assert_allclose(new, z / np.sqrt(35.8125 + EPS) * G2, rtol=1e-6)



def test_deepnorm_attention_sublayer_uses_its_own_post_norm():
  """Sublayer 0 normalises ``alpha x + y`` with ``post_attention_layernorm``'s gain (the test
  above checks the MLP's ``post_feedforward_layernorm`` only)."""
  cfg = small("deepnorm", n_layers=8)                          # alpha = 2
  params = scales(post_attention_layernorm=G1, post_feedforward_layernorm=G2)
  new, _ = wiring_call(cfg, params, "write", X, Y, 0, jnp.int32(3))
  np.testing.assert_allclose(new, (2.0 * X + Y) / np.sqrt(35.8125 + EPS) * G1, rtol=1e-6)

@pytest.mark.parametrize("n_layers, alpha, beta", [(8, 2.0, 0.125 ** 0.5),
                                                   (32, 64 ** 0.25, 0.25),
                                                   (16, 32 ** 0.25, 128 ** -0.25)])
def test_deepnorm_constants_match_formula(n_layers, alpha, beta):
  assert deepnorm_alpha(n_layers) == pytest.approx(alpha)
  assert deepnorm_beta(n_layers) == pytest.approx(beta)


def test_deepnorm_scales_v_o_mlp_init_and_has_no_final_norm():
  cfg = tiny_cfg("deepnorm")                                  # L=2: beta = 16^(-1/4) = 0.5
  params = init(cfg)
  layers = params["layers"]
  std = lambda *path: float(np.std(_get(layers, path)))
  for path in (("self_attn", "q_proj"), ("self_attn", "k_proj")):
    assert std(*path, "kernel") == pytest.approx(0.02, rel=0.1), path
  beta = deepnorm_beta(2)
  assert beta == pytest.approx(0.5)
  # Against Pre-LN's kernels of the same key (the same draws): exactly beta, where an absolute
  # std within 10% let beta of L + 1 layers (0.452) pass.
  preln = init(tiny_cfg("preln"))["layers"]
  for path in (("self_attn", "v_proj"), ("self_attn", "o_proj"), ("mlp", "gate_proj"),
               ("mlp", "up_proj"), ("mlp", "down_proj")):
    assert std(*path, "kernel") == pytest.approx(0.02 * beta, rel=0.1), path
    np.testing.assert_allclose(_get(layers, path + ("kernel",)),
                               beta * np.asarray(_get(preln, path + ("kernel",))), rtol=1e-5,
                               atol=1e-8, err_msg=str(path))
  assert not params.get("residual_io")
  # The head reads the last post-norm output directly: replacing the readout by an identity is
  # what the model does, so logits = N(x_L) @ W_head exactly. With the norm gains doubled: at
  # init every gain is 1, x_L already has unit RMS, and a second gain-free norm moved the logits
  # by ~1e-7.
  tokens = jnp.asarray(text_batch(1, 8))
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: 2 * x if getattr(path[-1], "key", None) == "scale" else x, perturb(params))
  logits, layers_out = run(cfg, params, tokens)
  last = np.asarray(layers_out["hidden"][-1], np.float64)
  assert float(np.sqrt(np.mean(last ** 2))) > 1.5   # a renorm would halve the logits
  np.testing.assert_allclose(logits, layers_out["hidden"][-1] @ params["lm_head"]["kernel"],
                             atol=1e-5)


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def test_keel_update_by_hand():
  cfg = small("keel", n_layers=2)                              # alpha = 2 * 2 = 4
  params = scales(input_layernorm=G1, pre_feedforward_layernorm=G2,
                  post_attention_layernorm=G2, post_feedforward_layernorm=G1)
  u, _ = wiring_call(cfg, params, "read", X, 1, jnp.int32(1))
  np.testing.assert_allclose(u, X / np.sqrt(7.5 + EPS) * G2, rtol=1e-6)
  u, _ = wiring_call(cfg, params, "read", X, 0, jnp.int32(1))
  np.testing.assert_allclose(u, X / np.sqrt(7.5 + EPS) * G1, rtol=1e-6)
  z = 4.0 * X + Y                                      # [4.5, 7, 14, 16]: mean z^2 = 130.3125
  new, _ = wiring_call(cfg, params, "write", X, Y, 0, jnp.int32(1))
  np.testing.assert_allclose(new, z / np.sqrt(130.3125 + EPS) * G2, rtol=1e-6)
  # Layer 0: the attention sublayer is plain Pre-LN, the MLP one has scale 1 and its post-norm.
  new, _ = wiring_call(cfg, params, "write", X, Y, 0, jnp.int32(0))
  np.testing.assert_allclose(new, X + Y)
  new, _ = wiring_call(cfg, params, "write", X, Y, 1, jnp.int32(0))
  np.testing.assert_allclose(new, (X + Y) / rms(X + Y) * G1, rtol=1e-6)
  plain_off = small("keel", n_layers=2, first_layer_plain=False, alpha=3.0)
  new, _ = wiring_call(plain_off, params, "write", X, Y, 0, jnp.int32(0))
  np.testing.assert_allclose(new, (3 * X + Y) / rms(3 * X + Y) * G2, rtol=1e-6)



def test_keel_without_plain_first_layer_scales_every_sublayer_by_alpha():
  """``first_layer_plain=False``: layer 0 as any other, ``N_out(alpha x + y)`` with alpha = 2L
  and each sublayer's own post-norm (attention: post_attention_layernorm, MLP:
  post_feedforward_layernorm)."""
  cfg = small("keel", n_layers=2, first_layer_plain=False)      # alpha = 4
  params = scales(input_layernorm=G1, pre_feedforward_layernorm=G2,
                  post_attention_layernorm=G2, post_feedforward_layernorm=G1)
  z = 4.0 * X + Y
  for layer in (0, 1):
    for sub, gain in ((0, G2), (1, G1)):
      new, _ = wiring_call(cfg, params, "write", X, Y, sub, jnp.int32(layer))
      np.testing.assert_allclose(new, z / rms(z) * gain, rtol=1e-6, err_msg=f"{layer} {sub}")


def test_keel_alpha_must_be_a_positive_number():
  """alpha = 0 (the skip dropped), a bool and inf (NaN logits from layer 1 on) are refused,
  naming the field, and so is a numpy scalar (config.json is plain JSON: it failed the first
  checkpoint's save); 0.5 is allowed."""
  for bad in (0, 0.0, True, float("inf"), float("nan"), np.float32(2.0)):
    with pytest.raises(ConfigError, match=r"config\.model\.residual\.alpha=.*allowed"):
      tiny_cfg("keel", residual={"alpha": bad})
  assert tiny_cfg("keel", residual={"alpha": 0.5}).residual["alpha"] == 0.5

# ----- invariants ----------------------------------------------------------------------------

def test_lns_at_layer_one_equals_preln():
  """Same params: layer 1 (factor 1/sqrt(1)) matches Pre-LN, layer 2 (1/sqrt(2)) does not."""
  tokens = jnp.asarray(text_batch(2, 12))
  pre = tiny_cfg("preln")
  params = perturb(init(pre))                                  # the same param tree as LNS
  _, want = run(pre, params, tokens)
  _, got = run(tiny_cfg("lns"), params, tokens)
  np.testing.assert_allclose(got["hidden"][0], want["hidden"][0], atol=1e-6)
  assert not np.allclose(got["hidden"][1], want["hidden"][1], atol=1e-3)


def test_keel_alpha_defaults_to_number_of_sublayers():
  from depthbench_jax.residual.keel import keel_alpha
  assert keel_alpha(tiny_cfg("keel", n_layers=5).residual, 5) == 10.0
  assert keel_alpha(tiny_cfg("keel", n_layers=5, residual={"alpha": 2.5}).residual, 5) == 2.5


def test_config_defaults_are_merged_and_bad_fields_named():
  cfg = tiny_cfg("keel")
  assert cfg.residual["first_layer_plain"] is True and cfg.residual["alpha"] is None
  with pytest.raises(ConfigError, match=r"config\.model\.residual\.alpha=-1.*allowed"):
    tiny_cfg("keel", residual={"alpha": -1})
  with pytest.raises(ConfigError, match=r"config\.model\.residual\.n_streams.*allowed: name"):
    tiny_cfg("lns", residual={"n_streams": 4})
  with pytest.raises(ConfigError, match=r"config\.model\.residual\.n_streams.*allowed: name"):
    tiny_cfg("preln", residual={"n_streams": 4})  # A field of another design, not ignored.
  with pytest.raises(ConfigError, match=r"config\.model\.residual\.first_layer_plain"):
    tiny_cfg("keel", residual={"first_layer_plain": "yes"})


# ----- precision under bf16 compute ----------------------------------------------------------

def _float_arithmetic_dtypes(jaxpr) -> set:
  """Output dtypes of every add/mul/sub in ``jaxpr`` and the jaxprs nested in it."""
  out = set()
  for eqn in jaxpr.eqns:
    if eqn.primitive.name in ("add", "mul", "sub"):
      out |= {str(v.aval.dtype) for v in eqn.outvars}
    for param in eqn.params.values():
      inner = getattr(param, "jaxpr", param)
      if hasattr(inner, "eqns"):
        out |= _float_arithmetic_dtypes(inner)
  return out


@pytest.mark.parametrize("name, sub, layer", [("deepnorm", 0, 1), ("deepnorm", 1, 1),
                                              ("keel", 0, 1), ("keel", 1, 1), ("keel", 1, 0)])
def test_post_norm_skip_sum_runs_in_fp32_under_bf16(name, sub, layer):
  """``N(alpha x + y)`` with bf16 x and y: no add or mul in bf16 (the sum was rounded to bf16
  before the norm: at KEEL's alpha = 140 the spacing there is 1.0, the size of y itself)."""
  cfg = tiny_cfg(name, n_layers=2, d_model=4, n_heads=2, dtype="bfloat16")
  params = scales(post_attention_layernorm=G1, post_feedforward_layernorm=G2)
  x, y = jnp.asarray(X, jnp.bfloat16), jnp.asarray(Y, jnp.bfloat16)
  jaxpr = jax.make_jaxpr(lambda x, y: wiring_call(cfg, params, "write", x, y, sub,
                                                  jnp.int32(layer))[0])(x, y)
  assert _float_arithmetic_dtypes(jaxpr.jaxpr) == {"float32"}


@pytest.mark.parametrize("name, residual, alpha, y_scale", [
    ("keel", {"alpha": 140.0}, 140.0, 1.0), ("deepnorm", {}, deepnorm_alpha(2), 0.1)])
def test_post_ln_state_is_fp32_under_bf16_and_keeps_small_updates(name, residual, alpha,
                                                                   y_scale):
  """A sublayer moves the unit-RMS state by ~y/alpha: for KEEL at alpha = 140 (the 70-layer
  suite) and DeepNorm with a beta-scaled y, at or under bf16's spacing. The state is fp32 from
  the embedding on, and one write matches the float64 ``N(alpha x + y)`` to 1e-4 of the update
  (with a bf16 state: 0.2 for KEEL, a few % for DeepNorm)."""
  cfg = tiny_cfg(name, n_layers=2, d_model=4, n_heads=2, dtype="bfloat16", residual=residual)
  tokens = jnp.zeros((1, 4), jnp.int32)
  hidden = jax.eval_shape(lambda t: Transformer(cfg).init_with_output(
      jax.random.PRNGKey(0), t, return_layers=True)[0][1]["hidden"], tokens)
  assert hidden.dtype == jnp.float32
  rng = np.random.RandomState(0)
  x = rng.standard_normal((1, 64, 4)).astype(np.float32)
  x /= rms(x).astype(np.float32)
  y = (y_scale * rng.standard_normal((1, 64, 4))).astype(np.float32).astype(jnp.bfloat16)
  params = scales(post_attention_layernorm=np.ones(4), post_feedforward_layernorm=np.ones(4))
  new, _ = wiring_call(cfg, params, "write", jnp.asarray(x), y, 1, jnp.int32(1))
  assert new.dtype == jnp.float32
  z = alpha * x.astype(np.float64) + np.asarray(y, np.float64)
  want = z / rms(z)
  err = np.linalg.norm(np.asarray(new, np.float64) - want) / np.linalg.norm(want - x)
  assert err < 1e-4, err


# ----- the checks every design passes --------------------------------------------------------

test_shared_checks = shared_checks_test(DESIGNS)
