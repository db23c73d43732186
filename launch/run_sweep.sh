#!/usr/bin/env bash
# Runs every entry of a suite config, skipping finished runs and resuming interrupted ones,
# then writes the report. With no arguments: configs/smoke.py into results/smoke.
#
#   launch/run_sweep.sh                                   # smoke sweep + report (CPU)
#   launch/run_sweep.sh configs/suite_400m.py --dry_run   # plan: runs, params, tokens, FLOPs, hours
#   launch/run_sweep.sh configs/suite_400m.py             # run what is missing
#   LOCAL_PROCESSES=2 launch/run_sweep.sh configs/smoke.py   # each run as 2 local JAX processes
#
# Multi-host pods: start it once per host (srun --ntasks-per-node=1 ..., or set
# JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID on each host); main.py joins the
# processes with jax.distributed. RESULTS must be on a filesystem every host sees.
# Other flags go to `python -m depthbench_jax.sweep` (--results_dir, --mfu, --peak_flops, ...).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/launch/bootstrap.sh"   # no-op when .venv is current
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
# glibc keeps its heap, in huge pages, across steps (XLA:CPU's per-step temporaries;
# depthbench_jax/hostmem.py).
export GLIBC_TUNABLES="$("$PY" -m depthbench_jax.hostmem)"

CONFIG=configs/smoke.py
if [[ $# -gt 0 && "$1" != -* ]]; then CONFIG="$1"; shift; fi
DRY=0
for a in "$@"; do [[ "$a" == "--dry_run" ]] && DRY=1; done

RESULTS="$("$PY" -m depthbench_jax.sweep "$CONFIG" "$@" --print_results_dir)"
rc=0
"$PY" -m depthbench_jax.sweep "$CONFIG" "$@" || rc=$?
(( DRY )) && exit "$rc"

# One report per sweep, from the first process of a multi-host launch only.
proc="${JAX_PROCESS_ID:-${SLURM_PROCID:-0}}"
if [[ "$proc" == "0" && -d "$RESULTS" ]]; then
  "$PY" -m depthbench_jax.report "$RESULTS" || echo "[run_sweep] report failed" >&2
fi
exit "$rc"
