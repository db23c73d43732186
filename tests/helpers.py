"""Shared test helpers: a tiny config and a way to run the trainer in a fresh process."""

from __future__ import annotations

import json
import importlib
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# A ~60k-parameter byte-level model on the embedded corpus (trains a step in milliseconds), as
# dotted overrides of configs/base.py: tiny_config, tiny_flags and reliability/tiny_suite.py.
TINY = {
    "name": "tiny", "model.vocab_size": 257, "model.d_model": 32, "model.n_layers": 2,
    "model.n_heads": 2, "model.ffn_dim": 64, "data.tokenizer": "byte", "data.seq_len": 32,
    "data.global_batch_size": 8, "data.val_batches": 2, "steps": 20, "warmup_steps": 2,
    "log_every": 1, "eval_every": 10, "checkpoint_every": 10,
    # No TensorBoard, hence no TensorFlow import (train/writer.py): half of a tiny run's process
    # time. The tests that read the events turn it on.
    "tensorboard": False,
}


def required(module: str):
  """``module``, which ``launch/test.sh`` installs (the ``[test]`` extra, or the bootstrap's
  NO_DEPS): a parity test fails when its reference is missing. It skipped, and CI would have
  passed without the HC, AttnRes, MoDA or HF parity checks."""
  try:
    return importlib.import_module(module)
  except ImportError as e:
    raise ImportError(f"{module} is not installed; ./launch/test.sh installs it "
                      f"(launch/bootstrap.sh)") from e


def fake_launch_repo(tmp_path, script: str, python: str):
  """A copy of ``launch/<script>`` under ``tmp_path/repo`` whose bootstrap exits 0 and whose
  venv interpreter is the shell script ``python``: the launch scripts' own logic, no installs
  and no jax. Returns the copied script's path."""
  root = tmp_path / "repo"
  (root / "launch").mkdir(parents=True)
  (root / ".venv" / "bin").mkdir(parents=True)
  copied = root / "launch" / script
  copied.write_text(open(os.path.join(ROOT, "launch", script)).read())
  (root / "launch" / "bootstrap.sh").write_text("#!/bin/sh\nexit 0\n")
  (root / ".venv" / "bin" / "python").write_text(python)
  for path in (copied, root / "launch" / "bootstrap.sh", root / ".venv" / "bin" / "python"):
    path.chmod(0o755)
  return copied


def tiny_config(**overrides):
  """configs/base.py with ``TINY`` and then ``overrides`` (dotted keys) applied."""
  from configs import base
  c = base.get_config()
  for key, value in {**TINY, **overrides}.items():
    target = c
    *path, last = key.split(".")
    for p in path:
      target = target[p]
    target[last] = value
  return c


def model_loss(cfg, params, tokens, gate=None):
  """Training's loss (``train.step.lm_loss``) of ``Transformer(cfg)`` on ``tokens`` [B, T+1];
  with a diagnostics ``gate``, the same mean cross-entropy through the gated call."""
  import jax.numpy as jnp
  from depthbench_jax.model.transformer import Transformer
  from depthbench_jax.train.step import cross_entropy, lm_loss
  if gate is None:
    return lm_loss(params, Transformer(cfg), tokens)
  logits = Transformer(cfg).apply({"params": params}, tokens[:, :-1], gate=gate)
  return jnp.mean(cross_entropy(logits, tokens[:, 1:]))


def assert_training_path_equals_plain_scan(cfg, params, rtol: float, atol: float,
                                           through=None, loss_rtol: float = 1e-6) -> None:
  """Loss (to ``loss_rtol``) and every gradient (each nonzero) of the training path equal the
  plain ``nn.scan``'s, which a gate of ones forces (the same network). through: ``(monkeypatch,
  module, name)`` of the custom layer stack the training path must call."""
  import functools
  import jax
  import jax.numpy as jnp
  import numpy as np
  calls = []
  if through is not None:
    monkeypatch, module, name = through
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(1) or real(*a, **k))
  tokens = jax.random.randint(jax.random.PRNGKey(2), (2, 13), 0, cfg.vocab_size)
  fast = jax.jit(jax.value_and_grad(functools.partial(model_loss, cfg)))(params, tokens)
  assert through is None or calls, f"the training path did not call {through[2]}"
  gate = jnp.ones((cfg.n_layers,))
  plain = jax.jit(jax.value_and_grad(lambda p, t: model_loss(cfg, p, t, gate)))(params, tokens)
  np.testing.assert_allclose(fast[0], plain[0], rtol=loss_rtol)
  for (path, got), want in zip(jax.tree_util.tree_leaves_with_path(fast[1]),
                               jax.tree.leaves(plain[1])):
    assert float(jnp.max(jnp.abs(want))) > 0, jax.tree_util.keystr(path)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol,
                               err_msg=jax.tree_util.keystr(path))


