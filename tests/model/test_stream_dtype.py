"""``model.stream_dtype='float32'``: the residual state between layers in fp32 under bf16
compute (PyTorch autocast's stream), the control for the bf16 stream's rounding in deep shapes.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from depthbench_jax.errors import ConfigError
from depthbench_jax.model import buffer_stack
from depthbench_jax.residual import registry
from tests.helpers import assert_training_path_equals_plain_scan, model_loss, tiny_config
from tests.model.test_buffer_stack import _cfg, _random_params

FP32_STATE = ("deepnorm", "keel")       # fp32 whatever the stream setting (their own docstrings)
FAST = ("preln", "attnres_full")


def bf16_cfg(design, stream):
  """3 layers of ``design`` in bf16; Block AttnRes in 2 blocks of 3 sublayers (its default 8
  would make each sublayer a block: Full AttnRes)."""
  from depthbench_jax.model.config import model_config_from
  own = {"model.residual.n_blocks": 2} if design == "attnres_block" else {}
  config = tiny_config(**{"model.residual.name": design, "model.n_layers": 3,
                          "model.dtype": "bfloat16", "model.stream_dtype": stream, **own})
  return model_config_from(config.model)


@pytest.mark.parametrize("design", [d if d in FAST else pytest.param(d, marks=pytest.mark.slow)
                                    for d in registry.names()])
def test_every_design_carries_its_state_in_fp32_and_its_gradients_are_finite(design):
  from depthbench_jax.model.transformer import Transformer
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 12), 0, 257)
  for stream, want in (("compute", jnp.float32 if design in FP32_STATE else jnp.bfloat16),
                       ("float32", jnp.float32)):
    cfg = bf16_cfg(design, stream)
    params = nn.unbox(Transformer(cfg).init(jax.random.PRNGKey(0), tokens)["params"])
    _, layers = jax.jit(lambda p: Transformer(cfg).apply({"params": p}, tokens,
                                                         return_layers=True))(params)
    assert layers["hidden"].dtype == want, (stream, layers["hidden"].dtype)
    grads = jax.jit(jax.grad(lambda p: model_loss(cfg, p, tokens)))(params)
    assert all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(grads)), stream


# With every branch's output projection zeroed, these designs' state is the embedding after
# every layer (DeepNorm and KEEL scale it; HC and mHC mix their streams).
ZERO_BRANCH_IDENTITY = ("preln", "lns", "sandwich", "attnres_full", "attnres_block", "moda")


@pytest.mark.parametrize("design", [d if d in FAST else pytest.param(d, marks=pytest.mark.slow)
                                    for d in ZERO_BRANCH_IDENTITY])
def test_the_fp32_stream_carries_fp32_values_not_only_the_fp32_dtype(design):
  """The dtype test above passes a write that rounds through bf16 and casts back (x + y taken
  in bf16). With zero branch outputs the last layer's state must be the fp32 embedding rows
  bit for bit; rounded anywhere on the way, it is not."""
  from depthbench_jax.model.transformer import Transformer
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 12), 0, 257)
  cfg = bf16_cfg(design, "float32")
  params = nn.unbox(Transformer(cfg).init(jax.random.PRNGKey(0), tokens)["params"])
  quiet = jax.tree_util.tree_map_with_path(
      lambda path, a: jnp.zeros_like(a) if any(
          k in jax.tree_util.keystr(path) for k in ("o_proj", "down_proj")) else a, params)
  _, layers = jax.jit(lambda p: Transformer(cfg).apply({"params": p}, tokens,
                                                       return_layers=True))(quiet)
  rows = params["embed"]["embedding"][tokens]
  assert bool((rows != rows.astype(jnp.bfloat16)).any())   # the fp32 bits a rounding loses
  assert bool((layers["hidden"][-1] == rows).all())


def test_the_fp32_stream_starts_from_the_tables_rows_unrounded(monkeypatch):
  """x0 is the fp32 table's rows as they are, as autocast's embedding gives them; it was cast
  to bf16 and back, so the fp32 stream started from bf16 values. The compute stream: bf16."""
  from depthbench_jax.model.transformer import Transformer
  from depthbench_jax.residual.base import StateIO
  seen = []
  monkeypatch.setattr(StateIO, "init_state", lambda self, x0: seen.append(x0) or x0)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 12), 0, 257)
  for stream in ("float32", "compute"):
    cfg = bf16_cfg("preln", stream)
    params = nn.unbox(Transformer(cfg).init(jax.random.PRNGKey(0), tokens)["params"])
    table = params["embed"]["embedding"]
    assert table.dtype == jnp.float32
    seen.clear()
    Transformer(cfg).apply({"params": params}, tokens)
    rows = table[tokens]
    want = rows if stream == "float32" else rows.astype(jnp.bfloat16)
    assert seen[0].dtype == want.dtype and bool((seen[0] == want).all()), stream
    assert stream == "compute" or bool((rows != rows.astype(jnp.bfloat16)).any())


def test_full_attnres_buffer_stack_equals_the_plain_scan_with_an_fp32_buffer(monkeypatch):
  """Its backward cast each slot's cotangent to the buffer's dtype before the branch VJP, which
  wants the branch's own (bf16): with an fp32 buffer it raised. Loss and gradients now equal
  the plain scan's, to bf16's precision. The loss to 5e-5, not 1e-6: XLA may skip rounding a
  bf16 intermediate inside a fusion (excess precision), and the two programs fuse differently;
  on six seeds either path's loss differed by 0 to 1.4e-5 relative, whichever way slot 0 was
  built, and by 0 under one set of flags or the other."""
  cfg = dataclasses.replace(_cfg(3), dtype="bfloat16", stream_dtype="float32")
  assert_training_path_equals_plain_scan(
      cfg, _random_params(cfg), rtol=2e-2, atol=2e-3, loss_rtol=5e-5,
      through=(monkeypatch, buffer_stack, "source_buffer_stack"))


def test_stream_dtype_is_checked():
  from depthbench_jax.model.config import model_config_from
  config = tiny_config(**{"model.stream_dtype": "float16"})
  with pytest.raises(ConfigError, match=r"^config.model.stream_dtype='float16'; allowed: "
                                        r"compute, float32$"):
    model_config_from(config.model)
