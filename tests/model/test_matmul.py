"""projection_dot_general: lax.dot_general's values and gradients, a 2-D weight-gradient GEMM,
and the dot-saving remat policies still saving the projections."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from depthbench_jax.model.config import model_config_from
from depthbench_jax.model import matmul
from depthbench_jax.model.matmul import projection_dot_general
from depthbench_jax.model.transformer import Transformer
from depthbench_jax.train.step import lm_loss
from tests.helpers import tiny_config


def _grads(dot, x, w, dims):
  f = lambda x, w: jnp.sum(jnp.sin(dot(x, w, dims)))
  return jax.value_and_grad(f, argnums=(0, 1))(x, w)


def test_values_and_gradients_equal_lax_dot_general():
  k = jax.random.split(jax.random.PRNGKey(0), 6)
  cases = [  # Dense [B,T,d] x [d,f]; q_proj [B,T,d] x [d,H,hd]; o_proj [B,T,H,hd] x [H,hd,d]
      (jax.random.normal(k[0], (2, 5, 6)), jax.random.normal(k[1], (6, 7)), (((2,), (0,)), ((), ()))),
      (jax.random.normal(k[2], (2, 5, 6)), jax.random.normal(k[3], (6, 3, 4)),
       (((2,), (0,)), ((), ()))),
      (jax.random.normal(k[4], (2, 5, 3, 4)), jax.random.normal(k[5], (3, 4, 6)),
       (((2, 3), (0, 1)), ((), ()))),
  ]
  for x, w, dims in cases:
    (v_ref, g_ref), (v, g) = _grads(lax.dot_general, x, w, dims), _grads(projection_dot_general,
                                                                        x, w, dims)
    np.testing.assert_allclose(v, v_ref, rtol=1e-5)
    for a, b in zip(g, g_ref):
      assert a.shape == b.shape
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_weight_gradient_is_one_2d_dot_and_other_forms_fall_back():
  x, w = jnp.ones((2, 5, 6)), jnp.ones((6, 7))
  dims = (((2,), (0,)), ((), ()))
  jaxpr = jax.make_jaxpr(jax.grad(lambda w: jnp.sum(projection_dot_general(x, w, dims))))(w)
  dots = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
  dots += [e for eq in jaxpr.jaxpr.eqns for sub in jax.core.jaxprs_in_params(eq.params)
           for e in sub.eqns if e.primitive.name == "dot_general"]
  # Every dot of the weight gradient contracts 2-D operands over one (token) axis (7 outputs:
  # narrow, so the dot writes dW^T; weight_gradient below).
  weight_dots = [e for e in dots if e.outvars[0].aval.shape == (7, 6)]
  assert weight_dots and all(v.aval.ndim == 2 for e in weight_dots for v in e.invars)
  # Contracted axes not trailing in x: plain lax.dot_general, no custom VJP.
  swapped = jax.make_jaxpr(lambda x: projection_dot_general(x, w, (((0,), (0,)), ((), ()))))(
      jnp.ones((6, 3)))
  assert [e.primitive.name for e in swapped.jaxpr.eqns] == ["dot_general"]


def test_batch_axes_and_a_weight_contracted_on_a_later_axis_are_lax_dot_general():
  """Forms the 2-D weight gradient does not cover (batch axes; W contracted on its last axis)
  give lax.dot_general's values and gradients through lax.dot_general itself."""
  k = jax.random.split(jax.random.PRNGKey(2), 4)
  cases = [(jax.random.normal(k[0], (2, 5, 6)), jax.random.normal(k[1], (7, 6)),
            (((2,), (1,)), ((), ()))),                       # x W^T
           (jax.random.normal(k[2], (3, 5, 6)), jax.random.normal(k[3], (6, 3, 7)),
            (((2,), (0,)), ((0,), (1,))))]                   # a batch axis
  for x, w, dims in cases:
    jaxpr = jax.make_jaxpr(lambda x, w: projection_dot_general(x, w, dims))(x, w)
    assert [e.primitive.name for e in jaxpr.jaxpr.eqns] == ["dot_general"]
    (v_ref, g_ref), (v, g) = (jax.jit(lambda x, w, f=f: _grads(f, x, w, dims))(x, w)
                              for f in (lax.dot_general, projection_dot_general))
    np.testing.assert_allclose(v, v_ref, rtol=1e-5)
    for a, b in zip(g, g_ref):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_bfloat16_operands_with_a_float32_result_keep_their_dtypes():
  """``preferred_element_type`` sets the result's dtype; each gradient comes back in its
  operand's dtype (bf16), with lax.dot_general's values."""
  k = jax.random.split(jax.random.PRNGKey(3), 2)
  x = jax.random.normal(k[0], (2, 5, 6)).astype(jnp.bfloat16)
  w = jax.random.normal(k[1], (6, 7)).astype(jnp.bfloat16)
  dims = (((2,), (0,)), ((), ()))
  dot = lambda f: lambda x, w, dims: f(x, w, dims, preferred_element_type=jnp.float32)
  assert projection_dot_general(x, w, dims, preferred_element_type=jnp.float32).dtype == (
      jnp.float32)
  (v_ref, g_ref), (v, g) = (jax.jit(lambda x, w, f=f: _grads(dot(f), x, w, dims))(x, w)
                            for f in (lax.dot_general, projection_dot_general))
  np.testing.assert_allclose(v, v_ref, rtol=1e-5)
  for a, b in zip(g, g_ref):
    assert a.dtype == jnp.bfloat16
    np.testing.assert_allclose(a.astype(jnp.float32), b.astype(jnp.float32), rtol=2e-2,
                               atol=2e-2)


