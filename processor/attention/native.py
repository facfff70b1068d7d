"""The fused CPU band-attention kernel (``csrc/band_attention.cpp``): built once on this machine,
loaded when built, and its autograd function.

``python -m processor.attention.build_kernel`` (run by ``scripts/setup.sh``) compiles it with the
machine's g++ against the installed torch (``-O3 -march=native``: built where it runs), into
``csrc/build/``, beside a stamp of the source, the flags and the torch version it was built
from. :func:`native_kernel` loads it only when that stamp matches (a kernel built from other
sources or for another torch is never loaded: rebuild), else returns None and the dispatcher
keeps to the Python paths.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import subprocess
import sysconfig
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

NAME = "gridshard_band_attention"
SOURCE = Path(__file__).parent / "csrc" / "band_attention.cpp"
HEADERS = tuple(  # in the stamp too
    Path(__file__).parent / "csrc" / name for name in ("simd.h", "small_gemm.h", "tile_products.h", "row_passes.h")
)
BUILD = Path(__file__).parent / "csrc" / "build"
PROFILE_NAME = "gridshard_band_attention"  # what the profiler calls its calls
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-std=c++17", "-fPIC")


def _stamp() -> str:
    """What the built module must have been built from: the sources, the flags, this torch."""
    digest = hashlib.sha256()
    for path in (SOURCE, *HEADERS):
        digest.update(path.read_bytes())
    digest.update(" ".join(FLAGS).encode())
    digest.update(torch.__version__.encode())
    return digest.hexdigest()


def _library() -> Path:
    return BUILD / f"{NAME}{sysconfig.get_config_var('EXT_SUFFIX')}"


def compile_command(source: Path, name: str, output: Path) -> list[str]:
    """The g++ command that builds ``source`` as the Python module ``name`` into ``output``
    (against this torch, with :data:`FLAGS`)."""
    from torch.utils import cpp_extension

    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    torch_lib = cpp_extension.library_paths()[0]
    return [
        "g++",
        *FLAGS,
        "-shared",
        f"-DTORCH_EXTENSION_NAME={name}",
        "-DTORCH_API_INCLUDE_EXTENSION_H",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        *(f"-I{path}" for path in includes),
        str(source),
        f"-L{torch_lib}",
        f"-Wl,-rpath,{torch_lib}",
        "-lc10",
        "-ltorch",
        "-ltorch_cpu",
        "-ltorch_python",
        "-o",
        str(output),
    ]


def build() -> Path:
    """Compile the kernel into :data:`BUILD`; raises ``RuntimeError`` with the compiler's words."""
    BUILD.mkdir(parents=True, exist_ok=True)
    library = _library()
    partial = library.with_suffix(".partial")
    done = subprocess.run(compile_command(SOURCE, NAME, partial), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"g++ failed ({done.returncode}): {done.stderr.strip()[-3000:]}")
    partial.replace(library)  # never a half-written library under the real name
    (BUILD / "stamp").write_text(_stamp())
    native_kernel.cache_clear()
    return library


@functools.cache
def native_kernel() -> ModuleType | None:
    """The built kernel module, or None when it is not built for these sources and this torch."""
    library, stamp = _library(), BUILD / "stamp"
    if not library.exists() or not stamp.exists() or stamp.read_text() != _stamp():
        return None
    spec = importlib.util.spec_from_file_location(NAME, library)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def native_available() -> bool:
    """Whether the fused CPU kernel is built and loads."""
    return native_kernel() is not None


def native_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    q_offset: int,
    scale: float,
    ids: Tensor | None,
    q_ids: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``(out, lse)`` of queries ``(batch, heads, n_q, head_dim)`` over keys ``(batch, heads, n_k,
    head_dim)`` (any dtype: computed in float32); query ``i`` at key position ``q_offset + i``
    (any integer: the ring's blocks lie apart). ``ids`` ``(1 or batch, n_k)`` or None; ``q_ids``
    ``(1 or batch, n_q)`` the queries' own (None: those of keys ``q_offset + i``).
    ``out`` has q's dtype and strides, ``lse`` ``(batch, heads, n_q)`` float32 (``-inf`` for a
    query that reaches no key, whose output is 0)."""
    kernel = native_kernel()
    assert kernel is not None, "the native band-attention kernel is not built"
    q32, k32, v32 = (_float_rows(t) for t in (q, k, v))
    with torch.profiler.record_function(PROFILE_NAME):
        out, lse = kernel.forward(q32, k32, v32, int(window), int(q_offset), float(scale), _ids(ids), _ids(q_ids))
    return out.to(q.dtype), lse


def native_backward(
    grad: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    window: int,
    q_offset: int,
    scale: float,
    ids: Tensor | None,
    q_ids: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` given the (possibly merged) ``out`` and ``lse`` of these queries."""
    kernel = native_kernel()
    assert kernel is not None, "the native band-attention kernel is not built"
    tensors = [_float_rows(t) for t in (grad, q, k, v, out)]
    args = (lse.float(), int(window), int(q_offset), float(scale), _ids(ids), _ids(q_ids))
    with torch.profiler.record_function(PROFILE_NAME + "_backward"):
        dq, dk, dv = kernel.backward(*tensors, *args)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _float_rows(t: Tensor) -> Tensor:
    """``t`` in float32 with a contiguous last dimension (itself when it is already)."""
    t = t.float()
    return t if t.stride(-1) == 1 else t.contiguous()


def _ids(ids: Tensor | None) -> Tensor | None:
    return None if ids is None else ids.to(torch.int64).contiguous()


class NativeBandAttention(torch.autograd.Function):
    """The fused kernel with its own backward; saves q, k, v, out and lse."""

    @staticmethod
    def forward(ctx, q, k, v, window: int, q_offset: int, scale: float, ids):  # type: ignore[override]
        out, lse = native_forward(q, k, v, window, q_offset, scale, ids)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.geometry = (window, q_offset, scale, ids)
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = native_backward(grad, q, k, v, out, lse, *ctx.geometry)
        return dq, dk, dv, None, None, None, None
