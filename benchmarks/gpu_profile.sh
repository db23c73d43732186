#!/usr/bin/env bash
# Where the multi-stream and cross-layer designs spend their GPU step time. At the bench's
# gpu400m shape (16x1216, bf16, batch 8 x 2048, cuDNN attention, dots_saveable):
#   * the bench for every design but the four norm variants, and mHC with its Sinkhorn as a
#     Pallas kernel (BENCH_DESIGNS; a candidate that fails to compile is reported, not fatal),
#     interleaved: results-<device>-designs.json and bench-designs.log;
#   * profile_step for PROFILE_DESIGNS with XLA:GPU's command buffers off (each kernel its own
#     trace event, mapped to the model by its hlo_op), each part also against Pre-LN's
#     (--baseline): profile-<design>.txt, and the compiled step's HLO (hlo-<design>.txt).
#   * profile_step of mHC with its Sinkhorn as a Pallas kernel (PROFILE_ONLY_DESIGNS, no HLO).
# The device tool returns 8 files: keep PROFILE_DESIGNS to two. Like gpu_bench.sh:
#   run(command="DEPTHBENCH_COMMIT=<sha> bash benchmarks/gpu_profile.sh", carry=[".whl"],
#       timeout_s=540)   # ~5 min: the bench of 7 candidates, then 5 profiles
set -uo pipefail
# shellcheck source=benchmarks/device_env.sh
source "$(dirname "$0")/device_env.sh"
PRESET=${BENCH_PRESET:-gpu400m}
"$PY" -m depthbench_jax.bench --preset="$PRESET" \
  --designs="${BENCH_DESIGNS:-preln,hc,mhc,mhc:sinkhorn_kernel=pallas,attnres_full,attnres_block,moda}" \
  --shapes="${BENCH_SHAPE:-16x1216}" --rounds="${BENCH_ROUNDS:-10}" --out="$OUT_DIR" 2>&1 \
  | tee "$OUT_DIR/bench-designs.log"
for design in ${PROFILE_DESIGNS:-hc attnres_full}; do
  "$PY" -m depthbench_jax.systems.profile_step --preset="$PRESET" --design="$design" \
    --steps=3 --top=45 --hlo_out="$OUT_DIR/hlo-$design.txt" --baseline=preln 2>&1 \
    | tee "$OUT_DIR/profile-$design.txt"
done
# The 8th file: mHC with the Pallas Sinkhorn, its profile only (file names without ':' '=').
for design in ${PROFILE_ONLY_DESIGNS:-mhc:sinkhorn_kernel=pallas}; do
  "$PY" -m depthbench_jax.systems.profile_step --preset="$PRESET" --design="$design" \
    --steps=3 --top=45 2>&1 | tee "$OUT_DIR/profile-${design//[:=]/_}.txt"
done
