"""The model passes behind the layer diagnostics, through the backbone's scan hooks only.

Every design is measured the same way (DEVELOPERS.md "Model call"):

* one clean pass ``apply(..., return_layers=True, mutable=['intermediates'])`` gives the LM loss,
  ``hidden`` [L,B,T,d] (``wiring.hidden``: Pre-LN x, HC sum of streams, AttnRes per design) for
  the angular distances, ``update`` [L,B,T,d] for the causal score, and the design's sown values
  (HC/mHC ``mixing``, Block AttnRes ``own_block_weight``, Full and Block AttnRes
  ``depth_weights`` and the readout's ``readout_depth_weights``: ``depth_weights.readout``, the
  final aggregator's mean weight per source, slot 0 the embedding);
* the causal pass runs the L networks with one layer gated off each (``gate = 1 - e_s``), batched
  with ``jax.lax.map(..., batch_size=causal_chunk)``: ``vmap`` inside a chunk, a loop over chunks
  (0: a loop over single networks), one compile;
* the permutation pass runs ``permute_layers(params, order)`` for every swap order the same way
  (``permutation_chunk`` orders per vmapped batch), so the per-layer connection params (HC
  matrices, AttnRes pseudo-queries) move with their layer while position-dependent constants
  stay (see ``permute_layers``).

The loss is the mean next-token cross entropy of the held-out batch ``{'tokens': [B, T+1]}``
(inputs ``tokens[:, :-1]``, targets ``tokens[:, 1:]``), the same as ``train.step.eval_step``.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from depthbench_jax.diagnostics import metrics
from depthbench_jax.model import transformer as transformer_lib
from depthbench_jax.model.config import ModelConfig
from depthbench_jax.residual import attnres, registry

Array = jax.Array


MEMORY_ONLY = ("causal_chunk", "permutation_chunk")


@dataclasses.dataclass(frozen=True)
class Options:
  """Knobs of one diagnostics run (``config.diagnostics`` minus ``every``; see configs/base.py).

  ``causal_chunk`` and ``permutation_chunk`` set only how many networks share one vmapped batch
  (memory and speed, ``MEMORY_ONLY``); every other field changes the numbers or which sections
  the result has (``result_settings``, recorded and compared by ``diagnose.py``).
  """
  causal_threshold: float = metrics.PAPER_CAUSAL_THRESHOLD
  permutation_threshold: float = metrics.PAPER_PERMUTATION_THRESHOLD
  curve_points: int = 101            # share curves over linspace(0, max(1, threshold, top score))
  causal_reduction: str = "mean"     # 'mean' over tokens (spec) | 'max' (Csordas et al.)
  causal_skip: str = "zero_update"   # metrics.CAUSAL_SKIPS: the spec's | 'absent' (Csordas)
  causal_chunk: int = 0              # gated networks per vmapped batch; 0 = one at a time
  permutation_chunk: int = 8         # swap orders per vmapped batch; 0 = one at a time
  permutation_pairs: str = "all"     # 'all' i<j pairs (full heatmap) | 'late' (only the share's)
  dead_threshold: float = 0.05       # Block AttnRes: own-block weight below this = dead layer
  run_causal: bool = True
  run_permutation: bool = True

  @classmethod
  def from_config(cls, diag: Any) -> "Options":
    """From a ``config.diagnostics`` ConfigDict/dict; unknown keys (``every``, ...) are ignored.

    ``thresholds`` = (causal, permutation) is the config's form; a ``causal_threshold`` or
    ``permutation_threshold`` beside it (``diagnose --set``, merged over the run's config) wins.
    """
    fields = {f.name for f in dataclasses.fields(cls)}
    items = dict(diag.items()) if diag is not None else {}
    thresholds = items.pop("thresholds", None)
    kwargs = {}
    if thresholds is not None:
      kwargs["causal_threshold"], kwargs["permutation_threshold"] = (float(t) for t in thresholds)
    kwargs.update({k: v for k, v in items.items() if k in fields})
    return cls(**kwargs)

  def result_settings(self) -> dict:
    """The fields that decide the result: all but ``MEMORY_ONLY``."""
    return {k: v for k, v in dataclasses.asdict(self).items() if k not in MEMORY_ONLY}

  def validate(self) -> None:
    from depthbench_jax.errors import ConfigError
    if self.causal_reduction not in ("mean", "max"):
      raise ConfigError(f"config.diagnostics.causal_reduction={self.causal_reduction!r}; "
                        "allowed: mean, max")
    if self.causal_skip not in metrics.CAUSAL_SKIPS:
      raise ConfigError(f"config.diagnostics.causal_skip={self.causal_skip!r}; allowed: "
                        f"{', '.join(metrics.CAUSAL_SKIPS)}")
    if self.permutation_pairs not in ("all", "late"):
      raise ConfigError(f"config.diagnostics.permutation_pairs={self.permutation_pairs!r}; "
                        "allowed: all, late")
    for name in ("causal_chunk", "permutation_chunk"):
      if getattr(self, name) < 0:
        raise ConfigError(f"config.diagnostics.{name}={getattr(self, name)}; allowed: >= 0 "
                          "(0 = one at a time)")
    if self.curve_points < 2:
      raise ConfigError(f"config.diagnostics.curve_points={self.curve_points}; allowed: >= 2")
    # As config_check.validate_diagnostics; diagnose --set reached them unchecked, and
    # dead_threshold=2 put every Block AttnRes layer in the dead prefix.
    for name in ("causal_threshold", "permutation_threshold"):
      if not getattr(self, name) >= 0:
        raise ConfigError(f"config.diagnostics.{name}={getattr(self, name)}; allowed: >= 0")
    if not 0 <= self.dead_threshold <= 1:
      raise ConfigError(f"config.diagnostics.dead_threshold={self.dead_threshold}; allowed: a "
                        "weight in [0, 1]")


def diagnostics_model_config(cfg: ModelConfig) -> ModelConfig:
  """The same network for forward-only passes: scanned (stacked params) and without remat."""
  return dataclasses.replace(cfg, scan_layers=True, remat_policy="none")


def stacked_params(params: Any, n_layers: int) -> Any:
  """Unboxed params in the scanned layout (``permute_layers`` needs the layer axis)."""
  params = nn.unbox(params)
  if "layers" not in params:
    params = transformer_lib.stack_layers(params, n_layers)
  return params


def heldout_tokens(batch: Any, batch_size: int | None = None) -> np.ndarray:
  """int32 [B, T+1] from a pipeline batch ``{'tokens': ...}`` (or the array), first rows only."""
  tokens = batch["tokens"] if isinstance(batch, dict) else batch
  tokens = np.asarray(tokens, np.int32)
  if tokens.ndim != 2 or tokens.shape[1] < 2:
    raise ValueError(f"held-out batch tokens of shape {tokens.shape}; expected [B, T+1], T >= 1")
  return tokens[:batch_size] if batch_size else tokens


def _find(tree: Any, name: str) -> list[tuple[str, Any]]:
  """All (path, value) leaves-or-subtrees under key ``name`` in a nested dict."""
  found = []

  def walk(node, path):
    if isinstance(node, dict) or hasattr(node, "items"):
      for k, v in node.items():
        if k == name:
          found.append(("/".join(path + (k,)), v))
        else:
          walk(v, path + (k,))

  walk(tree, ())
  return found


def sown(intermediates: Any, name: str) -> tuple[Array, Array] | None:
  """The (attn, mlp) pair of a value sown once per sublayer, stacked [L, ...] by ``nn.scan``."""
  hits = _find(intermediates, name)
  if not hits:
    return None
  if len(hits) > 1:
    raise ValueError(f"intermediates hold {name!r} at several places: {[p for p, _ in hits]}")
  value = hits[0][1]
  if not (isinstance(value, (tuple, list)) and len(value) == 2):
    raise ValueError(f"intermediates {hits[0][0]}: expected a 2-tuple (attn, mlp), got "
                     f"{type(value).__name__} of length {len(value) if hasattr(value, '__len__') else '?'}")
  return value[0], value[1]


class Probes:
  """Compiled diagnostics passes for one model shape; reuse across calls (one compile each).

  Instances for equal ``(cfg, options)`` share their jitted passes (``Probes.create`` is cached),
  so the training hook and a post-hoc call in the same process compile once.
  """

  def __new__(cls, cfg: ModelConfig, options: Options = Options()):
    return cls._create(diagnostics_model_config(cfg), options)

  @classmethod
  @functools.lru_cache(maxsize=8)
  def _create(cls, cfg: ModelConfig, options: Options) -> "Probes":
    options.validate()
    self = super().__new__(cls)
    self.cfg = cfg
    self.options = options
    self.n_layers = cfg.n_layers
    self.model = transformer_lib.Transformer(self.cfg)
    self.pairs = metrics.swap_pairs(self.n_layers, late_only=options.permutation_pairs == "late")
    self.orders = metrics.swap_orders(self.pairs, self.n_layers)
    self._clean = jax.jit(self._clean_pass)
    self._causal = jax.jit(self._causal_pass)
    self._swapped = jax.jit(self._swapped_losses)
    return self

  # -- pure passes ------------------------------------------------------------------------------

  def _loss(self, logits: Array, targets: Array) -> Array:
    """Mean next-token cross entropy ``logsumexp(z) - z[target]`` (no [.., V] log-probs copy)."""
    logits = logits.astype(jnp.float32)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - target_logit)

  def _clean_pass(self, params, tokens):
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    (logits, layers), state = self.model.apply(
        {"params": params}, inputs, return_layers=True, mutable=["intermediates"])
    out = {"loss": self._loss(logits, targets),
           "angular": metrics.angular_distance_matrix(layers["hidden"]),
           "update": layers["update"]}
    inter = state.get("intermediates", {})
    mixing = sown(inter, "mixing")
    if mixing is not None:
      out["mixing"] = metrics.mixing_rank_stats(
          metrics.interleave_sublayers(*mixing), self.n_layers)
    own = sown(inter, "own_block_weight")
    if own is not None:  # [L, B, T] each -> [L, 2]
      out["own_block_weight"] = jnp.stack([jnp.mean(o, axis=(1, 2)) for o in own], axis=-1)
    depth = sown(inter, "depth_weights")
    if depth is not None:  # [L, S, B, T] each -> weight on source 0 (the embedding), [L, 2]
      out["embedding_weight"] = jnp.stack([jnp.mean(w[:, 0], axis=(1, 2)) for w in depth], -1)
    readout = _find(inter, "readout_depth_weights")
    if readout:  # sown once, outside the scan: ([S, B, T],) -> [S]
      out["readout_weight"] = jnp.mean(readout[0][1][0], axis=(1, 2))
    return out

  def _causal_pass(self, params, tokens, update):
    """[L, L] rows s (skipped layer), columns t (measured layer); only ``t > s`` is meaningful."""
    inputs = tokens[:, :-1]
    gates = 1.0 - jnp.eye(self.n_layers, dtype=jnp.float32)

    def row(gate):
      _, layers = self.model.apply({"params": params}, inputs, gate=gate, return_layers=True,
                                   gate_outputs=self.options.causal_skip == "zero_update")
      return metrics.causal_score_row(update, layers["update"], self.options.causal_reduction)

    return jax.lax.map(row, gates, batch_size=self.options.causal_chunk or None)

  def _swapped_losses(self, params, tokens, orders):
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def loss_of(order):
      logits = self.model.apply({"params": transformer_lib.permute_layers(params, order)}, inputs)
      return self._loss(logits, targets)

    return jax.lax.map(loss_of, orders, batch_size=self.options.permutation_chunk or None)

  # -- driver -----------------------------------------------------------------------------------

  def run(self, params: Any, tokens: np.ndarray) -> dict:
    """All diagnostics of ``params`` on held-out ``tokens`` [B, T+1]; a JSON-ready dict."""
    opt, n = self.options, self.n_layers
    params = stacked_params(params, n)
    tokens = jnp.asarray(tokens, jnp.int32)
    timing = {}
    late_pairs = metrics.late_pairs(n)

    t0 = time.perf_counter()
    clean = jax.device_get(self._clean(params, tokens))
    timing["clean_s"] = time.perf_counter() - t0
    loss = float(clean["loss"])
    angular = np.asarray(clean["angular"], np.float64)
    consecutive = metrics.consecutive_angular_distance(angular)
    late = metrics.late_layers(n)
    result = {
        "design": self.cfg.design, "n_layers": n, "batch": list(tokens.shape),
        "late_start": int(np.argmax(late)), "loss": loss,
        "angular": {"matrix": angular, "consecutive": consecutive,
                    # consecutive[l] = D[l, l+1]; late pairs of neighbours have l >= L/4.
                    "late_consecutive_mean": _mean(consecutive[late[:-1]]),
                    "state": registry.get(self.cfg.design).layer.hidden_state},
    }

    if opt.run_causal:
      t0 = time.perf_counter()
      causal = metrics.mask_upper(jax.device_get(
          self._causal(params, tokens, jnp.asarray(clean["update"]))))
      timing["causal_s"] = time.perf_counter() - t0
      result["causal"] = _scored(causal, late_pairs, opt.causal_threshold, opt.curve_points)
      result["causal"]["reduction"] = opt.causal_reduction
      result["causal"]["skip"] = metrics.CAUSAL_SKIPS[opt.causal_skip]

    if opt.run_permutation and len(self.orders):
      t0 = time.perf_counter()
      swapped = np.asarray(jax.device_get(self._swapped(params, tokens, jnp.asarray(self.orders))))
      timing["permutation_s"] = time.perf_counter() - t0
      perm = metrics.permutation_matrix(self.pairs, swapped, loss, n)
      result["permutation"] = _scored(perm, late_pairs, opt.permutation_threshold,
                                      opt.curve_points)
      result["permutation"]["pairs"] = opt.permutation_pairs

    if "mixing" in clean:
      m = clean["mixing"]
      result["mixing"] = {"erank_late": float(m["erank_late"]),
                          "erank_by_start": np.asarray(m["erank_by_start"]),
                          "amax_forward": float(m["amax_forward"]),
                          "amax_backward": float(m["amax_backward"])}
    if "own_block_weight" in clean and attnres.block_schedule_of(self.cfg)[0] >= 2:
      # One-sublayer blocks (Full AttnRes in Block's clothes) have no partial sums to weigh.
      own = np.asarray(clean["own_block_weight"])
      result["dead_prefix"] = metrics.dead_prefix(own, opt.dead_threshold)
      result["dead_prefix"]["per_sublayer"] = own.reshape(-1)
    if "embedding_weight" in clean:  # Full and Block AttnRes: mass on v_0 / b_0, per sublayer
      emb = np.asarray(clean["embedding_weight"]).reshape(-1)
      result["depth_weights"] = {"embedding_per_sublayer": emb,
                                 "non_embedding_per_sublayer": 1.0 - emb}
    if "readout_weight" in clean:  # the final aggregator's weight per source (spec 6.5's check)
      result.setdefault("depth_weights", {})["readout"] = np.asarray(clean["readout_weight"])
    result["timing"] = timing
    return to_jsonable(result)


def _mean(values: np.ndarray) -> float:
  return float(np.mean(values)) if values.size else float("nan")


def _scored(matrix: np.ndarray, late_pairs: np.ndarray, threshold: float,
            curve_points: int) -> dict:
  """Shares over all late pairs and the mean over their finite scores. A non-finite score of a
  late pair (the swapped or skipped run blew up: the largest effect there is) counts above
  every threshold rather than dropping out of the share; ``non_finite`` says how many. The
  share curve's thresholds run from 0 to 1, or further, to the threshold used and the largest
  finite late score (a max-over-tokens causal score passes 1: the curve stopped short of both)."""
  blown = late_pairs & ~np.isfinite(matrix)
  scores = np.where(blown, np.inf, matrix)
  finite = matrix[late_pairs & ~blown]
  top = max(1.0, float(threshold), float(finite.max()) if finite.size else 0.0)
  curve_t = np.linspace(0.0, top, curve_points)
  return {"matrix": matrix, "threshold": float(threshold),
          "share": metrics.share_above(scores, late_pairs, threshold),
          "late_mean": _mean(matrix[late_pairs & ~blown]), "non_finite": int(blown.sum()),
          "curve": {"thresholds": np.asarray(curve_t),
                    "share": metrics.share_curve(scores, late_pairs, curve_t)}}


def to_jsonable(x: Any) -> Any:
  """numpy -> lists, non-finite floats -> None (strict JSON; matrices keep their shape)."""
  if isinstance(x, dict):
    return {k: to_jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [to_jsonable(v) for v in x]
  if isinstance(x, (np.ndarray, jax.Array)):
    return to_jsonable(np.asarray(x).tolist())
  if isinstance(x, (float, np.floating)):
    return float(x) if np.isfinite(x) else None
  if isinstance(x, np.integer):
    return int(x)
  return x


def from_jsonable_matrix(rows: list) -> np.ndarray:
  """A matrix from ``diagnostics.json`` (None -> NaN)."""
  return np.array([[np.nan if v is None else v for v in row] for row in rows], np.float64)
