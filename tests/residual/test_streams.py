"""The multi-stream maps with hand-written VJPs (residual/streams.py) against einsum autodiff."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from depthbench_jax.residual import streams

N, B, T, D = 3, 2, 5, 7
HI = jax.lax.Precision.HIGHEST


def _random(seed, *shape):
  return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32)


def ref_collapse(w, h):
  return jnp.einsum("bti,btid->btd", w, h, precision=HI)


def ref_update(m, h, w_out, y):
  return jnp.einsum("btji,btid->btjd", m, h, precision=HI) + w_out[..., None] * y[..., None, :]


def _grads(f, args, cotangent):
  out, vjp = jax.vjp(f, *args)
  return out, vjp(cotangent)


@pytest.mark.parametrize("n", [1, N])
def test_collapse_value_and_vjp(n):
  w, h, g = _random(0, B, T, n), _random(1, B, T, n, D), _random(2, B, T, D)
  out, grads = _grads(streams.collapse_streams, (w, h), g)
  want, want_grads = _grads(ref_collapse, (w, h), g)
  np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
  for got, ref in zip(grads, want_grads):
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [1, N])
def test_update_value_and_vjp(n):
  args = (_random(0, B, T, n, n), _random(1, B, T, n, D), _random(2, B, T, n), _random(3, B, T, D))
  g = _random(4, B, T, n, D)
  out, grads = _grads(streams.stream_update, args, g)
  want, want_grads = _grads(ref_update, args, g)
  np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
  for got, ref in zip(grads, want_grads):
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_update_by_hand():
  """Two streams, one token: H_new[j] = sum_i M[j,i] H[i] + w_out[j] y, dM[j,i] = <H[i], G[j]>."""
  h = jnp.array([[1.0, 2.0], [3.0, -1.0]]).reshape(1, 1, 2, 2)
  m = jnp.array([[0.5, 2.0], [-1.0, 1.0]]).reshape(1, 1, 2, 2)
  w_out, y = jnp.array([2.0, -3.0]).reshape(1, 1, 2), jnp.array([1.0, 1.0]).reshape(1, 1, 2)
  out = streams.stream_update(m, h, w_out, y)
  np.testing.assert_allclose(out[0, 0], [[0.5 + 6 + 2, 1 - 2 + 2], [-1 + 3 - 3, -2 - 1 - 3]])
  g = jnp.array([[1.0, 0.0], [0.0, 1.0]]).reshape(1, 1, 2, 2)
  dm, dh, dw, dy = jax.vjp(streams.stream_update, m, h, w_out, y)[1](g)
  np.testing.assert_allclose(dm[0, 0], [[1.0, 3.0], [2.0, -1.0]])     # <H[i], G[j]>
  np.testing.assert_allclose(dh[0, 0], [[0.5, -1.0], [2.0, 1.0]])    # sum_j M[j,i] G[j]
  np.testing.assert_allclose(dw[0, 0], [1.0, 1.0])
  np.testing.assert_allclose(dy[0, 0], [2.0, -3.0])


def test_copy_and_sum_are_adjoint():
  x, h = _random(0, B, T, D), _random(1, B, T, N, D)
  np.testing.assert_allclose(streams.sum_streams(h), h.sum(-2), rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(streams.copy_streams(x, N), jnp.stack([x] * N, axis=-2))
  (dx,) = jax.vjp(lambda x: streams.copy_streams(x, N), x)[1](h)
  np.testing.assert_allclose(dx, h.sum(-2), rtol=1e-6, atol=1e-6)
  (dh,) = jax.vjp(streams.sum_streams, h)[1](x)
  np.testing.assert_array_equal(dh, jnp.stack([x] * N, axis=-2))


def test_bf16_streams_keep_dtype_and_accumulate_in_fp32():
  w, h = _random(0, B, T, N), _random(1, B, T, N, D).astype(jnp.bfloat16)
  out = streams.collapse_streams(w, h)
  assert out.dtype == jnp.bfloat16
  want = ref_collapse(w, h.astype(jnp.float32)).astype(jnp.bfloat16)
  np.testing.assert_array_equal(out, want)
  _, (dw, dh) = _grads(streams.collapse_streams, (w, h), out)
  assert dw.dtype == jnp.float32 and dh.dtype == jnp.bfloat16
