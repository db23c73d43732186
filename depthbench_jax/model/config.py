"""``ModelConfig``: the validated, hashable view of ``config.model`` that modules read.

Every check names the field and what is allowed, and runs before anything is compiled.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import ml_collections

from depthbench_jax.errors import ConfigError, is_positive_number

REMAT_POLICIES = ("none", "nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable",
                  "everything_saveable")
DTYPES = ("float32", "bfloat16")
# The residual state between layers: 'compute' = ``dtype`` (bf16 in the suites, as MaxText);
# 'float32' = an fp32 stream under bf16 compute (PyTorch autocast's, Megatron's
# fp32_residual_connection), the control for the bf16 stream's rounding in deep shapes.
STREAM_DTYPES = ("compute", "float32")


def swiglu_ffn_dim(d_model: int, multiple_of: int) -> int:
  """The SwiGLU width: the smallest multiple of ``multiple_of`` >= 8/3 d (LLaMA's rule, which
  truncates 8/3 d to an integer first, gives the same width whenever ``multiple_of`` is a
  multiple of 4, as in every suite; with 1, d=128: 342 here, 341 there).

  Three d x ffn matrices then cost about 8 d^2, so a layer is about 12 d^2 parameters.
  """
  return multiple_of * math.ceil(8 * d_model / 3 / multiple_of)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  vocab_size: int
  d_model: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  ffn_dim: int
  qk_norm: bool
  tie_embeddings: bool
  rope_theta: float
  max_seq_len: int
  norm_eps: float
  init_std: float
  scan_layers: bool
  remat_policy: str
  dtype: str
  param_dtype: str
  attention_kernel: str
  residual: ml_collections.FrozenConfigDict
  stream_dtype: str = "compute"

  @property
  def design(self) -> str:
    return self.residual.name

  def residual_option(self, key: str, default: Any = None) -> Any:
    return self.residual.get(key, default)


def _require(ok: bool, message: str):
  if not ok:
    raise ConfigError(message)


def model_config_from(model: ml_collections.ConfigDict) -> ModelConfig:
  """Validates ``config.model`` and resolves derived fields (head_dim, ffn_dim)."""
  from depthbench_jax.residual import registry  # Local: the registry imports model layers.

  for field in ("vocab_size", "d_model", "n_layers", "n_heads"):
    value = model.get(field)
    _require(isinstance(value, int) and value > 0,
             f"config.model.{field}={value!r}; allowed: a positive integer")
  d, h = model.d_model, model.n_heads
  # None (the default) means the derived value; 0 is no shorthand for it, but an error.
  kv = h if model.get("n_kv_heads") is None else model.n_kv_heads
  _require(isinstance(kv, int) and kv > 0,
           f"config.model.n_kv_heads={kv!r}; allowed: a positive integer dividing n_heads={h}, "
           f"or None (= n_heads)")
  _require(h % kv == 0,
           f"config.model.n_kv_heads={kv} does not divide n_heads={h}; allowed: a divisor of {h}")
  head_dim = model.get("head_dim")
  if head_dim is None:
    _require(d % h == 0,
             f"config.model.n_heads={h} does not divide d_model={d}; allowed: a divisor of "
             f"d_model (or set config.model.head_dim explicitly)")
    # Derived: the width is at fault, which the message names (it offered None, the value set).
    below = d - d % (2 * h)
    near = f"{below} or {below + 2 * h}" if below else f"{2 * h}"
    _require(d // h % 2 == 0,
             f"config.model.head_dim={d // h} (None: d_model={d} / n_heads={h}) is odd; allowed: "
             f"d_model a multiple of 2 x n_heads = {2 * h} (e.g. {near}; RoPE pairs "
             f"dimensions), or an even config.model.head_dim")
    head_dim = d // h
  _require(isinstance(head_dim, int) and head_dim > 0 and head_dim % 2 == 0,
           f"config.model.head_dim={head_dim!r}; allowed: a positive even integer (RoPE), or "
           f"None (= d_model / n_heads)")
  multiple = model.get("ffn_multiple_of", 64)
  _require(isinstance(multiple, int) and multiple > 0,
           f"config.model.ffn_multiple_of={multiple!r}; allowed: a positive integer")
  ffn = (swiglu_ffn_dim(d, multiple) if model.get("ffn_dim") is None else model.ffn_dim)
  _require(isinstance(ffn, int) and ffn > 0,
           f"config.model.ffn_dim={ffn!r}; allowed: a positive integer, or None (the SwiGLU "
           f"8/3 d rule rounded up to ffn_multiple_of)")
  for field in ("norm_eps", "rope_theta", "init_std"):
    value = model[field]
    _require(is_positive_number(value), f"config.model.{field}={value!r}; allowed: a number > 0")
  _require(model.remat_policy in REMAT_POLICIES,
           f"config.model.remat_policy={model.remat_policy!r}; allowed: {', '.join(REMAT_POLICIES)}")
  for field in ("dtype", "param_dtype"):
    _require(model[field] in DTYPES,
             f"config.model.{field}={model[field]!r}; allowed: {', '.join(DTYPES)}")
  kernels = ("xla", "fused")
  kernel = model.get("attention_kernel", "xla")  # Absent from bench records before the field.
  _require(kernel in kernels,
           f"config.model.attention_kernel={kernel!r}; allowed: {', '.join(kernels)}")
  _require(isinstance(model.max_seq_len, int) and model.max_seq_len > 0,   # None: a TypeError
           f"config.model.max_seq_len={model.max_seq_len!r}; allowed: a positive integer")
  stream = model.get("stream_dtype", "compute")  # Absent from configs saved before the field.
  _require(stream in STREAM_DTYPES,
           f"config.model.stream_dtype={stream!r}; allowed: {', '.join(STREAM_DTYPES)}")
  residual = model.residual
  name = residual.get("name")
  _require(name in registry.names(),
           f"config.model.residual.name={name!r}; allowed: {', '.join(registry.names())}")
  design = registry.get(name)
  # The design's own hyperparameters fill whatever the config leaves out (Design.defaults).
  residual = ml_collections.ConfigDict({**design.defaults, **residual.to_dict()})
  design.validate(residual, model.n_layers)
  return ModelConfig(
      vocab_size=model.vocab_size, d_model=d, n_layers=model.n_layers, n_heads=h, n_kv_heads=kv,
      head_dim=head_dim, ffn_dim=ffn, qk_norm=bool(model.qk_norm),
      tie_embeddings=bool(model.tie_embeddings), rope_theta=float(model.rope_theta),
      max_seq_len=model.max_seq_len, norm_eps=float(model.norm_eps),
      init_std=float(model.init_std), scan_layers=bool(model.scan_layers),
      remat_policy=model.remat_policy, dtype=model.dtype, param_dtype=model.param_dtype,
      attention_kernel=kernel,
      residual=ml_collections.FrozenConfigDict(residual), stream_dtype=stream)
