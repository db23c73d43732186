#!/usr/bin/env bash
# Checks the "Will a run fit?" figures (README) on a real accelerator: the train step of the 1.6B
# suite at 56x1472 compiled for ONE device with 16 microbatches (32 sequences of 2048 per
# microbatch, the per-device microbatch of the README's 16-device table), nothing allocated
# (`python -m depthbench_jax.systems.train_memory`): train_memory.log. The same command on
# 2 CPU cores is benchmarks/logs-cpu/train_memory-1p6b-1dev.log; the two differ only in the
# compiler (XLA:GPU with cuDNN attention against XLA:CPU with the blocked attention and fp32
# copies of bf16 dot operands), which is what the README's figures cannot yet say.
# Compile only: about 15-30 s per design on the device's host CPU.
# For the device tool (alone, or after gpu_decode.sh while the machine is warm; the device copy
# has no .git, so DEPTHBENCH_COMMIT names the code in the log's header):
#   run(command="DEPTHBENCH_COMMIT=<sha> bash benchmarks/gpu_train_memory.sh", carry=[".whl"],
#       timeout_s=240)
# Test it locally first (~7 s on 2 CPU cores):
#   OUT=/tmp/gm PYTHON=.venv/bin/python MEMORY_CONFIG=configs/smoke.py MEMORY_SHAPES=4x128 \
#   MEMORY_DESIGNS=preln MEMORY_GRAD_ACCUM=2 bash benchmarks/gpu_train_memory.sh
set -uo pipefail
# shellcheck source=benchmarks/device_env.sh
source "$(dirname "$0")/device_env.sh"
"$PY" -m depthbench_jax.systems.train_memory --config="${MEMORY_CONFIG:-configs/suite_1p6b.py}" \
  --devices=1 --shapes="${MEMORY_SHAPES:-56x1472}" \
  --designs="${MEMORY_DESIGNS:-preln,hc,attnres_block,attnres_full,moda}" \
  --grad_accum_steps="${MEMORY_GRAD_ACCUM:-16}" 2>&1 | tee "$OUT_DIR/train_memory.log"
