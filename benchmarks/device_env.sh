# Sourced by the device scripts (gpu_bench.sh, gpu_remat_profile.sh, gpu_decode.sh,
# gpu_profile.sh): installs the carried
# pure-Python wheels (.whl: what the device image lacks, e.g. ml_collections) on PYTHONPATH and
# sets PY (python3, or $PYTHON), OUT_DIR ($OUT, else benchmarks/) and the process environment.
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
PY=${PYTHON:-python3}
OUT_DIR=${OUT:-benchmarks}
mkdir -p "$OUT_DIR"
# glibc's default malloc: hostmem's tunables are for XLA:CPU's per-step buffers.
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2 DEPTHBENCH_DEFAULT_MALLOC=1
