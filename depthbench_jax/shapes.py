"""Iso-parameter shapes: the width ``d`` that gives ``L`` layers a target parameter count.

DepthBench moves the aspect ratio ``d_model / n_layers`` at (roughly) fixed parameter count.
``iso_param_width(target, n_layers, model)`` searches the width grid ``d = k * granularity``
(default granularity ``2 * n_heads``: every head gets the same, even ``head_dim``, as RoPE needs;
the paper's widths 1216, 1024, 640 for 16 heads are all on this grid) and returns the grid point
whose count is nearest the target. Counts come from the model's own abstract init
(``model.transformer.count_params``, ``jax.eval_shape``: nothing is allocated), so the solver
can never drift from the model; there is no hand formula here.

The count is either ``'total'`` (embedding table and untied LM head included: the 400M suite) or
``'non_embedding'`` (the backbone: the iso-backbone control). It is monotone in ``d``, so a
few Newton steps on ``d ~ sqrt(count)`` plus a walk to the bracketing grid points need about
five abstract inits per depth.

By default the solver counts the Pre-LN backbone, which is what suites fix their shapes with;
``design=`` counts a design's own parameters instead. Over the 400M suite's shapes these add
under 0.2% for HC's mixing weights and AttnRes's queries, but 0.9% to 2.1% for mHC's phi and
11.6% to 13.9% for MoDA's FFN depth-K/V projections (``configs/suite_400m.py``).

CLI: ``python -m depthbench_jax.shapes configs/suite_400m.py`` re-solves a suite's shape sets and
prints widths, counts and errors, flagging any listed shape the solver would not pick.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
import sys
from typing import Any, Sequence

import ml_collections

from depthbench_jax.errors import ConfigError, is_positive_number

COUNTS = ("total", "non_embedding")


@dataclasses.dataclass(frozen=True)
class Shape:
  """A depth x width point, written ``'LxD'`` (``'16x1216'``: 16 layers of width 1216)."""
  n_layers: int
  d_model: int

  @property
  def name(self) -> str:
    return f"{self.n_layers}x{self.d_model}"

  @property
  def aspect_ratio(self) -> float:
    """``d_model / n_layers`` (76.0 for 16x1216, 9.1 for 70x640)."""
    return self.d_model / self.n_layers

  def __str__(self) -> str:
    return self.name


def parse_shape(text: str) -> Shape:
  """``'16x1216'`` -> ``Shape(16, 1216)``; a clear ConfigError otherwise."""
  parts = str(text).lower().split("x")
  if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
    raise ConfigError(f"shape={text!r}; allowed: 'LxD' with positive integers, e.g. '16x1216'")
  return Shape(int(parts[0]), int(parts[1]))


@dataclasses.dataclass(frozen=True)
class FFNRule:
  """How the SwiGLU hidden width follows ``d``.

  ``ratio=None``: the model's own rule (``model.config.swiglu_ffn_dim``: the smallest multiple of
  ``multiple_of`` at or above 8/3 d), left to ``config.model`` so it cannot drift.
  ``ratio=r``: ``ffn = multiple_of * ceil(r * d / multiple_of)``, e.g. Qwen3's ``ffn = 3 d``
  (6144 at d=2048).
  """
  ratio: float | None = None
  multiple_of: int = 64

  def apply(self, model: ml_collections.ConfigDict, d_model: int) -> None:
    model.ffn_multiple_of = self.multiple_of
    if self.ratio is None:
      model.ffn_dim = None
    else:
      model.ffn_dim = self.multiple_of * math.ceil(self.ratio * d_model / self.multiple_of)


@dataclasses.dataclass(frozen=True)
class ShapeSet:
  """A suite's iso-parameter family: the target, what it counts, and the shapes it lists.

  ``shapes`` are written out literally in the suite file (cheap to load); tests re-solve them
  with ``iso_param_width`` and require each to be the solver's pick within ``tolerance``.
  """
  target: float
  count: str
  shapes: tuple[str, ...]
  tolerance: float = 0.02

  def __post_init__(self):
    """One width per depth: a depth listed twice (a duplicate, or a second width) would share
    the report's one cell for that depth, and the shapes table would flag the wrong row."""
    # The family's own fields: a typo there was a KeyError (count='non-embedding') or
    # ZeroDivisionError (target=0) traceback in the sweep, which then rewrote report.md.
    if self.count not in COUNTS:
      raise ConfigError(f"ShapeSet count={self.count!r}; allowed: {', '.join(COUNTS)}")
    if not is_positive_number(self.target):
      raise ConfigError(f"ShapeSet target={self.target!r}; allowed: a finite number > 0")
    if not (is_positive_number(self.tolerance) and self.tolerance < 1):   # 2 meant 2%: 200%
      raise ConfigError(f"ShapeSet tolerance={self.tolerance!r}; allowed: a fraction in (0, 1), "
                        f"e.g. 0.02 for 2%")
    if isinstance(self.shapes, str):   # ("4x128") is a string: read as shapes '4', 'x', ...
      raise ConfigError(f"ShapeSet shapes={self.shapes!r}; allowed: a tuple of 'LxD' strings, "
                        f"e.g. ({self.shapes!r},)")
    seen: dict[int, str] = {}
    for shape in self.parsed():
      if shape.n_layers in seen:
        raise ConfigError(f"ShapeSet shapes={tuple(self.shapes)}: {shape.n_layers} layers listed "
                          f"twice ({seen[shape.n_layers]}, {shape.name}); allowed: one width per "
                          f"depth (the iso-parameter one: python -m depthbench_jax.shapes SUITE)")
      seen[shape.n_layers] = shape.name

  def parsed(self) -> tuple[Shape, ...]:
    return tuple(parse_shape(s) for s in self.shapes)


