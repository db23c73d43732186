#!/usr/bin/env bash
# The one accelerator run of the bench: bf16, the 400M Pre-LN and HC shapes (16x1216, 32x896),
# batch 8 x 2048, cuDNN attention (checked against the blocked XLA attention first); writes
# $OUT/results-<device>.json (benchmarks/ when OUT is unset). For the device tool (benchmarks/README.md):
#   run(command="DEPTHBENCH_COMMIT=<git rev-parse HEAD here> bash benchmarks/gpu_bench.sh",
#       carry=[".whl"], timeout_s=540)
# (the copy of the tree there has no .git; the variable names the commit in the JSON; add
# DEPTHBENCH_DIRTY=1 when `git status --porcelain` here shows edits: the tree copied is timed).
# .whl holds the pure-Python wheels the device image lacks (ml_collections), fetched here with
#   pip download --no-deps --only-binary=:all: -d .whl ml_collections==1.1.0
# Test it locally first with (the cuDNN check fails on a CPU, so it falls back to xla):
#   OUT=/tmp/gb PYTHON=.venv/bin/python BENCH_PRESET=quick \
#   CUDNN_CHECK_ARGS='--batch=1 --seq_len=64 --heads=2 --rounds=1' bash benchmarks/gpu_bench.sh
set -euo pipefail
# shellcheck source=benchmarks/device_env.sh
source "$(dirname "$0")/device_env.sh"
"$PY" -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, \
  'optax', optax.__version__, jax.devices())"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
# cuDNN flash attention vs the blocked XLA attention (values, grads, time); the bench runs
# attention_kernel='fused' (cuDNN) only if that check passes, else 'xla'.
# A usage error of the check (exit 2: a typo in CUDNN_CHECK_ARGS) stops here, not as a failed
# check that spends the device lease on the xla bench.
KERNEL=fused
set +e
# shellcheck disable=SC2086
"$PY" -m depthbench_jax.systems.cudnn_check ${CUDNN_CHECK_ARGS:-} \
  | tee "$OUT_DIR/cudnn_check.jsonl"
CHECK_RC=${PIPESTATUS[0]}
set -e
if [ "$CHECK_RC" -eq 2 ]; then
  echo "cudnn_check refused its arguments (CUDNN_CHECK_ARGS='${CUDNN_CHECK_ARGS:-}'); nothing benched" >&2
  exit 2
elif [ "$CHECK_RC" -ne 0 ]; then
  KERNEL=xla
  echo "cuDNN check failed: benching attention_kernel=xla"
fi
"$PY" -m depthbench_jax.bench --preset="${BENCH_PRESET:-gpu400m}" --attention_kernel="$KERNEL" \
  --out="$OUT_DIR" 2>&1 | tee "$OUT_DIR/bench.log"
