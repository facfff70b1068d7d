#!/usr/bin/env bash
# The GPU check: CUDA tests, then the GPU benchmark, written to docs/benchmarks.md.
# Needs only a Python with torch (CUDA), einops, numpy and pytest; skips cleanly without a GPU.
# Usage: bash scripts/gpu_check.sh [--section-out FILE] [--skip-tests]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}"
exec "$PYTHON" -m benchmarks.gpu_check "$@"
