"""The diagnostics passes end to end on small models with constructed parameters."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from depthbench_jax.diagnostics import probes
from depthbench_jax.model import transformer as tr
from depthbench_jax.model.config import model_config_from
from tests.diagnostics.common import init_params
from tests.helpers import tiny_config

L = 4


def _model(design="preln", n_layers=L, **residual):
  c = tiny_config(**{"model.n_layers": n_layers})
  c.model.residual = {"name": design, **residual}
  cfg = model_config_from(c.model)
  return cfg, init_params(cfg)


def _tokens(b=2, t=9, vocab=257):
  return np.random.RandomState(0).randint(0, vocab, (b, t)).astype(np.int32)


@pytest.fixture(scope="module")
def preln():
  cfg, params = _model()
  return cfg, params, probes.Probes(cfg, probes.Options(causal_chunk=2, permutation_chunk=4))


def test_preln_result_shapes_ranges_and_strict_json(preln):
  cfg, params, pr = preln
  r = pr.run(params, _tokens())
  json.dumps(r, allow_nan=False)
  assert r["design"] == "preln" and r["n_layers"] == L and r["late_start"] == 1
  ang = np.array(r["angular"]["matrix"])
  assert ang.shape == (L, L) and (ang >= -1e-6).all() and (ang <= 1 + 1e-6).all()
  assert len(r["angular"]["consecutive"]) == L - 1
  c = probes.from_jsonable_matrix(r["causal"]["matrix"])
  p = probes.from_jsonable_matrix(r["permutation"]["matrix"])
  assert np.isnan(c[np.tril_indices(L)]).all()
  assert np.isfinite(c[np.triu_indices(L, 1)]).all() and np.isfinite(p[np.triu_indices(L, 1)]).all()
  for key in ("causal", "permutation"):
    curve = r[key]["curve"]
    assert len(curve["thresholds"]) == 101 and curve["thresholds"][0] == 0.0
    assert all(a >= b for a, b in zip(curve["share"], curve["share"][1:]))  # non-increasing
  assert "mixing" not in r and "dead_prefix" not in r
  assert r["loss"] == pytest.approx(np.log(257), rel=0.05)   # init: near uniform
  # The summaries read the late pairs only (L = 4: layers 1..3, pairs (1,2), (1,3), (2,3)).
  cons = r["angular"]["consecutive"]
  assert r["angular"]["late_consecutive_mean"] == pytest.approx((cons[1] + cons[2]) / 2)
  late = [(1, 2), (1, 3), (2, 3)]
  for key, m in (("causal", c), ("permutation", p)):
    values = np.array([m[i, j] for i, j in late])
    assert r[key]["late_mean"] == pytest.approx(values.mean(), rel=1e-6), key
    assert r[key]["share"] == pytest.approx(np.mean(values > r[key]["threshold"])), key
    assert r[key]["curve"]["share"][0] == pytest.approx(np.mean(values > 0.0)), key


def test_angular_matrix_is_the_layer_outputs_and_max_reduction_reaches_the_probe(preln):
  """The angular matrix is over each layer's output state (the model's ``hidden``): no test
  pinned which state the probe read, nor an off-by-one to the layer inputs. And
  ``causal_reduction='max'`` changes the scores, not only the label recorded beside them."""
  from depthbench_jax.diagnostics import metrics
  cfg, params, pr = preln
  tokens = _tokens()
  r = pr.run(params, tokens)
  _, layers = tr.Transformer(cfg).apply({"params": params}, tokens[:, :-1], return_layers=True)
  np.testing.assert_allclose(np.array(r["angular"]["matrix"], dtype=float),
                             metrics.angular_distance_matrix(layers["hidden"]), atol=1e-4)
  by_max = probes.Probes(cfg, probes.Options(causal_chunk=2, run_permutation=False,
                                             causal_reduction="max")).run(params, tokens)
  mean_c = probes.from_jsonable_matrix(r["causal"]["matrix"])
  max_c = probes.from_jsonable_matrix(by_max["causal"]["matrix"])
  upper = np.triu_indices(L, 1)
  assert (max_c[upper] >= mean_c[upper] - 1e-6).all() and (max_c[upper] > mean_c[upper]).any()


def test_a_late_pair_that_blew_up_counts_above_every_threshold():
  """A NaN or inf score (the swapped or skipped run diverged) is the largest effect, not a
  missing pair: it stays in the share's denominator and numerator, and out of the mean."""
  late = np.zeros((L, L), bool)
  late[1, 2] = late[1, 3] = late[2, 3] = True
  matrix = np.full((L, L), np.nan)
  matrix[1, 2], matrix[1, 3], matrix[2, 3] = 0.1, np.nan, 0.5
  r = probes._scored(matrix, late, 0.15, 2)
  assert r["share"] == pytest.approx(2 / 3) and r["late_mean"] == pytest.approx(0.3)
  assert r["non_finite"] == 1 and r["curve"]["share"] == pytest.approx([1.0, 1 / 3])
  matrix[1, 3] = np.inf
  assert probes._scored(matrix, late, 0.15, 2)["share"] == pytest.approx(2 / 3)