def shaped_model(model: ml_collections.ConfigDict, shape: Shape, ffn: FFNRule | None = None,
                 design: str | None = None) -> ml_collections.ConfigDict:
  """A copy of ``config.model`` at ``shape`` (head_dim derived from d, FFN by ``ffn``); a deep
  copy keeps base.py's typed None fields (n_kv_heads, head_dim, ffn_dim) overridable by flag."""
  out = copy.deepcopy(model)
  out.n_layers, out.d_model = shape.n_layers, shape.d_model
  out.head_dim = None
  (ffn or FFNRule(multiple_of=model.get("ffn_multiple_of", 64))).apply(out, shape.d_model)
  if design is not None:
    out.residual = ml_collections.ConfigDict({"name": design})
  return out


def param_counts(model: ml_collections.ConfigDict) -> dict[str, int]:
  """``{'total', 'embedding', 'non_embedding'}`` of ``config.model`` via ``jax.eval_shape``."""
  return dict(_param_counts_cached(json.dumps(model.to_dict(), sort_keys=True, default=str)))


def budget_params(config: ml_collections.ConfigDict) -> int:
  """N of the Chinchilla budget ``tokens_per_param * N``: the run's own total parameters, or, with
  ``config.budget_design`` set (the paper suites: 'preln'), that design's total at the run's shape,
  so every design at a shape trains on the same tokens (the paper quotes one budget per suite,
  8B tokens at 400M; MoDA's depth K/V projections would otherwise buy it 12% more tokens)."""
  model, name = config.model, config.get("budget_design") or ""
  if name and name != model.residual.name:
    model = ml_collections.ConfigDict(model.to_dict())
    model.residual = ml_collections.ConfigDict({"name": name})
  return param_counts(model)["total"]


@functools.lru_cache(maxsize=4096)
def _param_counts_cached(model_json: str) -> tuple[tuple[str, int], ...]:
  from depthbench_jax.model.config import model_config_from  # Local: pulls in jax/flax.
  from depthbench_jax.model.transformer import count_params
  model = ml_collections.ConfigDict(json.loads(model_json))
  return tuple(sorted(count_params(model_config_from(model)).items()))


