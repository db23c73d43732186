"""Layer diagnostics on constructed arrays with known answers (pure functions, no model)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from depthbench_jax.diagnostics import metrics


def test_angular_distance_identical_is_zero_opposite_is_one_orthogonal_is_half():
  a = np.random.RandomState(0).randn(2, 5, 8).astype(np.float32)
  b = np.random.RandomState(1).randn(8).astype(np.float32)
  c = np.random.RandomState(2).randn(8).astype(np.float32)
  c -= c @ b / (b @ b) * b
  assert float(metrics.angular_distance(a, a)) == pytest.approx(0.0, abs=1e-3)
  assert float(metrics.angular_distance(a, -a)) == pytest.approx(1.0, abs=1e-3)
  assert float(metrics.angular_distance(3.0 * a, a)) == pytest.approx(0.0, abs=1e-3)  # scale-free
  assert float(metrics.angular_distance(b, c)) == pytest.approx(0.5, abs=1e-5)


def test_angular_distance_between_the_degenerate_points():
  # arccos(cos)/pi at 60 and 45 degrees: 1/3 and 1/4 ((1 - cos)/2 would give 1/4 and 0.146).
  a = np.array([1.0, 0.0], np.float32)
  assert float(metrics.angular_distance(a, np.array([0.5, np.sqrt(3) / 2], np.float32))) == (
      pytest.approx(1 / 3, abs=1e-6))
  assert float(metrics.angular_distance(a, np.array([1.0, 1.0], np.float32))) == (
      pytest.approx(0.25, abs=1e-6))


def test_angular_distance_is_the_token_mean_of_each_tokens_angle():
  """Token 0 parallel (angle 0), token 1 orthogonal (1/2): the spec's mean of arccos is 1/4.
  Every other case has one cosine for all tokens, so arccos of the mean cosine (1/3) or the
  angle between the flattened tensors (1/3) passed too."""
  a = np.array([[1.0, 0.0], [1.0, 0.0]], np.float32)
  b = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
  assert float(metrics.angular_distance(a, b)) == pytest.approx(0.25, abs=1e-6)
  d = np.asarray(metrics.angular_distance_matrix(jnp.asarray(np.stack([a, b])[:, None])))
  assert d[0, 1] == pytest.approx(0.25, abs=1e-6)


def test_angular_zero_vector_counts_as_half():
  a = np.zeros((4, 8), np.float32)
  assert float(metrics.angular_distance(a, np.ones((4, 8)))) == pytest.approx(0.5)


def test_angular_matrix_and_consecutive():
  rng = np.random.RandomState(0)
  x = rng.randn(1, 3, 4, 16).astype(np.float32)
  hidden = np.concatenate([x, x, -x, rng.randn(1, 3, 4, 16).astype(np.float32)])  # [4, B, T, d]
  d = np.asarray(metrics.angular_distance_matrix(jnp.asarray(hidden)))
  assert d.shape == (4, 4)
  np.testing.assert_allclose(np.diag(d), 0.0, atol=1e-3)
  np.testing.assert_allclose(d, d.T, atol=1e-6)
  assert d[0, 1] == pytest.approx(0.0, abs=1e-3) and d[1, 2] == pytest.approx(1.0, abs=1e-3)
  assert d[0, 3] == pytest.approx(float(metrics.angular_distance(hidden[0], hidden[3])), abs=1e-6)
  np.testing.assert_allclose(metrics.consecutive_angular_distance(d), [d[0, 1], d[1, 2], d[2, 3]])


def test_angular_matrix_asks_full_fp32_dots():
  """The CPU computes fp32 dots exactly at any precision; a GPU's default is TF32, which errs by
  percents on nearly parallel neighbours, so the matrix must ask for HIGHEST itself."""
  text = jax.jit(metrics.angular_distance_matrix).lower(jnp.ones((3, 2, 4, 8))).as_text()
  dots = [line for line in text.splitlines() if "stablehlo.dot_general" in line]
  assert dots and all("precision = [HIGHEST, HIGHEST]" in line for line in dots), dots


def test_causal_row_zero_when_update_unchanged_and_reductions():
  u = np.random.RandomState(0).randn(3, 2, 4, 8).astype(np.float32)
  np.testing.assert_allclose(metrics.causal_score_row(u, u), 0.0, atol=1e-7)
  np.testing.assert_allclose(metrics.causal_score_row(u, np.zeros_like(u)), 1.0, atol=1e-6)
  changed = u.copy()
  changed[1, 0, 0] = -u[1, 0, 0]   # one token of layer 1 flipped: ratio 2 there, 0 elsewhere
  np.testing.assert_allclose(metrics.causal_score_row(u, changed, "max"), [0, 2, 0], atol=1e-6)
  np.testing.assert_allclose(metrics.causal_score_row(u, changed, "mean"), [0, 2 / 8, 0],
                             atol=1e-6)


def test_causal_row_scores_a_zero_clean_update_as_zero():
  # Layer 0's clean update is zero at one of its 2 tokens; skipping moves it there (ratio
  # undefined: scored 0, as the docstring says) and leaves the other token (ratio 0).
  u = np.ones((1, 1, 2, 4), np.float32)
  u[0, 0, 0] = 0.0
  skipped = u.copy()
  skipped[0, 0, 0] = 3.0
  np.testing.assert_allclose(metrics.causal_score_row(u, skipped), [0.0], atol=1e-7)
  skipped[0, 0, 1] = -1.0                    # the other token flips: ratio 2, mean over 2 = 1
  np.testing.assert_allclose(metrics.causal_score_row(u, skipped), [1.0], atol=1e-6)


def test_late_layers_are_the_last_three_quarters():
  assert metrics.late_layers(32).tolist() == [False] * 8 + [True] * 24
  assert np.flatnonzero(metrics.late_layers(70))[0] == 18     # 4 * 18 >= 70 > 4 * 17
  assert np.flatnonzero(metrics.late_layers(4))[0] == 1
  pairs = metrics.late_pairs(32)
  assert pairs.sum() == 24 * 23 // 2
  i, j = np.nonzero(pairs)
  assert (i >= 8).all() and (j > i).all()


def test_only_late_pairs_enter_the_share():
  n = 8
  scores = np.zeros((n, n))
  scores[0, 1:] = 10.0           # an early layer dominates: must not count
  scores[1, 5] = 10.0            # s = 1 < L/4 = 2: early
  assert metrics.share_above(scores, metrics.late_pairs(n), 0.45) == 0.0
  scores[2, 7] = 0.5             # late pair: one of the 15 late pairs
  assert metrics.share_above(scores, metrics.late_pairs(n), 0.45) == pytest.approx(1 / 15)
  curve = metrics.share_curve(scores, metrics.late_pairs(n), [0.0, 0.49, 0.5, 1.0])
  assert curve == pytest.approx([1 / 15, 1 / 15, 0.0, 0.0])   # strictly above


def test_swap_orders_and_permutation_matrix():
  pairs = metrics.swap_pairs(4)
  assert pairs.tolist() == [[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]]
  orders = metrics.swap_orders(pairs, 4)
  assert orders[4].tolist() == [0, 3, 2, 1]
  assert len(metrics.swap_pairs(8, late_only=True)) == 15
  p = metrics.permutation_matrix(pairs, np.array([2.0, 2, 2, 2, 2, 3]), 2.0, 4)
  assert p[2, 3] == pytest.approx(0.5) and p[0, 1] == 0.0 and np.isnan(p[1, 0])
  # Signed, (swapped - loss) / loss: a swap that lowers the loss is negative and counts in no
  # share (|.| read it +0.5; no test had a swapped loss below the clean one).
  lower = metrics.permutation_matrix(np.array([[0, 1]]), np.array([1.0]), 2.0, 2)
  assert lower[0, 1] == pytest.approx(-0.5)
  assert metrics.share_above(lower, np.triu(np.ones((2, 2), bool), 1), 0.15) == 0.0


def test_effective_rank_identity_rank_one_and_scale():
  n = 4
  assert float(metrics.effective_rank(jnp.eye(n))) == pytest.approx(n, rel=1e-5)
  assert float(metrics.effective_rank(5.0 * jnp.eye(n))) == pytest.approx(n, rel=1e-5)
  v = np.random.RandomState(0).randn(n, 1)
  assert float(metrics.effective_rank(v @ v.T)) == pytest.approx(1.0, abs=1e-4)
  assert float(metrics.effective_rank(jnp.full((n, n), 1.0 / n))) == pytest.approx(1.0, abs=1e-4)
  assert float(metrics.effective_rank(jnp.diag(jnp.array([1.0, 1.0, 0.0, 0.0])))) == (
      pytest.approx(2.0, rel=1e-5))


def test_effective_rank_of_an_uneven_spectrum():
  # sigma (3, 1): p = (3/4, 1/4), erank = exp(H(p)) = 1.75476 (sigma^2 weights: 1.38415).
  want = np.exp(-(0.75 * np.log(0.75) + 0.25 * np.log(0.25)))
  assert float(metrics.effective_rank(jnp.diag(jnp.array([3.0, 1.0])))) == pytest.approx(
      want, rel=1e-5)
  assert want == pytest.approx(1.75476, rel=1e-5)


def _tokens_of(m, layers, b=2, t=3):
  """[2L, B, T, n, n] from one matrix per sublayer."""
  return jnp.broadcast_to(jnp.asarray(m), (2 * layers, b, t) + m.shape[-2:])


def test_mixing_identity_product_has_rank_n():
  stats = metrics.mixing_rank_stats(_tokens_of(np.eye(4, dtype=np.float32), 8), 8)
  np.testing.assert_allclose(stats["erank_by_start"], 4.0, rtol=1e-5)
  assert float(stats["erank_late"]) == pytest.approx(4.0, rel=1e-5)
  assert float(stats["amax_forward"]) == pytest.approx(1.0)


def test_mixing_uniform_doubly_stochastic_product_has_rank_one():
  # One uniform-averaging sublayer anywhere in the span collapses the product to rank one.
  n, layers = 4, 8
  mix = np.tile(np.eye(n, dtype=np.float32), (2 * layers, 1, 1))
  mix[13] = np.full((n, n), 1.0 / n)            # layer 6, mlp sublayer
  stats = metrics.mixing_rank_stats(jnp.asarray(mix)[:, None, None], layers)
  erank = np.asarray(stats["erank_by_start"])
  np.testing.assert_allclose(erank[:7], 1.0, atol=1e-4)   # spans that contain sublayer 13
  np.testing.assert_allclose(erank[7:], 4.0, rtol=1e-5)
  assert float(stats["erank_late"]) == pytest.approx(1.0, abs=1e-4)  # late span starts at 2


def test_layer_starts_are_attention_sublayers():
  # The uniform averaging at sublayer 12 (layer 6's attention) belongs to the span from layer 6.
  n, layers = 4, 8
  mix = np.tile(np.eye(n, dtype=np.float32), (2 * layers, 1, 1))
  mix[12] = np.full((n, n), 1.0 / n)
  erank = np.asarray(metrics.mixing_rank_stats(jnp.asarray(mix)[:, None, None],
                                               layers)["erank_by_start"])
  assert erank[6] == pytest.approx(1.0, abs=1e-4) and erank[7] == pytest.approx(4.0, rel=1e-5)


def test_late_span_starts_at_ceil_quarter_depth():
  # L = 70: late layers are l >= 17.5, so the span starts at layer 18 (the floor would be 17).
  n, layers = 4, 70
  mix = np.tile(np.eye(n, dtype=np.float32), (2 * layers, 1, 1))
  mix[34] = np.full((n, n), 1.0 / n)              # layer 17's attention: before the late span
  stats = metrics.mixing_rank_stats(jnp.asarray(mix)[:, None, None], layers)
  assert float(stats["erank_by_start"][17]) == pytest.approx(1.0, abs=1e-4)
  assert float(stats["erank_late"]) == pytest.approx(4.0, rel=1e-5)


def test_mixing_rank_is_each_tokens_erank_then_the_mean():
  """Token A's product is diag(1, 0), token B's diag(0, 1): each has erank 1, so the mean is 1.
  Every other case has one matrix for all tokens, so the erank of the token-mean product
  (diag(.5, .5): 2) passed too; dynamic HC/mHC mixing differs per token."""
  n, layers = 2, 4
  mix = np.tile(np.eye(n, dtype=np.float32), (2 * layers, 1, 2, 1, 1))   # [2L, B=1, T=2, n, n]
  mix[-1, 0, 0] = np.diag([1.0, 0.0])
  mix[-1, 0, 1] = np.diag([0.0, 1.0])
  stats = metrics.mixing_rank_stats(jnp.asarray(mix), layers)
  assert float(stats["erank_late"]) == pytest.approx(1.0, abs=1e-4)
  np.testing.assert_allclose(stats["erank_by_start"], 1.0, atol=1e-4)


def test_amax_gains_are_max_row_and_column_sums():
  """Token A's late product is [[1, 2], [3, -4]]: absolute rows sum to 3 and 7, columns to 4 and
  6 (signed: 3 and 4, so the abs is pinned both ways). Token B's is I: 1 and 1. The gains are the
  token means, 4 and 3.5 (the gains of the mean matrix [[1, 1], [1.5, -1.5]] are 3 and 2.5).
  Layer 0's diag(2, 1) is before the late span (s0 = 2 at L = 8): Q_0 would give 10 forward.
  Before, one token and a matrix whose signed row sums agreed left the abs, the span and the
  token mean unchecked."""
  n, layers = 2, 8
  mix = np.tile(np.eye(n, dtype=np.float32), (2 * layers, 1, 2, 1, 1))   # [2L, B=1, T=2, n, n]
  mix[0] = np.diag([2.0, 1.0])
  mix[-1, 0, 0] = np.array([[1.0, 2.0], [3.0, -4.0]], np.float32)
  stats = metrics.mixing_rank_stats(jnp.asarray(mix), layers)
  assert float(stats["amax_forward"]) == pytest.approx((7.0 + 1.0) / 2)
  assert float(stats["amax_backward"]) == pytest.approx((6.0 + 1.0) / 2)


def test_suffix_products_order():
  rng = np.random.RandomState(0)
  mix = rng.randn(3, 2, 2).astype(np.float32)
  q = np.asarray(metrics.suffix_products(jnp.asarray(mix)))
  np.testing.assert_allclose(q[0], mix[2] @ mix[1] @ mix[0], rtol=1e-5)   # H_new = M H
  np.testing.assert_allclose(q[2], mix[2], rtol=1e-6)


def test_interleave_sublayers():
  attn, mlp = jnp.arange(3.0), 10 + jnp.arange(3.0)
  assert metrics.interleave_sublayers(attn, mlp).tolist() == [0, 10, 1, 11, 2, 12]


def test_dead_prefix():
  own = np.array([[0.0, 0.01], [0.02, 0.0], [0.0, 0.3], [0.2, 0.4], [0.0, 0.01]])
  out = metrics.dead_prefix(own, threshold=0.05)
  assert out["dead_prefix"] == 2
  assert out["dead_layers"] == [0, 1, 4]
  assert out["per_layer"] == pytest.approx([0.01, 0.02, 0.3, 0.4, 0.01])
  assert metrics.dead_prefix(np.zeros((3, 2)))["dead_prefix"] == 3
  # Dead is strictly below the threshold: a layer at it is alive.
  at = metrics.dead_prefix(np.array([[0.05, 0.0], [0.0, 0.04]]), threshold=0.05)
  assert (at["dead_prefix"], at["dead_layers"]) == (0, [1])