def test_the_share_curve_reaches_the_largest_score_and_the_threshold_used():
  """Scores pass 1 (a max over tokens: 1.46) and a threshold may too (1.5): the curve stopped
  at 1, short of both, so it could not show where the share falls to zero."""
  late = np.zeros((L, L), bool)
  late[1, 2] = late[1, 3] = late[2, 3] = True
  matrix = np.full((L, L), np.nan)
  matrix[1, 2], matrix[1, 3], matrix[2, 3] = 0.1, 1.46, 0.5
  curve = probes._scored(matrix, late, 0.45, 3)["curve"]
  assert curve["thresholds"].tolist() == pytest.approx([0.0, 0.73, 1.46])
  assert curve["share"] == pytest.approx([1.0, 1 / 3, 0.0])
  assert probes._scored(matrix, late, 1.5, 3)["curve"]["thresholds"][-1] == 1.5


def test_vmapped_passes_match_direct_calls(preln):
  cfg, params, pr = preln
  tokens = _tokens()
  r = pr.run(params, tokens)
  model = tr.Transformer(probes.diagnostics_model_config(cfg))
  inputs = tokens[:, :-1]
  layers_of = jax.jit(lambda p, g: model.apply({"params": p}, inputs, gate=g, return_layers=True)[1])
  s, t = 1, 3
  clean = layers_of(params, jnp.ones((L,)))
  skipped = layers_of(params, jnp.ones((L,)).at[s].set(0.0))
  u, v = clean["update"][t], skipped["update"][t]
  want = jnp.mean(jnp.linalg.norm(u - v, axis=-1) / jnp.linalg.norm(u, axis=-1))
  assert r["causal"]["matrix"][s][t] == pytest.approx(float(want), rel=1e-4)

  @jax.jit
  def loss_of(p):
    logp = jax.nn.log_softmax(model.apply({"params": p}, inputs))
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], -1))

  loss = lambda p: float(loss_of(p))

  base = loss(params)
  assert r["loss"] == pytest.approx(base, rel=1e-5)
  swapped = loss(tr.permute_layers(params, jnp.array([0, 2, 1, 3])))
  assert r["permutation"]["matrix"][1][2] == pytest.approx((swapped - base) / base, abs=1e-6)


def test_chunking_does_not_change_results(preln):
  cfg, params, pr = preln
  # The default options run the L gated networks one at a time and all 6 swap orders in one
  # vmapped batch (and share their compile with the other test modules' default-option runs of
  # this model).
  whole = probes.Probes(cfg, probes.Options()).run(params, _tokens())
  chunked = pr.run(params, _tokens())
  for key in ("causal", "permutation"):
    np.testing.assert_allclose(probes.from_jsonable_matrix(whole[key]["matrix"]),
                               probes.from_jsonable_matrix(chunked[key]["matrix"]),
                               rtol=1e-4, atol=1e-6)


