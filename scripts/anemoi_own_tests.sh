#!/usr/bin/env bash
# anemoi-models' own processor tests, run against gridshard's AnemoiTransformerProcessor: the
# sdist of the version scripts/setup_anemoi.sh pins (downloaded once into a cache), only the
# import of the class under test swapped (scripts/anemoi_own_tests.py), run in .venv-anemoi.
# Every test runs but those deselected below, each with its reason.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-anemoi
VERSION=$(sed -n 's/.*"anemoi-models==\([^"]*\)".*/\1/p' scripts/setup_anemoi.sh)
[ -n "$VERSION" ] || { echo "no anemoi-models==X pin in scripts/setup_anemoi.sh" >&2; exit 1; }
[ -x "$VENV/bin/python" ] || { echo "$VENV is missing: run scripts/setup_anemoi.sh first" >&2; exit 1; }
CACHE="${ANEMOI_SDIST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gridshard/anemoi-sdist}"
SDIST="$CACHE/anemoi_models-$VERSION.tar.gz"
if [ ! -f "$SDIST" ]; then
    mkdir -p "$CACHE"
    # pip notes --find-links folders this machine lacks: information, not a problem.
    PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip download -q --no-binary :all: --no-deps \
        "anemoi-models==$VERSION" -d "$CACHE" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
fi
[ -f "$SDIST" ] || { echo "could not download the sdist of anemoi-models==$VERSION to $CACHE" >&2; exit 1; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mapfile -t FILES < <("$VENV/bin/python" scripts/anemoi_own_tests.py "$SDIST" "$WORK")

DESELECT=(
    # asserts anemoi's own TransformerProcessorBlock class: no other implementation can pass it
    tests/layers/processor/test_transformer_processor.py::test_all_blocks
)
ARGS=()
for node in "${DESELECT[@]}"; do ARGS+=(--deselect "$node"); done
echo "anemoi-models $VERSION's own tests against gridshard's adapter (${#DESELECT[@]} deselected)"
cd "$WORK"
# torch warns that anemoi's code calls torch.jit.script: anemoi's to change, not ours.
"$OLDPWD/$VENV/bin/python" -m pytest -q -p no:cacheprovider --import-mode=importlib \
    -W "ignore:\`torch.jit.script\` is deprecated:DeprecationWarning" "${ARGS[@]}" "${FILES[@]}"
