"""The backbone's pieces against hand-computed values, in JAX alone (the HF parity tests pin them
against torch, which they require): RMSNorm's eps inside the root, RoPE's frequencies and
rotation direction, SwiGLU's gate and up roles."""

import jax.numpy as jnp
import numpy as np

from depthbench_jax.model.layers import RMSNorm, SwiGLU, apply_rope, rope_table


def test_rmsnorm_eps_sits_inside_the_root():
  # A tiny RMS makes eps visible: x / sqrt(mean x^2 + eps), not x / (sqrt(mean x^2) + eps).
  x = 1e-3 * np.array([1.0, 2.0, 3.0, 4.0], np.float32)
  norm = RMSNorm(eps=1e-6, use_scale=False)
  y = norm.apply({}, jnp.asarray(x))
  np.testing.assert_allclose(y, x / np.sqrt(7.5e-6 + 1e-6), rtol=1e-5)
  gained = RMSNorm(eps=1e-6)
  y2 = gained.apply({"params": {"scale": jnp.array([1.0, 2.0, 0.5, -1.0])}}, jnp.asarray(x))
  np.testing.assert_allclose(y2, x / np.sqrt(8.5e-6) * np.array([1, 2, 0.5, -1]), rtol=1e-5)


def test_rope_rotates_pairs_i_and_i_plus_half_by_position_times_frequency():
  # head_dim 4, theta 1e4: frequencies theta^(-0/4) = 1 and theta^(-2/4) = 0.01.
  a, b, c, d = 0.3, -1.2, 0.7, 2.0
  x = jnp.array([a, b, c, d], jnp.float32).reshape(1, 1, 1, 4)
  for pos in (0, 1, 5):
    got = np.asarray(apply_rope(x, rope_table(jnp.array([[pos]]), 4, 1e4))).ravel()
    t0, t1 = pos * 1.0, pos * 0.01
    want = [a * np.cos(t0) - c * np.sin(t0), b * np.cos(t1) - d * np.sin(t1),
            c * np.cos(t0) + a * np.sin(t0), d * np.cos(t1) + b * np.sin(t1)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_rope_keeps_norms_and_scores_depend_on_offset_only():
  rng = np.random.default_rng(0)
  q, k = (jnp.asarray(rng.normal(size=(1, 1, 1, 16)), jnp.float32) for _ in range(2))
  rope = lambda x, p: apply_rope(x, rope_table(jnp.array([[p]]), 16, 1e4)).ravel()
  np.testing.assert_allclose(jnp.linalg.norm(rope(q, 37)), jnp.linalg.norm(q), rtol=1e-5)
  score = lambda m, n: float(rope(q, m) @ rope(k, n))
  assert abs(score(9, 4) - score(105, 100)) < 1e-4
  assert abs(score(9, 4) - score(4, 9)) > 1e-3   # the offset's sign matters: a rotation


def test_swiglu_gates_the_up_projection_with_silu_of_the_gate_projection():
  rng = np.random.default_rng(1)
  d, f = 3, 5
  wg, wu, wd = (rng.normal(size=s).astype(np.float32) for s in ((d, f), (d, f), (f, d)))
  x = rng.normal(size=(2, d)).astype(np.float32)
  params = {"gate_proj": {"kernel": wg}, "up_proj": {"kernel": wu},
            "down_proj": {"kernel": wd}}
  y = SwiGLU(d_model=d, ffn_dim=f).apply({"params": params}, jnp.asarray(x))
  g = x @ wg
  np.testing.assert_allclose(y, (g / (1 + np.exp(-g)) * (x @ wu)) @ wd, rtol=1e-5, atol=1e-6)