def test_layer_that_writes_nothing_has_zero_causal_effect(preln):
  cfg, params, pr = preln
  s = 1  # layer s writes nothing, so no later layer can read anything of it
  layers = jax.tree.map(lambda a: a, params["layers"])
  layers["self_attn"]["o_proj"]["kernel"] = layers["self_attn"]["o_proj"]["kernel"].at[s].set(0)
  layers["mlp"]["down_proj"]["kernel"] = layers["mlp"]["down_proj"]["kernel"].at[s].set(0)
  r = pr.run({**params, "layers": layers}, _tokens())
  c = probes.from_jsonable_matrix(r["causal"]["matrix"])
  np.testing.assert_allclose(c[s, s + 1:], 0.0, atol=1e-6)
  assert c[0, 1] == 0.0                               # layer 1's update is 0: nothing changes
  assert (c[0, 2:] > 1e-3).all() and c[2, 3] > 1e-3   # the other layers do matter


@pytest.mark.parametrize("design", ["hc", "deepnorm"])
def test_the_causal_skip_is_the_specs_update_set_to_zero(design):
  """residuals-detail 6.2: skipping layer s replaces its sublayer outputs by 0. A layer that
  writes nothing then changes nothing later (C = 0), in HC (whose layer still mixes the streams)
  and DeepNorm (still post-normalises) as in Pre-LN; 'absent' (Csordas: the state as if the
  layer were not there) undoes that mixing or norm too, and scored the silent layer as causal."""
  cfg, params = _model(design)
  rng = np.random.RandomState(1)   # away from init, where HC's maps and DeepNorm's gains are
  params = jax.tree.map(           # identities and both skips agree
      lambda a: jnp.asarray(a + 0.1 * rng.standard_normal(a.shape), a.dtype), params)
  s = 1
  layers = jax.tree.map(lambda a: a, params["layers"])
  layers["self_attn"]["o_proj"]["kernel"] = layers["self_attn"]["o_proj"]["kernel"].at[s].set(0)
  layers["mlp"]["down_proj"]["kernel"] = layers["mlp"]["down_proj"]["kernel"].at[s].set(0)
  silent = {**params, "layers": layers}
  scores = {}
  for skip in ("zero_update", "absent"):
    r = probes.Probes(cfg, probes.Options(causal_skip=skip, run_permutation=False)).run(
        silent, _tokens())
    scores[skip] = probes.from_jsonable_matrix(r["causal"]["matrix"])
  np.testing.assert_allclose(scores["zero_update"][s, s + 1:], 0.0, atol=1e-6)
  assert (scores["absent"][s, s + 1:] > 1e-3).all()
  assert (scores["zero_update"][0, 2:] > 1e-3).all()   # the layers that write do matter


