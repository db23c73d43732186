"""``python -m depthbench_jax.systems.train_memory``: the per-device memory of the train step a
run would compile, on fake devices; bad input is one error line before any compile."""

import os
import subprocess
import sys

import jax
import pytest

from depthbench_jax.systems import train_memory
from tests import helpers

SMOKE = os.path.join(helpers.ROOT, "configs", "smoke.py")


def test_two_fake_devices_hold_params_and_adam_whole_under_data_parallelism():
  """smoke's mesh is data-parallel: each of the 2 devices holds all params and both Adam moments
  in fp32 (12 bytes a parameter) plus its half of the batch, in 2 microbatches of 2 rows; the
  command re-runs itself on 2 fake devices."""
  from configs import smoke
  from depthbench_jax.shapes import param_counts
  params = param_counts(smoke.get_config("arch=preln,shape=4x128").model)["total"]
  proc = subprocess.run(
      [sys.executable, "-m", "depthbench_jax.systems.train_memory", f"--config={SMOKE}",
       "--devices=2", "--designs=preln", "--shapes=4x128", "--grad_accum_steps=2",
       "--budget_gib=0.001"], cwd=helpers.ROOT, capture_output=True, text=True, timeout=300,
      env=helpers.subprocess_env(devices=1))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.startswith("cpu (cpu), jax "), proc.stdout[:200]   # which compiler, code
  (line,) = [l for l in proc.stdout.splitlines() if l.startswith("| preln |")]
  cells = [c.strip() for c in line.strip("|").split("|")]
  assert cells[:4] == ["preln", "4x128", "2, 1, 1", "4 / 2"] and cells[-1].startswith("NO (-"), \
      cells
  state, temp, peak = (float(c) * 2**30 for c in cells[4:7])
  assert 0.99 * 12 * params <= state <= 1.2 * 12 * params, (state, params)
  assert temp > 0 and peak >= 0.99 * (state + temp) - 16 * params   # donated state aliased


def test_the_state_is_donated_and_the_peak_counts_it_once():
  """The subprocess test above bounds the peak from below only: a step that lost its donation
  (two copies of params and Adam alive) or a peak that left the arguments out passed it. Here,
  in this process's one device: the aliased bytes are the whole fp32 state (12 bytes a
  parameter), and the peak lies between the temporaries and state + temporaries."""
  from configs import smoke
  from depthbench_jax.shapes import param_counts
  config = smoke.get_config("arch=preln,shape=4x128")
  params = param_counts(config.model)["total"]
  r = train_memory.row(config, "preln", "4x128", budget_gib=80)
  assert 0.99 * 12 * params <= r["alias_bytes"] <= r["state_bytes"], (r, params)
  assert r["temp_bytes"] < r["peak_bytes"] <= 1.01 * (r["state_bytes"] + r["temp_bytes"]), r


def _scan_gradient(dtype):
  """The gradient of a rematerialised 32-layer scan ``x <- tanh(x W_l)``, x [256, 256]."""
  import jax.numpy as jnp

  def loss(w, x):
    step = jax.checkpoint(lambda x, w_l: (jnp.tanh(x @ w_l), None))
    return jnp.sum(jax.lax.scan(step, x, w)[0].astype(jnp.float32))
  return jax.jit(jax.grad(loss)).lower(jax.ShapeDtypeStruct((32, 256, 256), dtype),
                                       jax.ShapeDtypeStruct((256, 256), dtype))


def test_a_bf16_scan_is_estimated_below_its_fp32_twin_not_with_an_fp32_copy_of_its_stack():
  """XLA:CPU's default compile of the bf16 gradient holds 2.2x the fp32 one's temporaries (an
  fp32 copy of the saved [32, 256, 256] carries, hoisted out of the backward loop); the
  estimate's compile holds 0.57x, and leaves the fp32 program as it was."""
  import jax.numpy as jnp
  temp = lambda compiled: compiled.memory_analysis().temp_size_in_bytes
  bf16, fp32 = _scan_gradient(jnp.bfloat16), _scan_gradient(jnp.float32)
  assert temp(bf16.compile()) > 1.5 * temp(fp32.compile())   # the artefact, still in XLA:CPU
  assert temp(train_memory.compile_for_memory(bf16)) < 0.75 * temp(fp32.compile())
  assert temp(train_memory.compile_for_memory(fp32)) == temp(fp32.compile())


@pytest.mark.parametrize("flags, message", [
    # The config's words after the flags that led to them (it named config fields alone).
    (["--grad_accum_steps=3"], "error: --devices=1 --grad_accum_steps=3 (preln 4x128): "
                               "config.grad_accum_steps=3 does not divide the 8 rows"),
    (["--budget_gib=0"], "error: --budget_gib=0.0; allowed: GiB > 0"),
    (["--designs=resnet"], "error: --designs: unknown ['resnet']; allowed: preln"),
])
def test_bad_input_is_one_error_line_before_any_compile(capsys, monkeypatch, flags, message):
  from depthbench_jax.train import jitted
  monkeypatch.setattr(jitted, "jitted_steps", lambda *a, **k: pytest.fail("reached the compile"))
  assert jax.device_count() == 1   # so the command runs here, not in a process of its own
  with pytest.raises(SystemExit) as exit_:
    train_memory.main([f"--config={SMOKE}", "--devices=1", "--designs=preln", "--shapes=4x128",
                       *flags])
  assert exit_.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len([l for l in err if l.startswith("error:")]) == 1 and err[-1].startswith(message), err


def test_the_table_names_the_compiler_whose_peak_it_shows():
  """Run by gpu_train_memory.sh on XLA:GPU, it still said 'XLA:CPU's buffer assignment'."""
  row = {"design": "preln", "shape": "4x128", "mesh": {"data": 1, "fsdp": 1, "tensor": 1},
         "rows": 8, "microbatches": 1, "state_bytes": 2**30, "temp_bytes": 2**31,
         "peak_bytes": 3 * 2**30, "fits": True}
  gpu, cpu = train_memory.markdown([row], 80, "gpu"), train_memory.markdown([row], 80)
  assert "| yes (+77) |" in gpu and "Peak: XLA:GPU's buffer assignment of the step." in gpu
  assert "Peak: XLA:CPU's buffer assignment of the step, not a GPU's." in cpu
