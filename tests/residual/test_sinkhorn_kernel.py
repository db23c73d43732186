"""mHC's Sinkhorn as a Pallas kernel (run in Pallas's interpreter here) against base's XLA form."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from depthbench_jax.residual.base import sinkhorn_knopp
from depthbench_jax.residual.sinkhorn_kernel import BLOCK, sinkhorn_pallas
from residual_testkit import init, jit, perturb, text_batch, tiny_cfg
from depthbench_jax.model.transformer import Transformer


@pytest.mark.parametrize("shape,iterations,eps", [((2, 3, 4, 4), 20, 0.0),   # one padded tile
                                                  ((BLOCK + 5, 4, 4), 3, 1e-3),  # two tiles
                                                  ((7, 2, 2), 1, 0.0)])
def test_values_and_vjp_equal_the_xla_rounds(shape, iterations, eps):
  keys = jax.random.split(jax.random.PRNGKey(0), 2)
  logits = 2.0 * jax.random.normal(keys[0], shape)
  g = jax.random.normal(keys[1], shape)
  want, want_vjp = jax.vjp(lambda x: sinkhorn_knopp(x, iterations, eps), logits)
  got, got_vjp = jax.vjp(lambda x: sinkhorn_pallas(x, iterations, eps), logits)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(got_vjp(g)[0], want_vjp(g)[0], rtol=1e-5, atol=1e-6)
  if eps == 0.0:                                   # rows exactly stochastic after the last round
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-6)


def test_mhc_with_the_kernel_equals_mhc_without(monkeypatch):
  """The model's loss and every gradient are the same whichever kernel runs the Sinkhorn, and
  the option reaches the model: the Pallas kernel runs for 'pallas' alone (with the option
  dropped, both sides ran the XLA rounds and passed)."""
  from depthbench_jax.residual import mhc
  cfgs = [tiny_cfg("mhc", residual={"sinkhorn_kernel": k}) for k in ("xla", "pallas")]
  params = perturb(init(cfgs[0]), scale=0.1)
  tokens = jnp.asarray(text_batch(2, 12))
  calls = []
  monkeypatch.setattr(mhc, "sinkhorn_pallas",
                      lambda *a, **k: calls.append(1) or sinkhorn_pallas(*a, **k))

  def loss(cfg):
    return jit(jax.value_and_grad(lambda p: jnp.mean(
        Transformer(cfg).apply({"params": p}, tokens) ** 2)))(params)
  (want, want_g) = loss(cfgs[0])
  assert not calls
  (got, got_g) = loss(cfgs[1])
  assert calls
  np.testing.assert_allclose(got, want, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(got_g), jax.tree.leaves(want_g)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_both_kernels_lower_to_triton_for_a_cuda_target(monkeypatch):
  """Cross-platform lowering (no GPU needed): the forward and backward kernels pass Pallas's
  Triton lowering, the step that rejects unsupported ops; Triton's compile is the GPU's."""
  from jax import export
  from depthbench_jax.residual import sinkhorn_kernel
  monkeypatch.setattr(sinkhorn_kernel, "_interpret", lambda: False)
  f = jax.jit(jax.value_and_grad(lambda x: jnp.sum(sinkhorn_pallas(x, 20) ** 2)))
  triton = "__gpu$xla.gpu.triton"
  exported = export.export(f, platforms=["cuda"], disabled_checks=[
      export.DisabledSafetyCheck.custom_call(triton)])(jnp.zeros((2, 300, 4, 4), jnp.float32))
  text = exported.mlir_module()
  assert text.count(f"@{triton}") == 2
  assert 'name = "_forward_kernel"' in text and 'name = "_backward_kernel"' in text


def test_a_bfloat16_input_gives_fp32_values_and_a_bfloat16_gradient():
  """The kernel computes and returns fp32 whatever the input; its VJP hands the cotangent back
  in the input's dtype (base's XLA rounds on the fp32 input as reference)."""
  keys = jax.random.split(jax.random.PRNGKey(3), 2)
  logits = (2.0 * jax.random.normal(keys[0], (3, 4, 4))).astype(jnp.bfloat16)
  g = jax.random.normal(keys[1], (3, 4, 4))
  got, got_vjp = jax.vjp(lambda x: sinkhorn_pallas(x, 5), logits)
  want, want_vjp = jax.vjp(lambda x: sinkhorn_knopp(x, 5), logits.astype(jnp.float32))
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  (dx,) = got_vjp(g)
  assert dx.dtype == jnp.bfloat16
  np.testing.assert_allclose(dx.astype(jnp.float32), want_vjp(g)[0], rtol=1e-2, atol=1e-2)
