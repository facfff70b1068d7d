#!/usr/bin/env bash
# Create .venv with the CPU build of torch and gridshard (editable) with its dev tools.
# torch is pinned first: a loose "torch" requirement would pull the CUDA build (gigabytes).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# pip -q with its own exit status; only pip's note about a --find-links folder this machine
# lacks is dropped.
pip_install() {
    .venv/bin/python -m pip install -q "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# numpy with torch: torch built without it warns "Failed to initialize NumPy" on import.
pip_install "$TORCH_SPEC" numpy
.venv/bin/python -c "import torch" # fail here, clearly, if torch did not install
# setuptools reports every lenient editable install of a flat layout ("Editable installation.
# Please be careful with folders ... same name as your package"): information, not a problem.
PYTHONWARNINGS="ignore:Editable installation:UserWarning" pip_install -e ".[dev]"
.venv/bin/python -c "import processor, einops, pytest, hypothesis" # and here if the package did not
# The fused CPU attention kernel (processor/attention/csrc), compiled for this machine; one line
# either way: without it the Python attention paths run.
.venv/bin/python -m processor.attention.build_kernel || true
echo "gridshard installed in .venv (torch $(.venv/bin/python -c 'import torch; print(torch.__version__)'))"
