"""AdamW's weight-decay mask: matrices and the embedding, plus each design's dynamic projections."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import smoke
from depthbench_jax.model.config import model_config_from
from depthbench_jax.model.transformer import abstract_params
from depthbench_jax.residual import registry
from depthbench_jax.train import optimizer


def _config_and_shapes(arch):
  config = smoke.get_config(f"arch={arch},shape=2x32")
  return config, nn.unbox(abstract_params(model_config_from(config.model)))


def _leaf_name(path) -> str:
  return getattr(path[-1], "key", getattr(path[-1], "name", None))


BACKBONE = {"kernel", "embedding"}
ATTNRES_KEPT = {"scale", "attn_res_query_attn", "attn_res_query_mlp", "readout_query",
                "attn_res_key_norm_attn", "attn_res_key_norm_mlp", "readout_key_norm"}
# design -> (leaf names decayed, leaf names kept undecayed): one row per registered design.
DECAY_TABLE = {
    "preln": (BACKBONE, {"scale"}),
    "lns": (BACKBONE, {"scale"}),
    "sandwich": (BACKBONE, {"scale"}),
    "deepnorm": (BACKBONE, {"scale"}),
    "keel": (BACKBONE, {"scale"}),
    # HC Sec. 4: the dynamic projections are decayed; the static connection weights and the
    # dynamic scales are not.
    "hc": (BACKBONE | {"dynamic_alpha", "dynamic_beta"},
           {"scale", "static_alpha", "static_beta", "dynamic_alpha_scale", "dynamic_beta_scale"}),
    "mhc": (BACKBONE | {"phi"},
            {"scale", "b_pre", "b_post", "b_res", "alpha_pre", "alpha_post", "alpha_res"}),
    # The pseudo-queries and key-norm gains are per-channel vectors, like the norm gains.
    "attnres_full": (BACKBONE, ATTNRES_KEPT),
    "attnres_block": (BACKBONE, ATTNRES_KEPT),
    "moda": (BACKBONE, {"scale"}),   # its depth K/V projections are Dense kernels
}


@pytest.mark.parametrize("arch", registry.names())
def test_weight_decay_mask_per_design(arch):
  """Every registered design has a row (DEVELOPERS.md: a new design adds one), and its mask
  decays exactly the row's first set of leaf names and keeps exactly its second."""
  if arch not in DECAY_TABLE:
    pytest.fail(f"{arch}: no row in DECAY_TABLE (tests/train/test_optimizer.py)")
  decayed, kept = DECAY_TABLE[arch]
  config, shapes = _config_and_shapes(arch)
  mask = optimizer.weight_decay_mask(shapes, extra=registry.get(arch).decayed)
  flat = [(_leaf_name(p), bool(m)) for p, m in jax.tree_util.tree_flatten_with_path(mask)[0]]
  assert {n for n, m in flat if m} == decayed
  assert {n for n, m in flat if not m} == kept


def test_make_optimizer_decays_hc_dynamic_weights_and_not_static_ones():
  config, shapes = _config_and_shapes("hc")
  config.weight_decay, config.grad_clip, config.warmup_steps = 0.5, 0.0, 1
  params = jax.tree_util.tree_map(lambda s: jnp.ones(s.shape, s.dtype), shapes)
  zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
  opt = optimizer.make_optimizer(config, total_steps=10)
  _, state = opt.update(zeros, opt.init(params), params)        # step 0 has lr 0 (warmup)
  updates, _ = opt.update(zeros, state, params)
  # Zero gradients: Adam's part is 0, so the update is -lr * wd * p where decayed, else 0.
  step_lr = float(optimizer.lr_schedule(config, 10)(1))
  assert step_lr > 0
  names = set()
  for path, u in jax.tree_util.tree_flatten_with_path(updates)[0]:
    name = _leaf_name(path)
    names.add(name)
    want = -step_lr * 0.5 if name in ("dynamic_alpha", "dynamic_beta", "kernel",
                                      "embedding") else 0.0
    np.testing.assert_allclose(np.asarray(u), want, rtol=1e-6, err_msg=jax.tree_util.keystr(path))
  assert {"dynamic_alpha", "dynamic_beta", "static_alpha"} <= names



