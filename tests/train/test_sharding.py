"""Where the logical-axis rules put params and batches on a (data, fsdp, tensor) mesh, and how
config.mesh resolves against the device count. An AbstractMesh stands in for 16 devices."""

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest
from jax.sharding import AbstractMesh, PartitionSpec as P

from depthbench_jax.errors import ConfigError
from depthbench_jax.model.config import model_config_from
from depthbench_jax.train import jitted, sharding
from tests.helpers import tiny_config

MESH = AbstractMesh((2, 2, 4), sharding.MESH_AXES)


def _boxed(shape, names):
  return nn.LogicallyPartitioned(np.zeros(shape, np.float32), names)


def test_logical_rules_place_weights_fsdp_on_embed_and_tensor_on_heads_mlp_vocab():
  """An axis that does not divide its mesh axis (6 heads over tensor=4) is replicated; plain
  params and rule-less axes (layers, head_dim) are replicated."""
  tree = {"mlp_in": _boxed((64, 256), ("embed", "mlp")),
          "unembed": _boxed((64, 1024), ("embed", "vocab")),
          "q": _boxed((64, 8, 16), ("embed", "heads", "head_dim")),
          "q6": _boxed((64, 6, 16), ("embed", "heads", "head_dim")),
          "scales": _boxed((3, 64), ("layers", "embed")),
          "odd": _boxed((63, 256), ("embed", "mlp")),
          "plain": np.zeros((64, 64), np.float32),
          # Rule-less axes alone, sizes every mesh axis divides (beside embed/heads, or of 3
          # layers, a rule giving them a mesh axis did not show).
          "gains": _boxed((4, 64), ("layers", "norm")),
          "qk": _boxed((4, 16), ("layers", "head_dim")),
          "mix": _boxed((4, 4), ("layers", "streams"))}
  specs = {k: s.spec for k, s in sharding.logical_shardings(tree, MESH).items()}
  assert specs == {"mlp_in": P("fsdp", "tensor"), "unembed": P("fsdp", "tensor"),
                   "q": P("fsdp", "tensor", None), "q6": P("fsdp", None, None),
                   "scales": P(None, "fsdp"), "odd": P(None, "tensor"), "plain": P(),
                   "gains": P(None, None), "qk": P(None, None), "mix": P(None, None)}


def test_batch_rows_split_over_data_and_fsdp_only():
  assert sharding.data_parallel_size(MESH) == 4
  assert sharding.batch_sharding(MESH).spec == P(("data", "fsdp"))
  assert sharding.replicated(MESH).spec == P()


@pytest.mark.parametrize("mesh,pattern", [
    ({"data": 0, "fsdp": 1, "tensor": 1}, "positive sizes with at most one -1"),
    ({"data": -1, "fsdp": 3, "tensor": 1}, "does not fit 8 devices"),
    ({"data": 2, "fsdp": 2, "tensor": 1}, "has 4 devices but 8 are present"),
])
def test_mesh_shapes_that_do_not_fit_are_config_errors(mesh, pattern):
  with pytest.raises(ConfigError, match=pattern):
    sharding.mesh_shape(mesh, 8)


def test_make_mesh_on_the_devices_here():
  mesh = sharding.make_mesh({"data": -1, "fsdp": 1, "tensor": 1})
  assert dict(mesh.shape) == {"data": jax.device_count(), "fsdp": 1, "tensor": 1}


def test_a_logical_name_without_a_rule_is_refused_naming_the_param():
  """flax maps a name the rules lack to None: a new design's ``'embd'`` (for ``'embed'``) would
  be replicated on every device without a word."""
  tree = {"layers": {"residual": {"w": _boxed((3, 64), ("layers", "embd"))}}}
  with pytest.raises(ValueError, match=r"param \['layers'\]\['residual'\]\['w'\]: logical axis "
                                       r"names \['embd'\] have no sharding rule; allowed: .*embed"):
    sharding.logical_shardings(tree, MESH)


def test_params_fsdp_cannot_split_are_named_with_their_bytes():
  """A width fsdp does not divide (63 over 2 here; d = 1472 over 128 devices in the 1.6B suite)
  keeps the whole param on every device: the warning names it, the parameters and the bytes;
  tensor-axis fallbacks (6 heads over 4) and rule-less axes are not FSDP's and not named."""
  tree = {"odd": _boxed((63, 256), ("embed", "mlp")),
          "odd_too": _boxed((2, 63), ("layers", "embed")),
          "q6": _boxed((64, 6, 16), ("embed", "heads", "head_dim")),
          "fine": _boxed((64, 256), ("embed", "mlp")),
          "plain": np.zeros((63, 63), np.float32)}
  assert sharding.unsharded_by_fsdp(tree, MESH) == {"['odd']": (63, 2, 63 * 256, 63 * 256 * 4),
                                                    "['odd_too']": (63, 2, 126, 126 * 4)}
  line = sharding.fsdp_warning(tree, MESH)
  assert line.startswith("config.mesh fsdp=2 does not divide the sharded axis (63) of 2 params, "
                         "e.g. ['odd']: 16,254 parameters stay whole on every device")
  assert line.endswith("allowed: an fsdp size dividing 63") and "\n" not in line
  assert sharding.fsdp_warning({"fine": tree["fine"], "q6": tree["q6"]}, MESH) is None
  # The bytes at the param dtype: bf16 params keep bf16 gradients and moments (8 bytes a
  # parameter, where the warning said fp32's 16). Abstract leaves: 63 x 2^24 parameters.
  big = lambda dtype: {"w": nn.LogicallyPartitioned(jax.ShapeDtypeStruct((63, 2**24), dtype),
                                                     ("embed", "mlp"))}
  assert "moments: 15.75 GiB on each" in sharding.fsdp_warning(big(np.float32), MESH)
  assert "moments: 7.88 GiB on each" in sharding.fsdp_warning(big(jax.numpy.bfloat16), MESH)


def test_adam_moments_shard_like_their_params_and_the_count_is_replicated():
  """The train state's shardings as the train step is jitted with them: optax's mu and nu, each
  param-shaped, take the param's NamedSharding (ZeRO-3: the moments are half the state's bytes);
  the step count is replicated. Read from ``jitted_steps`` on this process's one device, whose
  (1, 1, 1) mesh keeps the axis names the rules give (a pod's mesh only resizes them)."""
  c = tiny_config(**{"mesh.data": 1, "mesh.fsdp": 1, "mesh.tensor": 1})
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  steps = jitted.jitted_steps(c, model_config_from(c.model), mesh, 10)
  params = jax.tree_util.tree_leaves_with_path(steps.param_sharding)
  assert any("fsdp" in s.spec for _, s in params) and any("tensor" in s.spec for _, s in params)
  adam = [s for s in jax.tree.leaves(steps.state_sharding.opt_state,
                                     is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
          if isinstance(s, optax.ScaleByAdamState)]
  assert len(adam) == 1
  for moment in (adam[0].mu, adam[0].nu):
    assert jax.tree_util.tree_leaves_with_path(moment) == params
  assert adam[0].count.spec == P()
