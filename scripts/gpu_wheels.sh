#!/usr/bin/env bash
# Fetch, here (where PyPI answers), the wheels the GPU machine lacks for the training app and the
# benchmark sweep, into .gpu-wheels/ (ignored by git): scripts/gpu_wheels.txt pins them, each
# fetched without its dependencies for CPython 3.12 on manylinux x86_64 (the image's Python);
# scripts/gpu_image_packages.txt names what the image has. Then check every wheel's
# dependencies against both lists and print the folder's size.
# Carry it: the device call names `.gpu-wheels` in `carry`; scripts/gpu_check.sh installs it.
#
# Usage: bash scripts/gpu_wheels.sh [DIR]     (DIR defaults to .gpu-wheels)
#   GPU_PYTHON_VERSION=3.11 bash scripts/gpu_wheels.sh /tmp/w311   # the same list for another
#   CPython, e.g. to prove the set here: install it with scripts/gpu_check.sh's way into a venv
#   holding only the image's packages, and dry-run the train and sweep parts.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
DIR="${1:-.gpu-wheels}"
VERSION="${GPU_PYTHON_VERSION:-3.12}"
ABI="cp${VERSION/./}"
mkdir -p "$DIR"
# Pinned wheels only: a wheel of an earlier pin would stop the install on the GPU machine.
"$PYTHON" - "$DIR" <<'PY'
import sys
from pathlib import Path
from benchmarks.gpu.wheels import wheel_list, wheel_metadata
pins, _ = wheel_list()
for wheel in Path(sys.argv[1]).glob("*.whl"):
    name, version, _ = wheel_metadata(wheel)
    if pins.get(name) != version:
        print(f"removing {wheel.name}: not pinned")
        wheel.unlink()
PY
# antlr4-python3-runtime 4.9.x (what Hydra 1.3 needs) is an sdist only: build its pure wheel.
ANTLR="$("$PYTHON" -m benchmarks.gpu.wheels pin antlr4-python3-runtime)"
if ! ls "$DIR"/antlr4_python3_runtime-"${ANTLR#*==}"-py3-none-any.whl >/dev/null 2>&1; then
    "$PYTHON" -m pip wheel -q --no-deps --no-binary=:all: "$ANTLR" -w "$DIR" 2>&1 \
        | grep -v "is ignored: it is neither a file nor a directory" || true
fi
"$PYTHON" -m benchmarks.gpu.wheels pins > "$DIR/requirements.txt"
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --find-links "$DIR" -d "$DIR" \
    --python-version "$VERSION" --implementation cp --abi "$ABI" --abi abi3 --abi none \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
    -r "$DIR/requirements.txt" 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true
rm -f "$DIR/requirements.txt"
"$PYTHON" -m benchmarks.gpu.wheels check "$DIR" --python-version "$VERSION"
du -sh "$DIR"