@pytest.mark.parametrize("warmup", [10, 0.1])   # steps, or a fraction of the 100 steps
def test_lr_schedule_by_hand(warmup):
  """Linear warmup to lr over W steps, then cosine to min_lr_ratio * lr at the last step."""
  import ml_collections
  config = ml_collections.ConfigDict({"lr": 1e-3, "warmup_steps": warmup, "min_lr_ratio": 0.1})
  schedule = optimizer.lr_schedule(config, 100)
  for step, want in ((0, 0.0), (5, 5e-4), (10, 1e-3), (55, 1e-4 + 9e-4 * 0.5),
                     (70, 1e-4 + 9e-4 * 0.5 * (1 + np.cos(np.pi * 60 / 90))), (100, 1e-4)):
    assert float(schedule(step)) == pytest.approx(want, rel=1e-5, abs=1e-9), step


def test_two_adamw_steps_by_hand_with_clipping():
  """Step 1 (lr 0 in warmup) sees a gradient of global norm 100, clipped to norm 2; step 2 sees
  one of norm 0.5, left alone. The second update is Adam's bias-corrected m / (sqrt(v) + eps)
  with (b1, b2) = (0.8, 0.99), plus weight decay on the kernel only, times -lr. b1 = 0.9 and a
  clip at 1 are optax's default and the usual one: a config value ignored there passed."""
  import ml_collections
  config = ml_collections.ConfigDict({
      "lr": 0.1, "warmup_steps": 1, "min_lr_ratio": 1.0, "b1": 0.8, "b2": 0.99,
      "weight_decay": 0.5, "grad_clip": 2.0, "model": {"residual": {"name": "preln"}}})
  params = {"dense": {"kernel": jnp.array([1.0, -2.0])}, "norm": {"scale": jnp.array([0.5, 3.0])}}
  g1 = {"dense": {"kernel": jnp.array([60.0, 80.0])}, "norm": {"scale": jnp.zeros(2)}}
  g2 = {"dense": {"kernel": jnp.array([0.3, 0.0])}, "norm": {"scale": jnp.array([0.0, 0.4])}}
  opt = optimizer.make_optimizer(config, total_steps=10)
  u1, state = opt.update(g1, opt.init(params), params)
  assert all(float(jnp.abs(u).max()) == 0.0 for u in jax.tree.leaves(u1))   # lr(0) = 0
  u2, _ = opt.update(g2, state, params)
  for group, name, decay in (("dense", "kernel", 0.5), ("norm", "scale", 0.0)):
    c1 = np.asarray(g1[group][name]) / 50.0          # clipped to global norm 2
    c2 = np.asarray(g2[group][name])                 # norm 0.5 < 2: untouched
    m = 0.8 * 0.2 * c1 + 0.2 * c2
    v = 0.99 * 0.01 * c1**2 + 0.01 * c2**2
    adam = (m / (1 - 0.8**2)) / (np.sqrt(v / (1 - 0.99**2)) + 1e-8)
    want = -0.1 * (adam + decay * np.asarray(params[group][name]))
    np.testing.assert_allclose(np.asarray(u2[group][name]), want, rtol=1e-5, err_msg=name)


def test_a_fractional_warmup_rounds_to_the_nearest_step():
  """0.026 of 100 steps is 2.6: 3 warmup steps, not 2 (0.1 of 100, the other tests' fraction,
  is 10 under rounding and truncation alike)."""
  import ml_collections
  config = ml_collections.ConfigDict({"warmup_steps": 0.026})
  assert optimizer.warmup_steps_of(config, 100) == 3


def test_warmup_of_zero_or_one_is_one_step_and_a_float_one_is_not_a_fraction():
  """warmup_steps=0 still starts at lr 0 (one warmup step); 1.0 is one step, not all of them
  (only values in (0, 1) are fractions)."""
  import ml_collections
  for warmup in (0, 1, 1.0):
    config = ml_collections.ConfigDict({"lr": 1e-3, "warmup_steps": warmup, "min_lr_ratio": 1.0})
    assert optimizer.warmup_steps_of(config, 100) == int(warmup)
    schedule = optimizer.lr_schedule(config, 100)
    assert (float(schedule(0)), float(schedule(1))) == pytest.approx((0.0, 1e-3)), warmup
