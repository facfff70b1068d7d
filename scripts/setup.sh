#!/usr/bin/env bash
# Create .venv with the CPU build of torch and gridshard (editable) with its dev tools.
# torch is pinned first: a loose "torch" requirement would pull the CUDA build (gigabytes).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q "$TORCH_SPEC" 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
.venv/bin/python -c "import torch" # fail here, clearly, if torch did not install
.venv/bin/python -m pip install -q -e ".[dev]" 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
.venv/bin/python -c "import processor, einops, pytest, hypothesis" # and here if the package did not
echo "gridshard installed in .venv (torch $(.venv/bin/python -c 'import torch; print(torch.__version__)'))"
