#!/usr/bin/env bash
# Sets up .venv if needed, then runs the test suite (slow tests too unless FAST=1).
#   ./launch/test.sh                 # everything CI runs
#   ./launch/test.sh tests/model -x  # extra args go to pytest
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/launch/bootstrap.sh"
cd "$ROOT"
export TF_CPP_MIN_LOG_LEVEL=2 JAX_PLATFORMS=cpu PYTHONHASHSEED=0
args=("$@")
[[ "${FAST:-0}" == "1" ]] && args=(-m "not slow" "${args[@]}")
exec "$ROOT/.venv/bin/python" -m pytest "${args[@]}"
