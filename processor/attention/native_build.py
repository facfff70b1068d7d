"""Building and loading the fused CPU kernels (``csrc/band_attention.cpp``, and beside it in the
same module the mappers' edge attention, ``csrc/edge_attention.cpp``, the q/k head norms,
``csrc/head_norm.cpp``, and a tiled transpose, ``csrc/transpose.cpp``) and their ISA variants.

``python -m processor.attention.build_kernel`` (run by ``scripts/setup.sh``) compiles it with the
machine's g++ against the installed torch into ``csrc/build/``, beside a stamp of the sources,
the flags and the torch version each build came from; a build whose stamp does not match (other
sources, another torch) is never loaded: rebuild.

Variants: ``native`` (``-march=native``: the one the attention paths load; its vector width is
what the host has, AVX-512, AVX2 or none) and, on x86, every narrower one this host can also run,
built so that the tests check each code path a user's CPU may take (``avx2`` on an AVX-512 host;
``scalar``, no vector micro-kernels, everywhere on x86). ``kernel.isa()`` names a build's width.
"""

from __future__ import annotations

import hashlib
import importlib.util
import platform
import subprocess
import sysconfig
from pathlib import Path
from types import MappingProxyType, ModuleType

import torch

from processor.host import cpu_name

CSRC = Path(__file__).parent / "csrc"
# One module: the band attention and, beside it, the mappers' edge attention, the q/k head norms
# and the matmul backend's transpose (their bindings added by band_attention.cpp's module).
SOURCES = tuple(CSRC / name for name in ("band_attention.cpp", "edge_attention.cpp", "head_norm.cpp", "transpose.cpp"))
HEADERS = tuple(
    CSRC / name
    for name in (
        "simd.h",
        "small_gemm.h",
        "tile_products.h",
        "bf16_rows.h",
        "bf16_products.h",
        "row_passes.h",
        "edge_attention.h",
        "head_norm.h",
        "head_norm_blocks.h",
        "transpose.h",
    )
)
BUILD = CSRC / "build"
NAME = "gridshard_band_attention"
# -fvisibility=hidden: each variant keeps its own micro-kernels (same names, other bodies) even
# where libraries are loaded RTLD_GLOBAL; pybind11 exports the module's init function itself.
FLAGS = ("-O3", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-std=c++17", "-fPIC", "-fvisibility=hidden")
# What each variant adds to FLAGS; GCC drops every extension that needs the one switched off.
VARIANT_FLAGS = MappingProxyType(
    {
        "native": ("-march=native",),
        "avx2": ("-march=native", "-mno-avx512f"),
        "scalar": ("-march=native", "-mno-avx2"),
    }
)


def host_variants() -> list[str]:
    """The variants worth building here: ``native``, and on x86 the narrower ones it differs from."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return ["native"]
    wide = torch.backends.cpu.get_cpu_capability() == "AVX512"
    return ["native", "avx2", "scalar"] if wide else ["native", "scalar"]


def module_name(variant: str) -> str:
    return NAME if variant == "native" else f"{NAME}_{variant}"


def library_path(variant: str = "native") -> Path:
    return BUILD / f"{module_name(variant)}{sysconfig.get_config_var('EXT_SUFFIX')}"


def _stamp_path(variant: str) -> Path:
    return BUILD / ("stamp" if variant == "native" else f"stamp_{variant}")


def _stamp(variant: str = "native") -> str:
    """What a variant's build must have been built from: the sources, its flags, this torch,
    and this CPU (a ``-march=native`` build from a node of another kind, on a shared file
    system, would stop the process on an illegal instruction rather than fail to load)."""
    digest = hashlib.sha256()
    for path in (*SOURCES, *HEADERS):
        digest.update(path.read_bytes())
    digest.update(" ".join((*FLAGS, *VARIANT_FLAGS[variant])).encode())
    digest.update(torch.__version__.encode())
    digest.update(cpu_name().encode())
    return digest.hexdigest()


def compile_command(sources: tuple[Path, ...], name: str, output: Path, variant: str = "native") -> list[str]:
    """The g++ command that builds ``sources`` as the Python module ``name`` into ``output``
    (against this torch, with :data:`FLAGS` and the variant's own)."""
    from torch.utils import cpp_extension

    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    torch_lib = cpp_extension.library_paths()[0]
    return [
        "g++",
        *FLAGS,
        *VARIANT_FLAGS[variant],
        "-shared",
        f"-DTORCH_EXTENSION_NAME={name}",
        "-DTORCH_API_INCLUDE_EXTENSION_H",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        *(f"-I{path}" for path in includes),
        *(str(source) for source in sources),
        f"-L{torch_lib}",
        f"-Wl,-rpath,{torch_lib}",
        "-lc10",
        "-ltorch",
        "-ltorch_cpu",
        "-ltorch_python",
        "-o",
        str(output),
    ]


def build(variants: list[str] | None = None) -> list[Path]:
    """Compile ``variants`` (default: :func:`host_variants`) into :data:`BUILD`, two at a time;
    raises ``RuntimeError`` with the compiler's words when the ``native`` one fails (a narrower
    variant that fails is left unbuilt: its tests skip)."""
    BUILD.mkdir(parents=True, exist_ok=True)
    variants = host_variants() if variants is None else variants
    built = []
    for start in range(0, len(variants), 2):
        running = {}
        for variant in variants[start : start + 2]:
            partial = library_path(variant).with_suffix(".partial")
            command = compile_command(SOURCES, module_name(variant), partial, variant)
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            running[variant] = (partial, process)
        for variant, (partial, process) in running.items():
            _, stderr = process.communicate()
            if process.returncode != 0:
                if variant == "native":
                    raise RuntimeError(f"g++ failed ({process.returncode}): {stderr.strip()[-3000:]}")
                continue
            partial.replace(library_path(variant))  # never a half-written library under the real name
            _stamp_path(variant).write_text(_stamp(variant))
            built.append(library_path(variant))
    _LOADED.clear()
    return built


# What load() found for each variant, looked up once per process (again after build()): a plain
# dict, so that torch.compile reads the answer instead of tracing a look-up of files.
_LOADED: dict[str, ModuleType | None] = {}


def load(variant: str = "native") -> ModuleType | None:
    """The built module of ``variant``, or None when it is not built for these sources and this torch."""
    if variant not in _LOADED:
        _LOADED[variant] = _load(variant)
    return _LOADED[variant]


def _load(variant: str) -> ModuleType | None:
    library, stamp = library_path(variant), _stamp_path(variant)
    if not library.exists() or not stamp.exists() or stamp.read_text() != _stamp(variant):
        return None
    spec = importlib.util.spec_from_file_location(module_name(variant), library)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_stamp(variant: str = "native") -> str | None:
    """The loaded build's stamp (its sources, flags and torch), or None when it is not built."""
    return None if load(variant) is None else _stamp(variant)


def built_variants() -> list[str]:
    """The variants built here and loadable, ``native`` first."""
    return [variant for variant in VARIANT_FLAGS if load(variant) is not None]