def test_weight_gradient_of_a_narrow_output_is_a_dot_writing_its_transpose():
  """``X^T G`` either way; for M <= NARROW the compiled dot (after XLA's simplifier, which folds
  a plain transpose back into the dot) writes [M, K], the form XLA:CPU runs as a GEMM."""
  k = jax.random.split(jax.random.PRNGKey(1), 2)
  for m in (6, matmul.NARROW, matmul.NARROW + 1):   # NARROW itself is narrow
    x, g = jax.random.normal(k[0], (256, 48)), jax.random.normal(k[1], (256, m))
    fn = jax.jit(matmul.weight_gradient)
    np.testing.assert_allclose(fn(x, g), x.T @ g, rtol=1e-5, atol=1e-4)
    hlo = fn.lower(x, g).compile().as_text()
    dot_shapes = re.findall(r"= f32\[(\d+),(\d+)\][^ ]* (?:dot|fusion)\(", hlo)
    want = (str(m), "48") if m <= matmul.NARROW else ("48", str(m))
    assert want in dot_shapes, (m, dot_shapes)


def test_weight_gradient_contracts_every_leading_token_axis():
  """X [n, B, T, K], G [n, B, T, M] (HC's streams): ``dW = sum_{i,b,t} X^T G``, computed on
  one device as the narrow [M, K] dot with no copy of X (only the narrow G and dW move)."""
  k = jax.random.split(jax.random.PRNGKey(2), 2)
  x, g = jax.random.normal(k[0], (4, 2, 32, 48)), jax.random.normal(k[1], (4, 2, 32, 6))
  fn = jax.jit(matmul.weight_gradient)
  np.testing.assert_allclose(fn(x, g), x.reshape(-1, 48).T @ g.reshape(-1, 6), rtol=1e-5,
                             atol=1e-4)
  hlo = fn.lower(x, g).compile().as_text()
  assert re.search(r"= f32\[6,48\][^ ]* (?:dot|fusion)\(", hlo), hlo
  copied = re.findall(r"f32\[([\d,]*)\][^ ]* (?:copy|transpose)\(", hlo)
  assert copied and all(np.prod([int(d) for d in s.split(",")]) < x.size for s in copied), copied


def _train_flops(policy):
  c = tiny_config(**{"model.n_layers": 2, "model.d_model": 32, "model.n_heads": 4})
  c.model.remat_policy = policy
  cfg = model_config_from(c.model)
  model = Transformer(cfg)
  tokens = jnp.zeros((2, 9), jnp.int32)
  params = nn.unbox(model.init(jax.random.PRNGKey(0), tokens[:, :-1])["params"])
  grad = jax.jit(jax.grad(lambda p: lm_loss(p, model, tokens)))
  return grad.lower(params).compile().cost_analysis()["flops"]


def test_dots_saveable_saves_the_projections():
  """Remat sees the custom VJP as one call; without the PROJECTION name in the policy the
  backward would recompute every projection (more FLOPs than saving everything)."""
  saved, everything, nothing = (_train_flops(p) for p in
                                ("dots_saveable", "everything_saveable", "nothing_saveable"))
  assert saved < nothing
  np.testing.assert_allclose(saved, everything, rtol=0.02)