def test_both_causal_skips_agree_for_pre_ln(preln):
  cfg, params, _ = preln
  got = [probes.from_jsonable_matrix(probes.Probes(cfg, probes.Options(
      causal_skip=skip, run_permutation=False)).run(params, _tokens())["causal"]["matrix"])
         for skip in ("zero_update", "absent")]
  np.testing.assert_allclose(got[0], got[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("design, agree", [("lns", True), ("sandwich", True),
                                           ("attnres_full", False)])
def test_the_two_causal_skips_agree_where_the_docs_say(design, agree):
  """README and CAUSAL_SKIPS: 'absent' is the spec's skip in Pre-LN, LNS and Sandwich-LN (their
  write of a zero output adds nothing: N_post(0) = 0), not in Full AttnRes, whose zero output
  is still a present source, with logit 0, that dilutes every later depth softmax (the docs
  named AttnRes among the first). Away from init, as in the test above."""
  cfg, params = _model(design)
  rng = np.random.RandomState(2)
  params = jax.tree.map(
      lambda a: jnp.asarray(a + 0.1 * rng.standard_normal(a.shape), a.dtype), params)
  got = [probes.from_jsonable_matrix(probes.Probes(cfg, probes.Options(
      causal_skip=skip, run_permutation=False)).run(params, _tokens())["causal"]["matrix"])
         for skip in ("zero_update", "absent")]
  close = np.allclose(np.nan_to_num(got[0]), np.nan_to_num(got[1]), rtol=1e-5, atol=1e-6)
  assert close == agree, np.nanmax(np.abs(got[0] - got[1]))


def test_swapping_identical_layers_scores_zero(preln):
  cfg, params, pr = preln
  i, j = 1, 3
  layers = jax.tree.map(lambda a: a.at[j].set(a[i]), params["layers"])
  r = pr.run({**params, "layers": layers}, _tokens())
  p = probes.from_jsonable_matrix(r["permutation"]["matrix"])
  assert p[i, j] == 0.0
  assert np.abs(p[0, 1]) > 0.0


def test_late_only_pairs_on_unscanned_params(preln):
  cfg, params, _ = preln
  unscanned = tr.unstack_layers(params, L)
  assert "layers_0" in unscanned
  cfg_unscanned = model_config_from(tiny_config(**{"model.n_layers": L,
                                                   "model.scan_layers": False}).model)
  r = probes.Probes(cfg_unscanned, probes.Options(permutation_pairs="late",
                                                  run_causal=False)).run(unscanned, _tokens())
  assert "causal" not in r
  p = probes.from_jsonable_matrix(r["permutation"]["matrix"])
  assert np.isnan(p[0]).all() and np.isfinite(p[1, 2:]).all() and np.isfinite(p[2, 3])
  assert r["permutation"]["share"] is not None


def test_equal_configs_share_compiled_passes(preln):
  # (Not ``is pr``: the cache holds 8 and the module's other tests build more than that.)
  cfg, _, pr = preln
  assert probes.Probes(cfg, pr.options) is probes.Probes(cfg, pr.options)
  assert probes.Probes(cfg, probes.Options(causal_chunk=1)) is not probes.Probes(cfg, pr.options)


def test_bad_options_raise():
  from depthbench_jax.errors import ConfigError
  with pytest.raises(ConfigError, match="causal_reduction"):
    probes.Options(causal_reduction="median").validate()
  with pytest.raises(ConfigError, match="permutation_pairs"):
    probes.Options(permutation_pairs="some").validate()
  with pytest.raises(ConfigError, match="causal_chunk"):
    probes.Probes(model_config_from(tiny_config().model), probes.Options(causal_chunk=-1))
  # 0 is lax.map's batch_size=None, a sequential map (the message once said one vmapped batch).
  with pytest.raises(ConfigError, match=r"0 = one at a time"):
    probes.Options(permutation_chunk=-1).validate()


def test_options_from_config_reads_thresholds_and_ignores_every():
  opts = probes.Options.from_config({"every": 100, "thresholds": (0.3, 0.1), "causal_chunk": 2})
  assert (opts.causal_threshold, opts.permutation_threshold, opts.causal_chunk) == (0.3, 0.1, 2)


def test_a_set_threshold_wins_over_the_run_config_s_pair():
  """``diagnose --set=causal_threshold=0.3`` on a run whose config holds ``thresholds=(0.45,
  0.15)`` once scored (and recorded) 0.45: the pair overwrote the override."""
  from depthbench_jax import diagnose
  config = tiny_config()
  diag = diagnose.diagnostics_options(config, {"causal_threshold": 0.3})
  settings = diagnose.result_settings(diag)
  assert (settings["causal_threshold"], settings["permutation_threshold"]) == (0.3, 0.15)
  opts = probes.Options.from_config({"thresholds": (0.45, 0.15), "permutation_threshold": 0.2})
  assert (opts.causal_threshold, opts.permutation_threshold) == (0.45, 0.2)
