"""Layer diagnostics inside the training loop: every ``config.diagnostics.every`` steps.

``train/loop.py`` builds ``DiagnosticsHook(config, model_cfg, val_batches[0])`` once and calls
``hook(step, params, writer)``; the passes compile on the first call and are reused after.
The held-out batch is fixed: the first ``config.diagnostics.batch_size`` rows of that batch.
"""

from __future__ import annotations

import time
from typing import Any

from absl import logging
import jax

from depthbench_jax.diagnostics import plots
from depthbench_jax.diagnostics import probes


def scalars_of(result: dict) -> dict[str, float]:
  """The TensorBoard scalars of one result (``diagnostics/...``; missing values skipped)."""
  out = {"diagnostics/loss": result.get("loss"),
         "diagnostics/angular_late_consecutive": result["angular"]["late_consecutive_mean"]}
  for key in ("causal", "permutation"):
    if key in result:
      out[f"diagnostics/{key}_share"] = result[key]["share"]
      out[f"diagnostics/{key}_late_mean"] = result[key]["late_mean"]
  if "mixing" in result:
    out["diagnostics/erank_late"] = result["mixing"]["erank_late"]
    out["diagnostics/amax_forward"] = result["mixing"]["amax_forward"]
  if "dead_prefix" in result:
    out["diagnostics/dead_prefix"] = result["dead_prefix"]["dead_prefix"]
  return {k: float(v) for k, v in out.items() if v is not None}


class DiagnosticsHook:
  """Runs all diagnostics on a fixed held-out batch; scalars and heatmap images to the writer."""

  def __init__(self, config: Any, model_cfg: Any, batch: Any):
    diag = config.diagnostics
    self.tokens = probes.heldout_tokens(jax.device_get(batch), int(diag.batch_size))
    self.probes = probes.Probes(model_cfg, probes.Options.from_config(diag))

  def __call__(self, step: int, params: Any, writer: Any) -> dict:
    t0 = time.perf_counter()
    result = self.probes.run(params, self.tokens)
    result["step"] = int(step)
    if jax.process_index() == 0:
      writer.write_scalars(step, scalars_of(result))
      writer.write_images(step, {f"diagnostics/{k}": v for k, v in plots.images(result).items()})
    logging.info("diagnostics at step %d in %.1fs: %s", step, time.perf_counter() - t0,
                 {k.split("/")[1]: round(v, 4) for k, v in scalars_of(result).items()})
    return result