@dataclasses.dataclass(frozen=True)
class Solution:
  """What the solver picked: the shape, its counts, and the relative error on the target."""
  shape: Shape
  target: float
  count: str
  counts: dict
  ffn_dim: int | None

  @property
  def achieved(self) -> int:
    return self.counts[self.count]

  @property
  def rel_error(self) -> float:
    """``achieved / target - 1`` (signed)."""
    return self.achieved / self.target - 1.0

  def row(self) -> dict:
    return {"shape": self.shape.name, "n_layers": self.shape.n_layers,
            "d_model": self.shape.d_model, "aspect_ratio": round(self.shape.aspect_ratio, 2),
            "params_total": self.counts["total"],
            "params_non_embedding": self.counts["non_embedding"],
            "params_embedding": self.counts["embedding"], "target": self.target,
            "count": self.count, "rel_error": self.rel_error}


def default_granularity(model: ml_collections.ConfigDict) -> int:
  """``2 * n_heads``: d splits into ``n_heads`` equal, even head dims (RoPE rotates pairs)."""
  return 2 * int(model.n_heads)


def iso_param_width(target: float, n_layers: int, model: ml_collections.ConfigDict, *,
                    count: str = "total", ffn: FFNRule | None = None, design: str | None = None,
                    granularity: int | None = None) -> Solution:
  """The width on the grid ``k * granularity`` whose ``count`` is nearest ``target``.

  ``model`` is a ``config.model`` (vocab, heads, KV heads, tying, QK-norm are read from it);
  ``design`` (default: ``model.residual.name``, which suites set to 'preln') picks whose
  parameters are counted. Nearest is in relative terms; ties go to the narrower width.
  """
  if count not in COUNTS:
    raise ConfigError(f"count={count!r}; allowed: {', '.join(COUNTS)}")
  if not (isinstance(n_layers, int) and n_layers > 0):
    raise ConfigError(f"n_layers={n_layers!r}; allowed: a positive integer")
  if not is_positive_number(target):   # a string target was a TypeError traceback
    raise ConfigError(f"target={target!r}; allowed: a positive parameter count")
  g = granularity or default_granularity(model)
  if g % int(model.n_heads):
    raise ConfigError(f"granularity={g} is not a multiple of n_heads={model.n_heads}; allowed: "
                      f"a multiple of n_heads (so every head has the same width)")

  def counts_at(k: int) -> dict:
    return param_counts(shaped_model(model, Shape(n_layers, k * g), ffn, design))

  # Newton-like steps on d ~ sqrt(count) from the model's own counts, then a walk on the grid
  # to the bracket count(k) < target <= count(k + 1). The steps only choose where to look; the
  # pick is always between two adjacent grid points counted by eval_shape.
  def within_reach(k: int) -> int:   # the steps too: they overshot the walk's check (9e15)
    if k * g > 1 << 20:
      raise ConfigError(f"target={target:.4g} needs d > {1 << 20}; check target and count")
    return k

  k = max(1, round(1024 / g))
  for _ in range(8):
    k_next = max(1, round(k * math.sqrt(target / counts_at(k)[count])))
    if k_next == k:
      break
    k = within_reach(k_next)
  while k > 1 and counts_at(k)[count] >= target:
    k -= 1
  while counts_at(k + 1)[count] < target:
    k = within_reach(k + 1)
  best = min((k, k + 1), key=lambda j: (abs(counts_at(j)[count] / target - 1.0), j))
  shape = Shape(n_layers, best * g)
  shaped = shaped_model(model, shape, ffn, design)
  from depthbench_jax.model.config import model_config_from
  ffn_dim = model_config_from(shaped).ffn_dim
  return Solution(shape=shape, target=float(target), count=count, counts=counts_at(best),
                  ffn_dim=ffn_dim)


