"""Diagnostics end to end on the registered designs, through the same scan hooks.

Fast: the clean pass (sown HC/mHC mixing, AttnRes depth weights) with known answers at init.
Slow: every registered design through the full causal + permutation passes.
"""

import dataclasses
import json

import jax
import numpy as np
import pytest

from depthbench_jax.diagnostics import metrics, probes
from depthbench_jax.model.config import model_config_from
from depthbench_jax.residual import registry
from tests.diagnostics.common import init_params
from tests.helpers import tiny_config

L = 4
CLEAN_ONLY = probes.Options(run_causal=False, run_permutation=False)


def _run(design, options=CLEAN_ONLY, n_layers=L, edit=None, **residual):
  """The diagnostics of ``design`` at init; ``edit(params)`` changes the params first."""
  # A renamed design fails here; a skip once turned its hand-computed checks silent.
  assert design in registry.names(), f"design {design!r} is not registered"
  c = tiny_config(**{"model.n_layers": n_layers})
  c.model.residual = {"name": design, **residual}
  cfg = model_config_from(c.model)
  params = init_params(cfg) if edit is None else edit(init_params(cfg))
  tokens = np.random.RandomState(0).randint(0, 257, (2, 9)).astype(np.int32)
  result = probes.Probes(cfg, options).run(params, tokens)
  json.dumps(result, allow_nan=False)
  return result


def test_hc_mixing_is_identity_at_init_so_erank_is_n():
  r = _run("hc")
  n = 4  # the default n_streams
  assert r["mixing"]["erank_late"] == pytest.approx(n, rel=1e-4)
  np.testing.assert_allclose(r["mixing"]["erank_by_start"], n, rtol=1e-4)
  assert r["mixing"]["amax_forward"] == pytest.approx(1.0, rel=1e-4)
  assert "dead_prefix" not in r


def test_the_probe_multiplies_attention_then_mlp_mixing_in_each_layer():
  """Static HC whose last layer mixes with A_r = P at attention and R at the MLP (every other
  sublayer I): the late map is M_mlp M_attn = R^T P^T, whose gains the probe must give. Every
  other end-to-end case had one matrix at every sublayer, so the probe passing the sown pair as
  (mlp, attn) to interleave_sublayers gave P^T R^T unseen."""
  n = 4
  big_p, big_r = np.eye(n), np.eye(n)
  big_p[0, 1], big_r[1, 2] = 2.0, 3.0

  def edit(params):
    res = params["layers"]["residual"]
    for name, a_r in (("hc_attn", big_p), ("hc_mlp", big_r)):
      res[name]["static_alpha"] = res[name]["static_alpha"].at[-1, :, 1:].set(a_r)
    return params

  gains = lambda q: (np.abs(q).sum(axis=1).max(), np.abs(q).sum(axis=0).max())
  right, swapped = gains(big_r.T @ big_p.T), gains(big_p.T @ big_r.T)
  assert right != swapped                     # the case tells the two orders apart
  r = _run("hc", dynamic=False, edit=edit)
  assert (r["mixing"]["amax_forward"], r["mixing"]["amax_backward"]) == pytest.approx(right)


def _sinkhorn(logits, iterations=20):
  """exp, then ``iterations`` x (columns, rows): numpy, independent of the code under test."""
  m = np.exp(logits - logits.max())
  for _ in range(iterations):
    m = m / m.sum(axis=0, keepdims=True)
    m = m / m.sum(axis=1, keepdims=True)
  return m


def _erank(a):
  sigma = np.linalg.svd(a, compute_uv=False)
  p = sigma / sigma.sum()
  p = p[p > 0]
  return float(np.exp(-np.sum(p * np.log(p))))


@pytest.mark.parametrize("res_init", ["identity", "uniform"])
def test_mhc_mixing_erank_at_init_by_hand(res_init):
  # At init phi = 0: every sublayer's H_res is SK(b_res), the same n x n matrix M for every
  # token (identity: b_res = 6I - 3; uniform: 0, M = 11^T / 4). The span from layer s covers
  # the 2(L - s) sublayers s..L-1, so erank_by_start[s] = erank(M^(2(L - s))): for 'identity'
  # 3.99759, 3.99865, 3.99941, 3.99985 (a span one sublayer off is 1e-4 away), 'uniform' 1.
  r = _run("mhc", res_init=res_init)
  logits = 6.0 * np.eye(4) - 3.0 if res_init == "identity" else np.zeros((4, 4))
  m = _sinkhorn(logits)
  want = [_erank(np.linalg.matrix_power(m, 2 * (L - s))) for s in range(L)]
  np.testing.assert_allclose(r["mixing"]["erank_by_start"], want, rtol=2e-6)
  assert r["mixing"]["erank_late"] == pytest.approx(want[1], rel=2e-6)   # late span from L/4 = 1
  # Products of doubly stochastic matrices keep unit row and column sums: Amax gains 1.
  assert r["mixing"]["amax_forward"] == pytest.approx(1.0, abs=1e-5)
  assert r["mixing"]["amax_backward"] == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("design, state", [
    ("preln", "the residual stream x"), ("moda", "the residual stream x"),
    ("hc", "the sum of the n streams"), ("mhc", "the sum of the n streams"),
    ("attnres_full", "the sum of the present sources"),
    ("attnres_block", "the sum of the present sources")])
