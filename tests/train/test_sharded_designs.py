"""The designs that carry a residual state other than [B,T,d] (HC's n streams, Full AttnRes's
source buffer, Block AttnRes's block summaries, MoDA's depth K/V; each but HC through its own
custom-VJP layer stack) give the same loss and gradients on a 2x2x2 mesh of 8 fake
CPU devices (params by the logical rules, batch over data x fsdp, activations pinned to batch
rows as in training) as on one device. mHC carries HC's streams through the same code, with a
per-token Sinkhorn on replicated [n, n] maps: its one sharding of its own, phi's, is checked
on the rules alone (no compile), in the same subprocess.

The end-to-end sharded run in test_train_loop.py trains Pre-LN; this checks the other states
in one subprocess (the device count is fixed when jax starts)."""

import json
import subprocess
import sys

import pytest

from tests import helpers

DESIGNS = ("hc", "attnres_full", "attnres_block", "moda")

_SCRIPT = """
import json, sys
import flax.linen as nn
import jax, jax.numpy as jnp
from depthbench_jax.model.config import model_config_from
from depthbench_jax.model.transformer import Transformer
from depthbench_jax.train import sharding
from depthbench_jax.train.step import lm_loss
from tests.helpers import tiny_config

out = {}
# Block AttnRes at tiny_config's 2 layers has a block per sublayer (Full AttnRes); at 5 layers
# in 4 blocks of 3 sublayers a block is open across layers and its partial sum is a source.
OWN = {"attnres_block": {"model.n_layers": 5, "model.residual.n_blocks": 4}}
for design in sys.argv[1].split(","):
  c = tiny_config(**{"model.residual.name": design, "mesh.data": 2, "mesh.fsdp": 2,
                     "mesh.tensor": 2, **OWN.get(design, {})})
  model = Transformer(model_config_from(c.model))
  tokens = jax.random.randint(jax.random.PRNGKey(1), (8, 33), 0, 257, jnp.int32)
  boxed = model.init(jax.random.PRNGKey(0), tokens[:, :-1])["params"]
  params = nn.unbox(boxed)
  grad_fn = jax.value_and_grad(lambda p, t: lm_loss(p, model, t))
  loss1, grads1 = jax.jit(grad_fn)(params, tokens)
  mesh = sharding.make_mesh(c.mesh)
  p_shard = sharding.logical_shardings(boxed, mesh)
  # On the mesh the model pins its activations to batch rows (model.transformer.batch_sharded),
  # as training builds it: the pinned program must compute what the single-device one does.
  model8 = Transformer(model_config_from(c.model), mesh=mesh)
  grad_fn8 = jax.value_and_grad(lambda p, t: lm_loss(p, model8, t))
  sharded = jax.jit(grad_fn8, in_shardings=(p_shard, sharding.batch_sharding(mesh)),
                    out_shardings=(sharding.replicated(mesh), p_shard))
  loss8, grads8 = sharded(jax.device_put(params, p_shard),
                          jax.device_put(tokens, sharding.batch_sharding(mesh)))
  n_sharded = sum(any(a is not None for a in s.spec) for s in jax.tree.leaves(p_shard))
  diffs = jax.tree.leaves(jax.tree.map(
      # Leaves whose gradient is ~0 (mHC's b_res under a saturated Sinkhorn at its identity
      # init: 1e-12) are compared absolutely, below 1e-6.
      lambda a, b: float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(a)) + 1e-6)),
      grads1, grads8))
  out[design] = {"loss1": float(loss1), "loss8": float(loss8), "max_grad_rel": max(diffs),
                 "devices": jax.device_count(), "sharded_params": int(n_sharded)}
# From the rules alone, no compile: mHC's phi [n*d, 2n + n^2], its largest own parameter,
# shards with the width like HC's projections (it was once replicated, a full copy per
# device); and in every design each weight AdamW decays (the matrices: the backbone's, HC's
# dynamic projections, MoDA's depth K/V) is split over fsdp. The equal losses above cannot see
# a replicated weight, and the backbone's alone made sharded_params > 0.
from depthbench_jax.residual import registry
from depthbench_jax.train import optimizer
phi, whole = [], {}
for design in registry.names():
  c = tiny_config(**{"model.residual.name": design, "mesh.data": 2, "mesh.fsdp": 2,
                     "mesh.tensor": 2})
  boxed = jax.eval_shape(lambda: Transformer(model_config_from(c.model)).init(
      jax.random.PRNGKey(0), jnp.zeros((8, 32), jnp.int32)))["params"]
  specs = sharding.logical_shardings(boxed, sharding.make_mesh(c.mesh))
  decayed = optimizer.weight_decay_mask(nn.unbox(boxed), registry.get(design).decayed)
  for (path, s), d in zip(jax.tree_util.tree_flatten_with_path(specs)[0],
                          jax.tree.leaves(decayed), strict=True):
    if design == "mhc" and getattr(path[-1], "key", None) == "phi":
      phi.append(list(s.spec))
    if d and "fsdp" not in s.spec:
      whole.setdefault(design, []).append(jax.tree_util.keystr(path))
print(json.dumps({"designs": out, "mhc_phi": phi, "decayed_not_fsdp": whole}))
"""


@pytest.mark.slow  # one subprocess, 6 tiny compiles: ~35 s on 2 cores
def test_state_carrying_designs_match_one_device_on_a_2x2x2_mesh():
  proc = subprocess.run([sys.executable, "-c", _SCRIPT, ",".join(DESIGNS)], cwd=helpers.ROOT,
                        env=helpers.subprocess_env(devices=8), capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-4000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  phi = result["mhc_phi"]
  assert phi and all(spec[-2] is not None for spec in phi), phi
  assert result["decayed_not_fsdp"] == {}, result["decayed_not_fsdp"]
  for design in DESIGNS:
    r = result["designs"][design]
    assert r["devices"] == 8 and r["sharded_params"] > 0, (design, r)
    assert abs(r["loss8"] - r["loss1"]) <= 1e-5 * abs(r["loss1"]), (design, r)
    assert r["max_grad_rel"] < 1e-4, (design, r)