def gradient_temp_bytes(cfg, plain: bool, batch: int = 2, seq: int = 128) -> int:
  """Temporaries of ``model_loss``'s gradient, compiled on abstract params (nothing allocated);
  ``plain``: through the plain ``nn.scan`` (a gate of ones) instead of the training path."""
  import flax.linen as nn
  import jax
  import jax.numpy as jnp
  from depthbench_jax.model.transformer import Transformer
  params = jax.eval_shape(lambda: Transformer(cfg).init(jax.random.PRNGKey(0),
                                                         jnp.zeros((1, 8), jnp.int32))["params"])
  tokens = jax.ShapeDtypeStruct((batch, seq + 1), jnp.int32)
  gate = jnp.ones((cfg.n_layers,)) if plain else None
  grad = jax.jit(jax.grad(lambda p, t: model_loss(cfg, nn.unbox(p), t, gate)))
  return grad.lower(params, tokens).compile().memory_analysis().temp_size_in_bytes


def built_once_per_session(tmp_path_factory, name: str, build) -> str:
  """``<session temp>/<name>``, filled by ``build(path)`` once per test session, however many
  xdist workers ask (pytest-xdist's documented pattern: the workers' base temp directories
  share the session's as parent, and a file lock makes one build while the others wait).

  A module-scoped fixture is rebuilt on every worker that runs one of its tests, and again each
  time a worker comes back to the module after another's test. ``--dist loadgroup`` with an
  ``xdist_group`` mark kept such a module on one worker until pytest 9.2 silently stopped the
  grouping (pytest-xdist#1386): test_train_loop.py's reference run trained 4 times a session."""
  import fcntl
  import shutil
  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent
  path, done = root / name, root / f"{name}.done"
  with open(root / f"{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not done.exists():
      shutil.rmtree(path, ignore_errors=True)  # A build that failed on another worker.
      build(str(path))
      done.touch()
  return str(path)


def saved_run(workdir: str, step: int = 5, earlier: tuple[int, ...] = (), **overrides):
  """A run dir with ``tiny_config(**overrides)``'s config.json and a checkpoint at ``step`` of
  freshly initialised params (what diagnose and evaluate read), and at each of the ``earlier``
  steps too (the same params); returns ``(config, params)``."""
  import flax.linen as nn
  import jax
  from depthbench_jax.model.config import model_config_from
  from depthbench_jax.model.transformer import init_params
  from depthbench_jax.train import checkpoint, summary as summary_lib
  os.makedirs(workdir)
  config = tiny_config(**overrides)
  summary_lib.write_config(workdir, config)
  params = nn.unbox(init_params(model_config_from(config.model), jax.random.PRNGKey(0)))
  manager = checkpoint.make_manager(workdir, keep=1 + len(earlier), async_save=False)
  for at in (*sorted(earlier), step):
    checkpoint.save(manager, at, {"params": params}, None, force=True)
    manager.wait_until_finished()
  return config, params


def fineweb_like(n, offset=0):
  """A FineWeb-Edu-shaped table of documents offset..offset+n-1: text plus the metadata columns
  the real shards carry (write it with ``pyarrow.parquet.write_table``)."""
  import numpy as np
  import pyarrow as pa
  texts = [f"Document {i}: the quick brown fox jumps over the lazy dog. " * (1 + i % 3)
           for i in range(offset, offset + n)]
  return pa.table({"text": texts, "id": [f"<urn:{i}>" for i in range(offset, offset + n)],
                   "url": ["https://example.org"] * n, "score": np.linspace(2.5, 4.5, n),
                   "int_score": np.full(n, 3)})


def snapshot(workdir: str) -> dict:
  """{relative path: (mtime, bytes)} of every file under ``workdir``: equal before and after
  a refused command means nothing there was written, replaced or removed."""
  out = {}
  for root, _, files in os.walk(workdir):
    for name in files:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        out[os.path.relpath(path, workdir)] = (os.stat(path).st_mtime_ns, f.read())
  return out


def tiny_flags(**overrides) -> list[str]:
  """``--config.x=y`` flags turning configs/base.py into ``tiny_config(**overrides)``."""
  return [f"--config.{k}={v}" for k, v in {**TINY, **overrides}.items()]


# One persistent XLA compilation cache for every subprocess of a test session (tests/conftest.py
# makes the directory): killed-and-resumed runs, sweeps and CLIs recompile the same tiny
# programs many times over. The cache key is the HLO plus flags, so results are unchanged.
COMPILATION_CACHE_ENV = "DEPTHBENCH_TEST_COMPILATION_CACHE"


# The tests' tiny programs spend their time in XLA:CPU's code generation, not in running.
# - Optimisation level 0: tests/model + tests/residual took 271 s against 346 s (two workers).
#   Machine code only: the HLO, its buffer assignment and cost analysis are the same.
# - The MLIR fusion emitters off (XLA:CPU's older LLVM IR emitters): the whole suite took 560 s
#   of pytest against 826 s, 16m35s of user CPU against 24m52s (835 tests, same host, same day).
#   The same math; the fusion pass groups a few elementwise ops differently (the tiny Pre-LN
#   gradient: 106 loop fusions against 120, 192 more bytes of temporaries, FLOPs within 0.03%),
#   so no test may pin an HLO-derived figure to the byte. The one test that times a user's
#   compile (diagnostics/test_diagnostics_cost.py) sets its own flags.
# Every process of a test (in-process, subprocesses) compiles with the same flags. XLA aborts on
# a flag it does not know, so a jaxlib (pinned in launch/constraints.txt) that drops one stops
# the first test loudly rather than silently slowing the suite.
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def subprocess_env(devices: int = 1, **extra) -> dict:
  env = dict(os.environ)
  env.update({"JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ROOT,
              "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices} {TEST_XLA_FLAGS}"})
  if os.environ.get(COMPILATION_CACHE_ENV):
    env.update({"JAX_COMPILATION_CACHE_DIR": os.environ[COMPILATION_CACHE_ENV],
                "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"})
  env.update({k: str(v) for k, v in extra.items()})
  return env


def main_command(workdir: str, flags: list[str], config: str = "configs/base.py") -> list[str]:
  return [sys.executable, "-m", "depthbench_jax.main", f"--config={os.path.join(ROOT, config)}",
          f"--workdir={workdir}", *flags]


def run_main(workdir: str, flags: list[str], devices: int = 1, timeout: float = 300,
             check: bool = True, **env) -> subprocess.CompletedProcess:
  proc = subprocess.run(main_command(workdir, flags), cwd=ROOT, env=subprocess_env(devices, **env),
                        capture_output=True, text=True, timeout=timeout)
  if check and proc.returncode != 0:
    raise AssertionError(f"main failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
  return proc


def losses(workdir: str) -> dict[int, float]:
  from depthbench_jax.train.summary import read_metrics
  return read_metrics(workdir, "train/loss")


def session_first_step(stdout: str) -> int | None:
  """The first step a session trained, from its ``step N/M: ... with the jit compile`` line;
  None when it trained none. A resumed session's N is its checkpoint's step + 1: what tells a
  resume from a retrain, whose losses a deterministic run repeats exactly."""
  import re
  found = re.search(r"^step (\d+)/\d+: [\d.]+s with the jit compile", stdout, re.M)
  return int(found.group(1)) if found else None


def summary(workdir: str) -> dict:
  with open(os.path.join(workdir, "summary.json")) as f:
    return json.load(f)


def wait_for_step(workdir: str, step: int, proc: subprocess.Popen, timeout: float = 240) -> None:
  deadline = time.time() + timeout
  while time.time() < deadline:
    if proc.poll() is not None:
      raise AssertionError(f"process ended early: {proc.stderr.read()[-3000:]}")
    if max(losses(workdir), default=0) >= step:
      return
    time.sleep(0.05)
  raise AssertionError(f"step {step} not reached in {timeout}s")


def assert_refused_untouched(proc: subprocess.CompletedProcess, named: str, result: str,
                             before: bytes, files: list[str]) -> None:
  """A post-hoc CLI refused to replace ``result`` (the run's JSON, which held ``before``): exit 2,
  one error line that starts with the flag ``named`` and names the file and the ways out, and
  nothing written in the run directory (``files`` is its listing before)."""
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.strip().splitlines() if l.startswith("error: ")]
  assert len(lines) == 1 and lines[0].startswith(f"error: {named}"), proc.stderr[-2000:]
  assert result in lines[0]
  assert "--overwrite" in lines[0] and "another --out" in lines[0] and "allowed" in lines[0]
  assert open(result, "rb").read() == before
  assert sorted(os.listdir(os.path.dirname(result))) == files


def assert_cli_refuses_before_loading(module: str, tmp_path, flags: list[str], named: str,
                                      starts: str = "error: ") -> None:
  """``python -m module --workdir=tmp_path *flags`` on a directory holding only a summary.json
  (no checkpoint to load): exit 2, stderr one ``error:`` line that starts with ``starts``, names
  ``named`` and what is allowed, and nothing written."""
  (tmp_path / "summary.json").write_text('{"status": "ok"}')
  proc = subprocess.run([sys.executable, "-m", module, f"--workdir={tmp_path}", *flags],
                        cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(starts) and named in lines[0], lines
  assert "allowed" in lines[0]
  assert os.listdir(tmp_path) == ["summary.json"]


class RunReached(Exception):
  """Raised by a CLI's stubbed run (`stub_run`): the command got past every check."""


def stub_run(monkeypatch, module, name: str) -> None:
  """Replaces ``module.name`` (the CLI's timed run) by one raising `RunReached`."""
  def reached(*args, **kwargs):
    raise RunReached
  monkeypatch.setattr(module, name, reached)


def slurm_step(monkeypatch, ntasks: int, procid: int = 0) -> None:
  """The variables an ``srun`` job step of ``ntasks`` tasks sets (what JAX's SLURM detection and
  ``main.slurm_tasks`` read), for process ``procid`` on node0."""
  for name, value in (("SLURM_JOB_ID", "9"), ("SLURM_STEP_NODELIST", "node0"),
                      ("SLURM_NTASKS", str(ntasks)), ("SLURM_PROCID", str(procid)),
                      ("SLURM_LOCALID", "0")):
    monkeypatch.setenv(name, value)
