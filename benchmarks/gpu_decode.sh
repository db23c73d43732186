#!/usr/bin/env bash
# The inference cost of depth on the accelerator: per-token decode latency and prefill of the
# 400M suite's endpoints and middle (16x1216, 32x896, 70x640; bf16, batch 1, 4096 tokens in the
# KV cache) for Pre-LN, HC and Full AttnRes, interleaved; scanned layers, because one block per
# layer (DECODE_LOOPS=unrolled, the CPU default) compiled 10-20x slower at 64 layers on the CPU
# (18-54 s against 2-3 s per case) (`python -m depthbench_jax.systems.decode_bench`):
# results-<device>-designs-shapes-decode-contexts-loops.json and
# decode.log. At batch 1 a decode step reads every weight once and launches every layer's
# kernels one after another, so the ratio 70x640 / 16x1216 is the latency price of depth.
# Scanned, Full AttnRes reads every slot of its depth buffer, masked (the layer index is traced:
# residual/base.static_prefix), so its prefill ratio is an upper bound and the CPU decode table
# (unrolled) is not its twin; DECODE_LOOPS=unrolled times the serving layout, at that compile.
# For the device tool, alone or just before gpu_profile.sh (not yet run on a GPU; 9 cases, two
# compiles each: estimated 2-4 min):
#   run(command="DEPTHBENCH_COMMIT=<sha> bash benchmarks/gpu_decode.sh", carry=[".whl"],
#       timeout_s=300)
# Test it locally first (the quick preset; ~15 s on 2 CPU cores):
#   OUT=/tmp/gd PYTHON=.venv/bin/python DECODE_PRESET=quick DECODE_SHAPES=2x32,4x16 \
#   DECODE_CONTEXTS=16 bash benchmarks/gpu_decode.sh
set -uo pipefail
# shellcheck source=benchmarks/device_env.sh
source "$(dirname "$0")/device_env.sh"
"$PY" -m depthbench_jax.systems.decode_bench --preset="${DECODE_PRESET:-gpu400m}" \
  --designs="${DECODE_DESIGNS:-preln,hc,attnres_full}" \
  --shapes="${DECODE_SHAPES:-16x1216,32x896,70x640}" --contexts="${DECODE_CONTEXTS:-4096}" \
  --loops="${DECODE_LOOPS:-scan}" --batch="${DECODE_BATCH:-1}" \
  --rounds="${DECODE_ROUNDS:-20}" --out="$OUT_DIR" 2>&1 | tee "$OUT_DIR/decode.log"
