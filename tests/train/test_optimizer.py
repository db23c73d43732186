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


@pytest.mark.parametrize("arch,decayed,kept", [
    ("preln", {"kernel", "embedding"}, {"scale"}),
    # HC Sec. 4: the dynamic projections are decayed; the static connection weights and the
    # dynamic scales are not.
    ("hc", {"kernel", "embedding", "dynamic_alpha", "dynamic_beta"},
     {"scale", "static_alpha", "static_beta", "dynamic_alpha_scale", "dynamic_beta_scale"}),
    ("mhc", {"kernel", "embedding", "phi"},
     {"scale", "b_pre", "b_post", "b_res", "alpha_pre", "alpha_post", "alpha_res"}),
])
def test_weight_decay_mask_per_design(arch, decayed, kept):
  config, shapes = _config_and_shapes(arch)
  mask = optimizer.weight_decay_mask(shapes, extra=registry.get(arch).decayed)
  flat = [(_leaf_name(p), bool(m)) for p, m in jax.tree_util.tree_flatten_with_path(mask)[0]]
  assert {n for n, m in flat if m} == decayed
  assert kept <= {n for n, m in flat if not m}


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