def test_diagnostics_json_names_the_state_the_angular_distance_compares(design, state):
  """The spec: for HC/mHC and AttnRes, 'report which one' of a layer's own read and a
  residual-equivalent state; only a docstring said."""
  assert _run(design)["angular"]["state"].startswith(state)


def test_block_attnres_own_block_weight_at_init():
  # L=4, 8 blocks, unit 'layer': one layer per block. Zero queries = uniform over the present
  # sources. Layer l's attention sees b_0..b_l (no partial sum yet: own weight 0), its MLP sees
  # those plus b_(l+1)^1: own weight 1/(l+2). The layer's own weight is the max: 1/(l+2).
  r = _run("attnres_block", block_unit="layer")
  dead = r["dead_prefix"]
  np.testing.assert_allclose(dead["per_layer"], [1 / (l + 2) for l in range(L)], rtol=1e-5)
  np.testing.assert_allclose(dead["per_sublayer"][0::2], 0.0, atol=1e-7)
  assert dead["dead_prefix"] == 0 and dead["dead_layers"] == []
  emb = np.asarray(r["depth_weights"]["embedding_per_sublayer"])
  np.testing.assert_allclose(emb[0::2], [1 / (l + 1) for l in range(L)], rtol=1e-5)
  np.testing.assert_allclose(emb[1::2], [1 / (l + 2) for l in range(L)], rtol=1e-5)
  strict = metrics.dead_prefix(np.reshape(dead["per_sublayer"], (L, 2)), threshold=0.4)
  assert strict["dead_layers"] == [1, 2, 3] and strict["dead_prefix"] == 0
  # The option reaches the probe (only the default 0.05 ever had).
  through = _run("attnres_block", dataclasses.replace(CLEAN_ONLY, dead_threshold=0.4),
                 block_unit="layer")["dead_prefix"]
  assert through["dead_layers"] == [1, 2, 3]
  # The readout's zero query: uniform over b_0 and the L one-layer blocks.
  np.testing.assert_allclose(r["depth_weights"]["readout"], [1 / (L + 1)] * (L + 1), rtol=1e-5)


def test_block_attnres_of_one_sublayer_blocks_reports_no_dead_prefix():
  # L=4, 8 blocks of sublayers: each sublayer its own block (Full AttnRes), no partial sums.
  r = _run("attnres_block")
  assert "dead_prefix" not in r
  assert len(r["depth_weights"]["readout"]) == 2 * L + 1


def test_full_attnres_embedding_weight_at_init():
  r = _run("attnres_full")
  emb = np.asarray(r["depth_weights"]["embedding_per_sublayer"])
  np.testing.assert_allclose(emb, [1 / (k + 1) for k in range(2 * L)], rtol=1e-5)  # v_0..v_k
  np.testing.assert_allclose(r["depth_weights"]["readout"], [1 / (2 * L + 1)] * (2 * L + 1),
                             rtol=1e-5)                                      # v_0..v_2L
  assert "dead_prefix" not in r and "mixing" not in r


@pytest.mark.slow
@pytest.mark.parametrize("design", registry.names())
def test_every_design_full_diagnostics(design):
  """Every probe runs for every design, and one invariant holds for all of them: layer 3 a copy
  of layer 1 (every parameter on the layer axis, the connection weights included), swapping the
  two is the same network, so its score is 0 in the chunked, vmapped swap batches, while other
  swaps change the loss. (This test once checked only that the numbers were finite.)"""
  copy = lambda params: {**params, "layers": jax.tree.map(lambda a: a.at[3].set(a[1]),
                                                          params["layers"])}
  # Block AttnRes in 2 blocks of 2 layers (at L=4 its default 8 blocks are one sublayer each:
  # Full AttnRes, no partial sum, no dead prefix).
  own = {"n_blocks": 2} if design == "attnres_block" else {}
  r = _run(design, probes.Options(causal_chunk=2, permutation_chunk=3), edit=copy, **own)
  assert ("dead_prefix" in r) == (design == "attnres_block")
  for key in ("causal", "permutation"):
    m = probes.from_jsonable_matrix(r[key]["matrix"])
    assert np.isfinite(m[np.triu_indices(L, 1)]).all(), (design, key)
    assert 0.0 <= r[key]["share"] <= 1.0
  p = probes.from_jsonable_matrix(r["permutation"]["matrix"])
  # Other swaps: 6e-4 to 9e-3 of the loss at init, DeepNorm's 9e-7 (its beta-scaled init).
  assert abs(p[1, 3]) < 1e-6 and np.abs(p[0, 1:3]).max() > 1e-7, (design, p)
  assert np.isfinite(np.asarray(r["angular"]["matrix"])).all()
  assert r["causal"]["skip"] == metrics.CAUSAL_SKIPS["zero_update"]   # which skip: recorded
