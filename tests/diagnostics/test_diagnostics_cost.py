"""Cost: full diagnostics of a 32-layer smoke-sized model (d=64, 4 heads, byte vocab, seq 64,
batch 2), compile included, within 2 minutes on 2 CPU cores.

The bound is asserted on this process's CPU time (all threads): on an otherwise idle 2-core
machine wall time is at most that, and unlike wall time it does not grow when other jobs share
the cores. Wall time gets a loose bound too, so a hang still fails.
"""

import time

import numpy as np
import pytest

from depthbench_jax.diagnostics import probes
from depthbench_jax.model.config import model_config_from
from depthbench_jax.residual import registry
from tests.diagnostics.common import init_params
from tests.helpers import tiny_config


@pytest.mark.slow
@pytest.mark.parametrize("design", ["preln", "attnres_full"])  # cheapest and a costliest state
def test_32_layer_diagnostics_under_two_minutes(design):
  if design not in registry.names():
    pytest.skip(f"{design} not registered")
  c = tiny_config(**{"model.n_layers": 32, "model.d_model": 64, "model.n_heads": 4,
                     "model.ffn_dim": None})
  c.model.residual = {"name": design}
  cfg = model_config_from(c.model)
  params = init_params(cfg)
  tokens = np.random.RandomState(0).randint(0, 257, (2, 65)).astype(np.int32)
  wall0, cpu0 = time.perf_counter(), time.process_time()
  result = probes.Probes(cfg, probes.Options.from_config(c.diagnostics)).run(params, tokens)
  wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
  print(f"{design}: wall {wall:.1f}s cpu {cpu:.1f}s {result['timing']}")
  assert len(result["permutation"]["matrix"]) == 32
  assert cpu < 120.0, f"{design}: {cpu:.1f}s CPU"
  assert wall < 600.0
