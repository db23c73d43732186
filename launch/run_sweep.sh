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
# processes with jax.distributed. --results_dir must be on a filesystem every host sees.
# The suite may also be given as --config=FILE. Other flags go to `python -m depthbench_jax.sweep`
# (--results_dir, --mfu, --peak_flops, ...).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/launch/bootstrap.sh"   # no-op when .venv is current
# Paths the caller gives are the caller's: a config file found from here and --results_dir are
# made absolute before the cd (a config not found here is looked up in the repo, as before;
# a results dir inside the repo, relative to it).
CALLER="$PWD"
absolute() { case "$1" in /*) printf '%s' "$1" ;; *) printf '%s' "$CALLER/$1" ;; esac; }
caller_file() { if [[ -f "$1" ]]; then absolute "$1"; else printf '%s' "$1"; fi; }
# A results dir inside the checkout stays relative to it: hosts that mount one shared checkout
# at other paths then give a run one workdir (main.check_same_run compares it as written).
results_path() {
  local p; p="$(absolute "$1")"
  case "$p" in "$ROOT"/*) printf '%s' "${p#"$ROOT"/}" ;; *) printf '%s' "$p" ;; esac
}
has_value() {  # FLAG [VALUE ...]: one error line and exit 2 where the value is missing, empty
  # or the next flag (an unset variable's --results_dir= once meant the caller's directory here
  # and results/<suite> to the sweep; `--results_dir --dry_run` trained into ./--dry_run).
  [[ $# -ge 2 && -n "$2" && "$2" != -* ]] || {
    echo "error: $1 has no value; allowed: $1 PATH or $1=PATH" >&2; exit 2; }
}
one_suite() {  # a second --config: the last one won without a word
  [[ ${#SUITE[@]} -eq 0 ]] || {
    echo "error: --config given twice (${SUITE[0]}, $1); allowed: one suite file" >&2; exit 2; }
}
ARGS=()
SUITE=()  # --config=FILE (the spelling main.py, systems and report take) is the suite positional.
POSITIONAL=()  # The suite file wherever it stands, as the sweep's argparse takes it
while [[ $# -gt 0 ]]; do  # (`--dry_run configs/x.py` ran smoke.py with x.py as an extra word).
  case "$1" in
    --config) has_value "$@"; one_suite "$2"; SUITE=("$(caller_file "$2")"); shift 2 ;;
    --config=*) has_value --config "${1#--config=}"; one_suite "${1#--config=}"
                SUITE=("$(caller_file "${1#--config=}")"); shift ;;
    --results_dir) has_value "$@"; ARGS+=("$1" "$(results_path "$2")"); shift 2 ;;
    --results_dir=*) has_value --results_dir "${1#--results_dir=}"
                     ARGS+=("--results_dir=$(results_path "${1#--results_dir=}")"); shift ;;
    --main_cmd|--mfu|--peak_flops|--local_processes)  # their value is no suite file
      ARGS+=("$1"); shift; if [[ $# -gt 0 ]]; then ARGS+=("$1"); shift; fi ;;
    -*) ARGS+=("$1"); shift ;;
    *) POSITIONAL+=("$(caller_file "$1")"); shift ;;
  esac
done
if [[ ${#SUITE[@]} -gt 0 && ${#POSITIONAL[@]} -gt 0 ]]; then
  ARGS+=("--config=${SUITE[0]}"); SUITE=()  # Both spellings: the sweep names the two files.
fi
set -- ${POSITIONAL[@]+"${POSITIONAL[@]}"} ${SUITE[@]+"${SUITE[@]}"} ${ARGS[@]+"${ARGS[@]}"}
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
# The sweep runs as a child that this shell waits for: a SIGTERM to the shell (a scheduler or a
# container stopping it) is passed on, the running job saves a checkpoint, and the shell exits
# only once the sweep has (bash alone would die and orphan the trainer mid-step).
rc=0
"$PY" -m depthbench_jax.sweep "$CONFIG" "$@" &
sweep_pid=$!
trap 'kill -TERM "$sweep_pid" 2>/dev/null || true' TERM INT
while :; do
  wait "$sweep_pid" && rc=0 || rc=$?
  kill -0 "$sweep_pid" 2>/dev/null || break   # wait returned for a trapped signal: wait again
done
trap - TERM INT
(( DRY )) && exit "$rc"
(( rc == 2 )) && exit "$rc"   # bad input: its one error line is the last word, nothing written
(( rc == 143 )) && { echo "[run_sweep] stopped by SIGTERM; rerun to resume" >&2; exit "$rc"; }

# One report per sweep, from the first process of a multi-host launch only; it reads the suite
# too, to count the planned runs finished / started / not started and name folders it lacks.
# A failed report is the script's failure too: report.md, written atomically, would otherwise
# be the previous sweep's, read as this one's after an exit 0.
proc="${JAX_PROCESS_ID:-${SLURM_PROCID:-0}}"
report_rc=0
if [[ "$proc" == "0" && -d "$RESULTS" ]]; then
  "$PY" -m depthbench_jax.report "$RESULTS" --config="$CONFIG" || {
    report_rc=$?
    echo "[run_sweep] report failed (exit $report_rc): $RESULTS/report.md is not this sweep's" >&2
  }
fi
exit $(( rc ? rc : report_rc ))
