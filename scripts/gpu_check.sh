#!/usr/bin/env bash
# The GPU check: CUDA tests, kernel and processor benchmarks, a training run and a benchmark
# sweep on the GPU, each written as its own part of the device's dated report,
# docs/benchmarks/gpu_check_<device>_<date>.md (listed in the index of docs/benchmarks.md).
# The tests, kernel and processor parts need only a Python with torch (CUDA), einops, numpy and
# pytest; the train and sweep parts need Hydra, MLflow and zarr too: on a machine without a
# package index, carry the wheels that `bash scripts/gpu_wheels.sh` fetched into .gpu-wheels/
# (elsewhere), and this installs them first, offline, into a folder of their own put ahead on
# PYTHONPATH (the image's torch is never replaced: no wheel of it is carried). Skips cleanly
# without a GPU.
# Usage: bash scripts/gpu_check.sh [--only tests,kernel,processor,train,sweep,parity] [--section-out FILE]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || command -v python3 || echo python )}"
WHEELS="${GPU_WHEELS:-.gpu-wheels}"
HAS_ALL='import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))'
if compgen -G "$WHEELS/*.whl" >/dev/null && ! "$PYTHON" -c "$HAS_ALL" hydra omegaconf mlflow zarr numcodecs yaml; then
    # A venv would not do: made from the image's Python (itself a venv) it would not see its torch.
    SITE="${GPU_SITE:-${TMPDIR:-/tmp}/gridshard-gpu-site}"
    rm -rf "$SITE"
    if "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check \
        --target "$SITE" "$WHEELS"/*.whl; then
        export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
        echo "gpu_check.sh: installed $(ls "$WHEELS"/*.whl | wc -l) carried wheels into $SITE"
    else
        echo "gpu_check.sh: installing the wheels in $WHEELS failed; the train and sweep parts will say so"
    fi
fi
exec "$PYTHON" -m benchmarks.gpu_check "$@"
