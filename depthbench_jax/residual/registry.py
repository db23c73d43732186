"""Residual designs by name. Adding a design: one file in this package + one line below."""

from __future__ import annotations

import importlib

from depthbench_jax.errors import ConfigError
from depthbench_jax.residual.base import Design

# name -> module that defines ``DESIGN`` (a ``base.Design``); "module:ATTR" when one family module
# defines several designs.
_MODULES = {
    "preln": "depthbench_jax.residual.preln",
    "lns": "depthbench_jax.residual.lns",
    "sandwich": "depthbench_jax.residual.sandwich",
    "deepnorm": "depthbench_jax.residual.deepnorm",
    "keel": "depthbench_jax.residual.keel",
    "hc": "depthbench_jax.residual.hc",
    "mhc": "depthbench_jax.residual.mhc",
    "attnres_full": "depthbench_jax.residual.attnres:FULL",
    "attnres_block": "depthbench_jax.residual.attnres:BLOCK",
    "moda": "depthbench_jax.residual.moda",
}

_cache: dict[str, Design] = {}


def names() -> tuple[str, ...]:
  return tuple(_MODULES)


def get(name: str) -> Design:
  if name not in _MODULES:
    raise ConfigError(f"config.model.residual.name={name!r}; allowed: {', '.join(names())}")
  if name not in _cache:
    module, _, attr = _MODULES[name].partition(":")
    _cache[name] = getattr(importlib.import_module(module), attr or "DESIGN")
  return _cache[name]
