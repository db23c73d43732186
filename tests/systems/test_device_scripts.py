"""The device machine's scripts run end to end on the CPU in miniature.

A device lease is rare and short (15 minutes a session), so a script that fails on a flag, a
file name or a missing output wastes it; here each runs on the quick preset and its outputs are
checked for what the device run is meant to bring back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile

import pytest

from tests.helpers import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_script(script: str, out, **env: str) -> None:
  """Runs ``benchmarks/<script>`` on the CPU with this interpreter, writing to ``out`` (the
  session's compilation cache shared, so the script's later processes reuse its compiles)."""
  env = subprocess_env(**{"OUT": str(out), "PYTHON": sys.executable, **env})
  run = subprocess.run(["bash", f"benchmarks/{script}"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]


def test_device_env_stops_the_script_without_a_gpu_or_its_wheels(tmp_path):
  """A device script whose JAX fell back to the CPU (the CUDA plugin did not start) went on to
  time 400M models on the host CPU until the lease ran out, and one whose .whl did not install
  went on with every process failing on its import. Each now stops at once with one line."""
  script = f"source {ROOT}/benchmarks/device_env.sh; echo reached"
  env = subprocess_env(OUT=str(tmp_path / "out"), PYTHON=sys.executable)
  env.pop("JAX_PLATFORMS")                                    # as on the device: jax chooses
  run = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
  assert run.returncode == 1 and "reached" not in run.stdout, run.stdout + run.stderr
  assert "device_env: JAX's backend is 'cpu', not gpu; stopping" in run.stderr, run.stderr
  (tmp_path / ".whl").mkdir()
  (tmp_path / ".whl" / "broken-1.0-py3-none-any.whl").write_text("not a zip")
  run = subprocess.run(["bash", "-c", script], cwd=tmp_path, env={**env, "JAX_PLATFORMS": "cpu"},
                       capture_output=True, text=True, timeout=120)
  assert run.returncode == 1 and "reached" not in run.stdout, run.stdout + run.stderr
  assert "device_env: installing .whl/*.whl failed; stopping" in run.stderr, run.stderr
  (tmp_path / ".whl" / "broken-1.0-py3-none-any.whl").unlink()
  run = subprocess.run(["bash", "-c", script], cwd=tmp_path, env={**env, "JAX_PLATFORMS": "cpu"},
                       capture_output=True, text=True, timeout=120)
  assert run.returncode == 0 and "reached" in run.stdout, run.stderr   # the CPU on purpose


@pytest.mark.slow
def test_gpu_profile_script_benches_and_profiles_in_miniature(tmp_path):
  # One profile, against Pre-LN, of a design spec whose ':' and '=' the file name must drop.
  run_script("gpu_profile.sh", tmp_path, BENCH_PRESET="quick", BENCH_SHAPE="2x64",
             BENCH_ROUNDS="2", BENCH_DESIGNS="preln,hc", PROFILE_DESIGNS="hc:n_streams=2",
             PROFILE_ONLY_DESIGNS="")
  # The device tool brings back at most 8 files: the log, the JSON and one archive.
  assert sorted(os.listdir(tmp_path)) == ["bench-designs.log", "profiles.tar.gz",
                                          "results-cpu-quick-designs-shapes.json"]
  with open(tmp_path / "results-cpu-quick-designs-shapes.json") as f:
    result = json.load(f)
  assert [(row["design"], row["shape"]) for row in result["train"]] == [
      ("preln", "2x64"), ("hc", "2x64")]
  with tarfile.open(tmp_path / "profiles.tar.gz") as tar:
    members = {m.name: m for m in tar.getmembers() if m.isfile()}
    assert set(members) == {"profiles/profile-hc_n_streams_2.txt",
                            "profiles/hlo-hc_n_streams_2.txt"}
    hc_profile = tar.extractfile(members["profiles/profile-hc_n_streams_2.txt"]).read().decode()
  assert "over preln" in hc_profile and "per part (ms/step)" in hc_profile
  # Per-part times of both passes of the HC sublayers (the profile CLI's own quick run, which
  # this one replaces: it sets the XLA trace flag before jax starts).
  assert "fwd residual.sublayer" in hc_profile and "bwd residual.sublayer" in hc_profile
  assert "residual.maps/hc_attn" in hc_profile


@pytest.mark.slow
def test_gpu_bench_script_checks_cudnn_then_benches_in_miniature(tmp_path):
  """The main device run: the cuDNN check (which fails on a CPU, so the bench falls back to the
  blocked XLA attention and says so), then the bench, whose JSON, plot and log come back."""
  run_script("gpu_bench.sh", tmp_path, BENCH_PRESET="quick",
             CUDNN_CHECK_ARGS="--batch=1 --seq_len=64 --heads=2 --rounds=1")
  assert sorted(os.listdir(tmp_path)) == ["bench.log", "cudnn_check.jsonl",
                                          "results-cpu-quick.json", "results-cpu-quick.png"]
  checks = [json.loads(line) for line in (tmp_path / "cudnn_check.jsonl").read_text().splitlines()]
  assert checks and all("error" in c for c in checks)
  with open(tmp_path / "results-cpu-quick.json") as f:
    result = json.load(f)
  assert result["preset"]["attention_kernel"] == "xla"
  assert [row["design"] for row in result["train"]] == ["preln", "hc"]
  assert "| verdict | value | target |" in (tmp_path / "bench.log").read_text()


def test_gpu_bench_stops_on_a_usage_error_of_the_cudnn_check(tmp_path):
  """A typo in CUDNN_CHECK_ARGS (cudnn_check's exit 2) read as 'cuDNN cannot run here' and
  spent the lease benching the XLA attention; it stops the script now, nothing benched."""
  env = subprocess_env(OUT=str(tmp_path), PYTHON=sys.executable, BENCH_PRESET="quick",
                       CUDNN_CHECK_ARGS="--rounds=0")
  run = subprocess.run(["bash", "benchmarks/gpu_bench.sh"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
  assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
  assert "cudnn_check refused its arguments (CUDNN_CHECK_ARGS='--rounds=0')" in run.stderr
  assert "benching attention_kernel=xla" not in run.stdout
  assert sorted(os.listdir(tmp_path)) == ["cudnn_check.jsonl"]


@pytest.mark.parametrize("script", ["gpu_profile.sh", "gpu_remat_profile.sh"])
def test_a_device_script_whose_bench_fails_exits_nonzero(tmp_path, script):
  """They run every section whatever an earlier one did, and exited with the last one's status
  (gpu_profile.sh: its closing tar's), so a lease whose bench failed looked like a success."""
  failing = tmp_path / "python"
  failing.write_text('#!/bin/sh\ncase "$*" in *depthbench_jax.bench*) exit 1 ;; esac\nexit 0\n')
  failing.chmod(0o755)
  env = subprocess_env(OUT=str(tmp_path / "out"), PYTHON=str(failing))
  run = subprocess.run(["bash", f"benchmarks/{script}"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
  assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]


def test_gpu_profile_script_deletes_only_the_picture_it_wrote(tmp_path):
  """With OUT unset the script writes to benchmarks/, where its cleanup once deleted the
  committed results-nvidia-h200-designs.png. Python stubbed out: only the shell's own work."""
  kept = tmp_path / "results-nvidia-h200-designs.png"
  written = tmp_path / "results-cpu-designs-shapes.png"
  kept.write_bytes(b"committed")
  written.write_bytes(b"this run's")
  run_script("gpu_profile.sh", tmp_path, PYTHON="true", PROFILE_DESIGNS="",
             PROFILE_ONLY_DESIGNS="")
  assert kept.exists() and not written.exists()


def test_gpu_decode_script_times_decoding_in_miniature(tmp_path):
  run_script("gpu_decode.sh", tmp_path, DECODE_PRESET="quick", DECODE_SHAPES="2x32",
             DECODE_CONTEXTS="16", DECODE_ROUNDS="2")
  name = "results-cpu-quick-designs-shapes-decode-contexts-loops"  # all but the batch changed
  assert sorted(os.listdir(tmp_path)) == ["decode.log", f"{name}.json", f"{name}.png"]
  with open(tmp_path / f"{name}.json") as f:
    rows = json.load(f)["rows"]
  assert [(r["design"], r["shape"], r["context"]) for r in rows] == [
      (d, "2x32", 16) for d in ("preln", "hc", "attnres_full")]


def test_gpu_train_memory_script_compiles_in_miniature(tmp_path):
  # As on the device image, which has no grain (train_memory once reached it through the
  # training loop's data pipeline and checkpoints) and no openai-whisper (the GPT-2 merge table:
  # the suites' tokenizer, once loaded by the config check): modules that cannot be imported.
  no_grain = tmp_path / "no_grain"
  no_grain.mkdir()
  (no_grain / "grain.py").write_text("raise ImportError('grain is not on the device image')\n")
  (no_grain / "whisper.py").write_text("raise ImportError('nor is openai-whisper')\n")
  suite = tmp_path / "smoke_gpt2.py"   # the smoke suite with the suites' GPT-2 tokenizer
  suite.write_text("from configs import smoke\nNAME = 'smoke_gpt2'\nsweep = smoke.sweep\n"
                   "def get_config(arg=None):\n  c = smoke.get_config(arg)\n"
                   "  c.data.tokenizer, c.model.vocab_size = 'gpt2', 50257\n  return c\n")
  out = tmp_path / "out"
  out.mkdir()
  run_script("gpu_train_memory.sh", out, MEMORY_CONFIG=str(suite),
             MEMORY_SHAPES="4x128", MEMORY_DESIGNS="preln", MEMORY_GRAD_ACCUM="2",
             PYTHONPATH=f"{no_grain}{os.pathsep}{ROOT}")
  assert os.listdir(out) == ["train_memory.log"]
  rows = [line.split(" | ") for line in (out / "train_memory.log").read_text().splitlines()
          if line.startswith("| ") and "---" not in line][1:]
  # One device, the suite's batch in 2 microbatches, a positive peak.
  assert [(r[0], r[1], r[2], r[3].split(" / ")[1]) for r in rows] == [
      ("| preln", "4x128", "1, 1, 1", "2")]
  assert float(rows[0][6]) > 0
