"""The (data, fsdp, tensor) mesh and the logical-axis rules that place params on it.

Batch rows split over ``data`` x ``fsdp``; weights shard their ``embed`` axis over ``fsdp`` (ZeRO-3
style) and their head / MLP / vocabulary axes over ``tensor`` (Megatron style), as in MaxText.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from depthbench_jax.errors import ConfigError

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

LOGICAL_RULES = (
    ("batch", BATCH_AXES),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("head_dim", None),
    ("layers", None),
    ("norm", None),
    ("streams", None),
)


def mesh_shape(mesh_config, device_count: int) -> tuple[int, int, int]:
  """Resolves one ``-1`` axis to the remaining devices; the product must be the device count."""
  try:
    sizes = [int(mesh_config[a]) for a in MESH_AXES]
  except (KeyError, TypeError, ValueError):  # A suite's own mesh without an axis, or a typo.
    given = {a: mesh_config[a] for a in mesh_config.keys()}
    raise ConfigError(f"config.mesh={given}; allowed: an integer size for each of "
                      f"{', '.join(MESH_AXES)} (at most one -1 = the remaining devices)") from None
  spec = ", ".join(f"{a}={s}" for a, s in zip(MESH_AXES, sizes))
  if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
    raise ConfigError(f"config.mesh=({spec}); allowed: positive sizes with at most one -1")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if device_count % known:
      raise ConfigError(f"config.mesh=({spec}) does not fit {device_count} devices; allowed: "
                        f"sizes whose product divides {device_count}")
    sizes[sizes.index(-1)] = device_count // known
  if math.prod(sizes) != device_count:
    raise ConfigError(f"config.mesh=({spec}) has {math.prod(sizes)} devices but "
                      f"{device_count} are present; allowed: sizes whose product is "
                      f"{device_count} (use -1 for one axis)")
  return tuple(sizes)


def make_mesh(mesh_config, devices=None) -> Mesh:
  devices = jax.devices() if devices is None else devices
  shape = mesh_shape(mesh_config, len(devices))
  return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def data_parallel_size(mesh: Mesh) -> int:
  return mesh.shape["data"] * mesh.shape["fsdp"]


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def logical_shardings(boxed_tree, mesh: Mesh):
  """NamedShardings for a tree of ``nn.LogicallyPartitioned`` (or plain) abstract leaves.

  Leaves without logical names (plain ``self.param``) are replicated. An axis whose size does
  not divide its mesh axis is replicated rather than failing (small heads on a wide tensor axis).
  A logical name with no entry in ``LOGICAL_RULES`` is a ValueError naming the leaf (flax would
  replicate it without a word: a new design's misspelt ``'embd'`` would never shard).
  """
  known = {name for name, _ in LOGICAL_RULES}

  def one(path, leaf):
    if isinstance(leaf, nn.LogicallyPartitioned):
      unknown = [n for n in leaf.names if n is not None and n not in known]
      if unknown:
        raise ValueError(f"param {jax.tree_util.keystr(path)}: logical axis names {unknown} "
                         f"have no sharding rule; allowed: {', '.join(sorted(known))} or None "
                         "(train/sharding.py LOGICAL_RULES)")
      axes = [axis if dim % size == 0 else None
              for dim, axis, _, size in _rule_axes(leaf, mesh)]
      return NamedSharding(mesh, P(*axes))
    return NamedSharding(mesh, P())
  return jax.tree_util.tree_map_with_path(
      one, boxed_tree, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))


def _rule_axes(leaf, mesh: Mesh) -> list[tuple[int, Any, tuple[str, ...], int]]:
  """``(dim, its rule's mesh axis (or axes, or None), those axes' names, their device count)``
  per axis of ``leaf``."""
  spec = nn.logical_to_mesh_axes(leaf.names, LOGICAL_RULES)
  out = []
  for dim, axis in zip(leaf.value.shape, spec):
    names = () if axis is None else axis if isinstance(axis, tuple) else (axis,)
    out.append((dim, axis, names, math.prod(mesh.shape[a] for a in names)))
  return out


def unsharded_by_fsdp(boxed_tree, mesh: Mesh) -> dict[str, tuple[int, int, int, int]]:
  """``{param path: (dim, fsdp size, parameters, bytes)}`` for every param whose rule puts an
  axis on ``fsdp`` but whose size does not divide it, so ``logical_shardings`` keeps it whole on
  every fsdp device (with its gradient and Adam moments: 4 copies at the param dtype on each)."""
  out = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(
      boxed_tree, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned)):
    if isinstance(leaf, nn.LogicallyPartitioned):
      for dim, _, names, size in _rule_axes(leaf, mesh):
        if "fsdp" in names and dim % size:
          n = math.prod(leaf.value.shape)
          out[jax.tree_util.keystr(path)] = (dim, size, n, n * np.dtype(leaf.value.dtype).itemsize)
  return out


def fsdp_warning(boxed_tree, mesh: Mesh) -> str | None:
  """One line naming what ``unsharded_by_fsdp`` keeps whole (None when nothing): on a pod whose
  fsdp size does not divide d_model (1472 over 128 devices) FSDP silently stops sharding."""
  whole = unsharded_by_fsdp(boxed_tree, mesh)
  if not whole:
    return None
  params = sum(n for _, _, n, _ in whole.values())
  dims = sorted({dim for dim, _, _, _ in whole.values()})
  fsdp = mesh.shape["fsdp"]
  # Params, gradients and both Adam moments, each at the param dtype (optax keeps mu and nu in
  # it): 16 bytes a parameter in fp32, 8 in bf16 (the warning said fp32's 16 for both).
  nbytes = 4 * sum(b for _, _, _, b in whole.values())
  return (f"config.mesh fsdp={fsdp} does not divide the sharded axis ({', '.join(map(str, dims))}"
          f") of {len(whole)} params, e.g. {next(iter(whole))}: {params:,} parameters stay whole "
          f"on every device (params, gradients and Adam moments: "
          f"{nbytes / 2**30:.2f} GiB on each instead of 1/{fsdp} of it); "
          f"allowed: an fsdp size dividing {', '.join(map(str, dims))}")
