#!/usr/bin/env bash
# Where the multi-stream and cross-layer designs spend their GPU step time. At the bench's
# gpu400m shape (16x1216, bf16, batch 8 x 2048, cuDNN attention, dots_saveable):
#   * the bench for every design but the four norm variants, and mHC with its Sinkhorn as a
#     Pallas kernel (BENCH_DESIGNS; a candidate that fails to compile is reported, not fatal),
#     interleaved: results-<device>-designs-shapes.json (the bench's name for a run with its
#     own --designs and --shapes) and bench-designs.log (replot the PNG here with
#     `python -m depthbench_jax.bench --replot=<json>`);
#   * profile_step with XLA:GPU's command buffers off (each kernel its own trace event, mapped
#     to the model by its hlo_op), with the compiled step's HLO, for PROFILE_DESIGNS each
#     against Pre-LN (--baseline) and PROFILE_ONLY_DESIGNS alone: profiles.tar.gz holds
#     profile-<design>.txt and hlo-<design>.txt (the device tool returns at most 8 files).
# For the device tool, like gpu_bench.sh:
#   run(command="DEPTHBENCH_COMMIT=<sha> bash benchmarks/gpu_profile.sh", carry=[".whl"],
#       timeout_s=540)   # ~6 min: the bench of 7 candidates, then 6 profiles
# No Hugging Face step (gpu400m has none; --no_hf keeps the quick preset's miniature to the same
# sections). Test it locally first (the quick preset; ~40 s on 2 CPU cores):
#   OUT=/tmp/gp PYTHON=.venv/bin/python BENCH_PRESET=quick BENCH_SHAPE=2x64 BENCH_ROUNDS=2 \
#   bash benchmarks/gpu_profile.sh
set -uo pipefail
# shellcheck source=benchmarks/device_env.sh
source "$(dirname "$0")/device_env.sh"
PRESET=${BENCH_PRESET:-gpu400m}
rc=0  # every section runs whatever an earlier one did; the script fails if any did
"$PY" -m depthbench_jax.bench --preset="$PRESET" \
  --designs="${BENCH_DESIGNS:-preln,hc,mhc,mhc:sinkhorn_kernel=pallas,attnres_full,attnres_block,moda}" \
  --shapes="${BENCH_SHAPE:-16x1216}" --rounds="${BENCH_ROUNDS:-10}" --no_hf --out="$OUT_DIR" 2>&1 \
  | tee "$OUT_DIR/bench-designs.log" || rc=1
# This run's PNG only (it passes --designs and --shapes): with OUT unset OUT_DIR is benchmarks/,
# whose committed results-<device>-designs.png a wider glob deleted.
rm -f "$OUT_DIR"/results-*-designs-shapes.png
PROFILES="$OUT_DIR/profiles"
mkdir -p "$PROFILES"
profile() {  # design [extra flags]: file names without ':' and '='
  local design=$1 file=${1//[:=]/_}
  shift
  "$PY" -m depthbench_jax.systems.profile_step --preset="$PRESET" --design="$design" \
    --steps=3 --top=45 --hlo_out="$PROFILES/hlo-$file.txt" "$@" 2>&1 \
    | tee "$PROFILES/profile-$file.txt"
}
for design in ${PROFILE_DESIGNS-hc attnres_full}; do
  profile "$design" --baseline=preln || rc=1
done
for design in ${PROFILE_ONLY_DESIGNS-mhc:sinkhorn_kernel=pallas moda}; do
  profile "$design" || rc=1
done
tar czf "$OUT_DIR/profiles.tar.gz" -C "$OUT_DIR" profiles && rm -rf "$PROFILES" || rc=1
exit "$rc"
