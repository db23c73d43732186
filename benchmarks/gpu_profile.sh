#!/usr/bin/env bash
# Where the multi-stream and cross-layer designs spend their GPU step time. At the bench's
# gpu400m shape (16x1216, bf16, batch 8 x 2048, cuDNN attention, dots_saveable):
#   * profile_step for Pre-LN, HC, mHC and Full AttnRes with XLA:GPU's command buffers off (each
#     kernel its own trace event, mapped to the model by its hlo_op): profile-<design>.txt, and
#     the compiled step's HLO (hlo-<design>.txt) to read the fusions offline;
#   * MoDA against Pre-LN at 16x1216 (out of memory before model/append_stack.py).
# For the device tool, like gpu_bench.sh:
#   run(command="DEPTHBENCH_COMMIT=<sha> bash benchmarks/gpu_profile.sh", carry=[".whl"],
#       timeout_s=420)
set -uo pipefail
# shellcheck source=benchmarks/device_env.sh
source "$(dirname "$0")/device_env.sh"
PRESET=${BENCH_PRESET:-gpu400m}
for design in ${PROFILE_DESIGNS:-preln hc mhc attnres_full}; do
  "$PY" -m depthbench_jax.systems.profile_step --preset="$PRESET" --design="$design" \
    --steps=3 --top=45 --hlo_out="$OUT_DIR/hlo-$design.txt" 2>&1 | tee "$OUT_DIR/profile-$design.txt"
done
"$PY" -m depthbench_jax.bench --preset="$PRESET" --designs=preln,moda \
  --shapes="${BENCH_SHAPE:-16x1216}" --rounds="${BENCH_ROUNDS:-5}" --out="$OUT_DIR" 2>&1 \
  | tee "$OUT_DIR/bench-moda.log"
