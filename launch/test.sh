#!/usr/bin/env bash
# Sets up .venv if needed, then runs the test suite (slow tests too unless FAST=1, which skips
# the 52 slow ones: 1049 tests in 5m22s on a 2-core Zen 5, where all 1101 took 7m05s; all 1213
# at 4cb2d88 took 9m51s on a 2-core Zen 4, 10m38s from a clean clone with a cold bootstrap; all
# 1249 at ae68fcd 12m14s there; the 40th session's tests bring it to 1276).
#   ./launch/test.sh                 # everything CI runs (2 xdist workers; TEST_WORKERS=0: one)
#   ./launch/test.sh tests/model -x  # extra args go to pytest
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/launch/bootstrap.sh"
cd "$ROOT"
export TF_CPP_MIN_LOG_LEVEL=2 JAX_PLATFORMS=cpu PYTHONHASHSEED=0
args=("$@")
[[ "${FAST:-0}" == "1" ]] && args=(-m "not slow" "${args[@]}")
# Two xdist workers unless told otherwise (-n N, or TEST_WORKERS=0 for one process): on the
# 2-core reference machine (an AVX2 EPYC) the suite took 9m13s, 10m33s with the bootstrap, from
# a clean clone and empty caches (835 tests at 005706e; 13-14 min before the tests compiled with
# XLA:CPU's fusion emitters off, tests/helpers.TEST_XLA_FLAGS), longer serially; on a 2-core
# Zen 5 host 6m06s, 6m41s with the bootstrap (842 tests at 4801f10).
if [[ " $* " != *" -n "* && " $* " != *" -n"[0-9a]* && "${TEST_WORKERS:-2}" != "0" ]]; then
  # loadgroup (no test carries an xdist_group mark): one test per work unit, handed out in
  # collection order, slow ones first (tests/conftest.py); "load" would send each worker a first
  # chunk of an eighth of the tests, so one worker would get every slow test.
  args=(-n "${TEST_WORKERS:-2}" --dist loadgroup "${args[@]}")
fi
exec "$ROOT/.venv/bin/python" -m pytest "${args[@]}"
