#!/usr/bin/env bash
# The second accelerator run: which remat policy the 400M suite should train with on a GPU, and
# where HC's extra step time goes. At 16x1216, bf16, batch 8 x 2048, cuDNN attention:
#   * the bench for Pre-LN and HC under remat 'none' and 'nothing_saveable' (the suites'
#     default; gpu_bench.sh ran 'dots_saveable'): results-<device>-remat-<policy>-designs-shapes.json;
#   * profile_step for Pre-LN and HC: time per model part and per XLA op: profile-<design>.txt.
# For the device tool, like gpu_bench.sh:
#   run(command="DEPTHBENCH_COMMIT=<sha> bash benchmarks/gpu_remat_profile.sh", carry=[".whl"],
#       timeout_s=360)
set -uo pipefail
# shellcheck source=benchmarks/device_env.sh
source "$(dirname "$0")/device_env.sh"
PRESET=${BENCH_PRESET:-gpu400m}
SHAPE=${BENCH_SHAPE:-16x1216}
rc=0  # every section runs whatever an earlier one did; the script fails if any did
for policy in none nothing_saveable; do
  "$PY" -m depthbench_jax.bench --preset="$PRESET" --designs=preln,hc --shapes="$SHAPE" \
    --remat="$policy" --out="$OUT_DIR" 2>&1 | tee "$OUT_DIR/bench-remat-$policy.log" || rc=1
  rm -f "$OUT_DIR"/results-*-remat-"$policy"*.png   # the table is in the log; 8 files come back
done
for design in preln hc; do
  "$PY" -m depthbench_jax.systems.profile_step --preset="$PRESET" --design="$design" \
    --steps=3 --top=30 2>&1 | tee "$OUT_DIR/profile-$design.txt" || rc=1
done
exit "$rc"
