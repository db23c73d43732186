#!/usr/bin/env bash
# The one accelerator run of the bench: bf16, the 400M Pre-LN and HC shapes (16x1216, 32x896),
# batch 8 x 2048, cuDNN attention; writes $OUT/results-<device>.json (benchmarks/ when OUT is
# unset). For the device tool (benchmarks/README.md):
#   run(command="DEPTHBENCH_COMMIT=<git rev-parse HEAD here> bash benchmarks/gpu_bench.sh",
#       carry=[".whl"], timeout_s=420)
# (the copy of the tree there has no .git; the variable names the commit in the JSON).
# .whl holds the pure-Python wheels the device image lacks (ml_collections), fetched here with
#   pip download --no-deps --only-binary=:all: -d .whl ml_collections==1.1.0
# Test it locally first with: BENCH_PRESET=quick bash benchmarks/gpu_bench.sh
set -euo pipefail
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
PY=${PYTHON:-python3}
OUT_DIR=${OUT:-benchmarks}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
"$PY" -c "import jax; print(jax.__version__, jax.devices())"
"$PY" -m depthbench_jax.bench --preset="${BENCH_PRESET:-gpu400m}" --out="$OUT_DIR" 2>&1 \
  | tee "$OUT_DIR/bench.log"
