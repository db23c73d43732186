"""Residual designs by name. Adding a design: one file in this package + one line below."""

from __future__ import annotations

import importlib

from depthbench_jax.errors import ConfigError
from depthbench_jax.residual.base import Design

# name -> module that defines ``DESIGN`` (a ``base.Design``).
_MODULES = {
    "preln": "depthbench_jax.residual.preln",
}

_cache: dict[str, Design] = {}


def names() -> tuple[str, ...]:
  return tuple(_MODULES)


def get(name: str) -> Design:
  if name not in _MODULES:
    raise ConfigError(f"config.model.residual.name={name!r}; allowed: {', '.join(names())}")
  if name not in _cache:
    _cache[name] = importlib.import_module(_MODULES[name]).DESIGN
  return _cache[name]
