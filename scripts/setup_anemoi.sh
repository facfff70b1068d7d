#!/usr/bin/env bash
# Create .venv-anemoi: gridshard beside ECMWF's anemoi packages, for the interop tests.
# anemoi-datasets pins zarr<=2.18.7 (.venv has zarr 3: both are tested) and anemoi-models pins
# torch<2.11, so anemoi-models goes in with --no-deps and everything under constraints that
# hold torch==2.13.0 (the CPU wheel) and the zarr anemoi-datasets accepts.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV=.venv-anemoi
CONSTRAINTS="$VENV/constraints.txt"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# The command's own exit status; only pip's note about a --find-links folder this machine lacks
# is dropped.
quiet() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
printf "torch==2.13.0\nzarr==2.18.7\n" >"$CONSTRAINTS"
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# numpy with torch: torch built without it warns "Failed to initialize NumPy" on import.
quiet "$VENV/bin/python" -m pip install -q -c "$CONSTRAINTS" torch==2.13.0 numpy
# setuptools reports every lenient editable install of a flat layout ("Editable installation.
# Please be careful with folders ... same name as your package"): information, not a problem.
# rdata: scripts/climate4r.py reads the climate4R datasets' R files (ncep_msl_daily, the Iberian stores).
PYTHONWARNINGS="ignore:Editable installation:UserWarning" \
    quiet "$VENV/bin/python" -m pip install -q -c "$CONSTRAINTS" "anemoi-datasets==0.5.47" eccodes rdata -e ".[dev]"
quiet "$VENV/bin/python" -m pip install -q --no-deps "anemoi-models==0.19.0"
# anemoi-models' model classes import a few names from anemoi-graphs; its own dependencies
# (plotting, mesh builders) are not needed for that.
quiet "$VENV/bin/python" -m pip install -q --no-deps "anemoi-graphs==0.9.8"
quiet "$VENV/bin/python" -m pip install -q -c "$CONSTRAINTS" typeguard networkx
"$VENV/bin/python" -c "import anemoi.datasets, anemoi.models.layers.processor, anemoi.models.models, processor, zarr; assert zarr.__version__.startswith('2.')"
# Real GRIB fields for tests/training/data/test_grib_stores.py, from cfgrib's sdist (its
# tests/sample-data): lat-lon with the poles, regular and reduced Gaussian, Lambert. Optional:
# without them (no network) those tests are skipped.
SAMPLES="$VENV/grib-samples"
GRIB_FILES="era5-levels-members.grib regular_ll_sfc.grib regular_gg_sfc.grib reduced_gg.grib lambert_grid.grib"
missing_samples() { for f in $GRIB_FILES; do [ -s "$SAMPLES/$f" ] || return 0; done; return 1; }
if missing_samples; then
    SDIST_DIR=$(mktemp -d)
    if quiet "$VENV/bin/python" -m pip download -q --no-deps --no-binary :all: cfgrib==0.9.15.1 -d "$SDIST_DIR" \
        && mkdir -p "$SAMPLES" \
        && tar -xzf "$SDIST_DIR/cfgrib-0.9.15.1.tar.gz" -C "$SAMPLES" --strip-components=3 --no-same-owner \
            $(for f in $GRIB_FILES; do echo "cfgrib-0.9.15.1/tests/sample-data/$f"; done) \
        && ! missing_samples; then
        echo "GRIB samples from cfgrib 0.9.15.1 in $SAMPLES"
    else
        echo "could not fetch cfgrib's GRIB samples: tests/training/data/test_grib_stores.py will be skipped"
    fi
    rm -rf "$SDIST_DIR"
fi
echo "gridshard and anemoi installed in $VENV (zarr $("$VENV/bin/python" -c 'import zarr; print(zarr.__version__)'))"
