#!/usr/bin/env bash
# Creates .venv at the repo root (if absent or stale) with everything the project needs.
# Needs only python3 and the package registries. Idempotent: a stamp records what was installed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
STAMP="$VENV/.depthbench-installed"
# Packages installed without their dependencies: openai-whisper only for its GPT-2 BPE file
# (its deps would pull a CUDA torch); the reference residual implementations for parity tests.
NO_DEPS=(openai-whisper==20250625 hyper-connections==0.4.11 attn-res==0.1.0 moda-attention==0.1.0)

# The CUDA build of JAX (extra 'gpu') is installed with DEPTHBENCH_GPU=1, and kept once a venv
# has it: reinstalling only '[test]' after a jax bump left the old plugin, which jaxlib then
# skips with a warning, and every run trained on the host's CPU.
EXTRAS=test
CUDA_PLUGIN="$VENV/lib/python3*/site-packages/jax_cuda12_plugin"
if [[ "${DEPTHBENCH_GPU:-0}" == 1 ]] || compgen -G "$CUDA_PLUGIN" >/dev/null; then
  EXTRAS=test,gpu
fi
want="$( (cat "$ROOT"/{setup.py,launch/constraints.txt,launch/bootstrap.sh}; echo "$EXTRAS") |
  sha256sum | cut -c1-16)"
current() { [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; }
current && exit 0
# Every host of a pod starts here at once on a shared filesystem: one installs, the others wait
# on the lock and then find the stamp current.
if command -v flock >/dev/null; then
  exec 9>"$ROOT/.venv.lock"
  # A filesystem without locks (Lustre mounted noflock: ENOSYS) goes on unlocked, as without
  # flock; stopping there stopped every host's sweep whenever a reinstall was due.
  flock 9 || echo "[bootstrap] flock failed on $ROOT; installing without the lock" >&2
  current && exit 0
fi
echo "[bootstrap] setting up $VENV (about a minute with uv, two with the pip fallback)" >&2
# A venv without a working pip (python3-venv missing when it was made, or creation cut short)
# is made again: keeping it failed every later run at the first pip call.
if ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
"${PIP[@]}" --upgrade pip
# uv installs the same pinned set in a third of pip's time (on the 2-core reference machine,
# caches cold, bytecode compiled as pip does: 38 s against about 110 s); pip is the fallback.
# uv reads no pip configuration, so the machine's pip find-links and constraint files (pip's
# config files and its PIP_FIND_LINKS/PIP_CONSTRAINT) are passed on (here they hold the CPU-only
# torch wheel and its cap).
UV_VERSION=0.13.9
install() {  # INSTALLER...: the project with its EXTRAS, then NO_DEPS without theirs
  "$@" -c "$ROOT/launch/constraints.txt" -e "$ROOT[$EXTRAS]" &&
    "$@" --no-deps -c "$ROOT/launch/constraints.txt" "${NO_DEPS[@]}"
}
install_with_uv() {
  "${PIP[@]}" "uv==$UV_VERSION" || return 1
  local uv=("$VENV/bin/uv" pip install -q --python "$VENV/bin/python" --compile-bytecode)
  local opt var values value
  for opt in find-links constraint; do
    var="PIP_$(tr a-z- A-Z_ <<< "$opt")"
    values="${!var:-} $("$VENV/bin/python" -m pip config get "global.$opt" 2>/dev/null || true)"
    for value in $values; do
      uv+=("--$([[ $opt == constraint ]] && echo constraints || echo "$opt")" "$value")
    done
  done
  install "${uv[@]}"
}
if ! install_with_uv; then
  echo "[bootstrap] uv failed; installing with pip" >&2
  install "${PIP[@]}"
fi
echo "$want" > "$STAMP"
echo "[bootstrap] done" >&2
