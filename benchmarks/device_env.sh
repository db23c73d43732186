# Sourced by the device scripts (gpu_bench.sh, gpu_remat_profile.sh, gpu_decode.sh,
# gpu_profile.sh, gpu_train_memory.sh): installs the carried
# pure-Python wheels (.whl: what the device image lacks, e.g. ml_collections) on PYTHONPATH and
# sets PY (python3, or $PYTHON), OUT_DIR ($OUT, else benchmarks/) and the process environment.
# Stops the script (exit 1, one line) where the wheels do not install or JAX sees no GPU.
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl \
    || { echo "device_env: installing .whl/*.whl failed; stopping" >&2; exit 1; }
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
PY=${PYTHON:-python3}
# JAX falls back to the CPU when its CUDA plugin does not start, and a 400M preset on the host
# CPU would run out the lease. JAX_PLATFORMS=cpu asks for the CPU on purpose (the miniatures in
# tests/systems/test_device_scripts.py).
if [[ "${JAX_PLATFORMS:-}" != "cpu" ]]; then
  backend=$("$PY" -c "import jax; print(jax.default_backend())" 2>&1 | tail -n 1)
  if [[ "$backend" != "gpu" ]]; then
    echo "device_env: JAX's backend is '$backend', not gpu; stopping (JAX_PLATFORMS=cpu runs" \
      "the script on the CPU on purpose)" >&2
    exit 1
  fi
fi
OUT_DIR=${OUT:-benchmarks}
mkdir -p "$OUT_DIR"
# glibc's default malloc: hostmem's tunables are for XLA:CPU's per-step buffers.
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2 DEPTHBENCH_DEFAULT_MALLOC=1