def solve_depths(target: float, depths: Sequence[int], model: ml_collections.ConfigDict,
                 **kwargs) -> list[Solution]:
  """``iso_param_width`` at each depth."""
  return [iso_param_width(target, L, model, **kwargs) for L in depths]


def solve_shape_set(shape_set: ShapeSet, model: ml_collections.ConfigDict,
                    ffn: FFNRule | None = None, **kwargs) -> list[Solution]:
  """Re-solves every depth a ``ShapeSet`` lists (the suite tests compare to its shapes)."""
  return solve_depths(shape_set.target, [s.n_layers for s in shape_set.parsed()], model,
                      count=shape_set.count, ffn=ffn, **kwargs)


def markdown_table(solutions: Sequence[Solution], listed: Sequence[Shape] = ()) -> str:
  from depthbench_jax.sweep import human  # Local: sweep imports this module.
  lines = ["| shape | AR d/L | ffn | total | non-embedding | embedding | target (count) | error |",
           "|---|---|---|---|---|---|---|---|"]
  listed_by_depth = {s.n_layers: s for s in listed}
  for s in solutions:
    flag = ""
    listed_shape = listed_by_depth.get(s.shape.n_layers)
    if listed_shape is not None and listed_shape.name != s.shape.name:
      flag = f" (suite lists {listed_shape.name})"
    c = s.counts
    lines.append(f"| {s.shape.name}{flag} | {s.shape.aspect_ratio:.1f} | {s.ffn_dim} | "
                 f"{human(c['total'], 4)} | {human(c['non_embedding'], 4)} | "
                 f"{human(c['embedding'], 4)} | {human(s.target, 4)} ({s.count}) | "
                 f"{100 * s.rel_error:+.2f}% |")
  return "\n".join(lines)


# What a suite module defines for its shapes to be solved and checked: the shape sets, and per
# set key the model the solver counts and the FFN rule.
SOLVER_NAMES = ("SHAPE_SETS", "solver_model", "ffn_rule")


def suite_tables(suite_module: Any) -> str:
  """Markdown tables re-solving every ``SHAPE_SETS`` entry of a suite config module."""
  from depthbench_jax.sweep import suite_name  # Local: sweep imports this module.
  missing = [name for name in SOLVER_NAMES if not hasattr(suite_module, name)]
  if missing:
    raise ConfigError(f"{suite_module.__file__} has no {', '.join(missing)}; allowed: a suite "
                      f"config with SHAPE_SETS, solver_model(key) and ffn_rule(key), e.g. "
                      f"configs/suite_400m.py")
  out = []
  for key, shape_set in suite_module.SHAPE_SETS.items():
    model = suite_module.solver_model(key)
    solutions = solve_shape_set(shape_set, model, ffn=suite_module.ffn_rule(key))
    out.append(f"### {suite_name(suite_module)} / {key}\n\n"
               f"{markdown_table(solutions, shape_set.parsed())}")
  return "\n\n".join(out)


def main(argv: Sequence[str]) -> int:
  usage = "usage: python -m depthbench_jax.shapes [--config=]configs/SUITE.py"
  if list(argv) in (["-h"], ["--help"]):  # Not a config file named '--help'.
    print(f"{usage}\n\n{__doc__}")
    return 0
  # --config=FILE, as the sweep, systems and train_memory take it (it read as a file name).
  argv = [a[len("--config="):] if a.startswith("--config=") else a for a in argv]
  if len(argv) != 1:   # one error line, as the other CLIs (it printed the usage alone)
    print(f"error: {len(argv)} arguments {list(argv)}; allowed: one suite file, "
          f"python -m depthbench_jax.shapes configs/SUITE.py", file=sys.stderr)
    return 2
  # Through the package (not __main__), so Shape/ShapeSet are the classes the configs use.
  from depthbench_jax import shapes, sweep
  try:
    print(shapes.suite_tables(sweep.load_config_module(argv[0])))
  except ConfigError as err:  # A mistyped path or a bad suite: one line, as the other CLIs.
    print(f"error: {err}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
