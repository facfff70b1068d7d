"""``attention_path=auto`` by measurement: time the eligible paths once per host and call shape,
keep the winner on disk, reuse it in every later run (as cuDNN's benchmark mode and Triton's
autotuner do).

The static rule of :func:`~processor.attention.dispatch.choose_path` guesses from the device
alone; on CPUs it was tuned on one kind (AMD Zen 3), and on another kind (Intel with AVX-512
and AMX) it picked the slowest of the three CPU paths. :func:`fastest_path` instead runs the
call shape (forward, and backward when training) through each path that can take it, a few
alternating rounds on random tensors, and picks the least median time. The result is cached in
a JSON file (:func:`default_cache_file`) under a key naming the host (CPU model and vector
width, or GPU), torch's version, the native kernel's build, the thread count and the call
shape; a cached choice costs nothing. A path that fails on the probe's tensors (out of memory,
a compiler error) is left out of the choice, and named. Callers that run several ranks decide
once (the launching process, before any rank starts) and hand every rank the concrete path, so
a group never mixes kernels.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType

import torch

from processor.attention.dispatch import AttentionCall, path_problem, sees_every_key
from processor.attention.kernel import sliding_window_attention
from processor.attention.native_build import build_stamp
from processor.host import cache_dir, cpu_name, device_name

# What may win, per device: every windowed path but those that cannot pay off (``dense`` and
# ``scored`` build O(N·W) or O(N^2) logits; ``flex`` on CPU compiles for 10-14 s per shape and
# has no backward there).
CANDIDATES = MappingProxyType(
    {"cpu": ("native", "banded", "sdpa_blocks"), "cuda": ("flash_attn", "flex", "sdpa_blocks")}
)
# When every query sees every key: the fused dense call, or on CPU the native kernel over all keys.
GLOBAL_CANDIDATES = MappingProxyType({"cpu": ("native", "dense")})
CACHE_NAME = "attention_paths.json"


@dataclass(frozen=True)
class ProbeShape:
    """One rank's attention call: q ``(batch, heads, n_q, head_dim)``, keys ``n_k`` (a halo
    around the queries when ``n_k > n_q``: the queries start at ``(n_k - n_q) // 2``)."""

    batch: int
    heads: int
    n_q: int
    n_k: int
    head_dim: int
    window: int | None
    dtype: str = "float32"
    needs_grad: bool = True

    def __post_init__(self) -> None:
        if min(self.batch, self.heads, self.n_q, self.head_dim) < 1 or self.n_k < self.n_q:
            raise ValueError(f"attention probe shape {self} is empty or has fewer keys than queries")

    @property
    def q_offset(self) -> int:
        return (self.n_k - self.n_q) // 2

    def call(self, device: torch.device) -> AttentionCall:
        window = self.n_k if self.window is None else self.window
        return AttentionCall(
            device.type,
            getattr(torch, self.dtype),
            self.head_dim,
            self.n_q,
            self.n_k,
            window,
            self.q_offset,
            False,
            0.0,
            self.needs_grad,
        )


@dataclass(frozen=True)
class PathChoice:
    """What :func:`fastest_path` picked, each candidate's median seconds, and whether from the cache."""

    path: str
    seconds: dict[str, float] = field(default_factory=dict)
    cached: bool = False
    host: str = ""

    def describe(self) -> str:
        """One line for the run's log."""
        if not self.seconds:
            return f"attention_path=auto: {self.path} (the only path for this call)"
        ranked = sorted(self.seconds.items(), key=lambda i: i[1])
        times = ", ".join(f"{path} failed" if math.isinf(s) else f"{path} {s * 1e3:.1f} ms" for path, s in ranked)
        source = "cached" if self.cached else "probed now"
        return f"attention_path=auto on {self.host}: picked {self.path} ({source}; {times})"


def host_name(device: torch.device) -> str:
    """The host's kind as its kernels see it (:func:`processor.host.device_name`), and the vector
    width torch's own CPU kernels run at."""
    if device.type == "cuda":
        return device_name(device)
    return f"{cpu_name()}, torch {torch.backends.cpu.get_cpu_capability()}"


def cache_key(shape: ProbeShape, device: torch.device) -> str:
    """The host, torch, the native kernel's build, this process's threads and the call: what a
    cached choice holds for."""
    build = build_stamp("native") or "none"  # a changed kernel is timed anew
    threads = torch.get_num_threads()  # the ranking of paths can change with the thread count
    parts = [host_name(device), torch.__version__, build, threads, device.type, asdict(shape)]
    text = json.dumps(parts, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def default_cache_file() -> Path:
    """``attention_paths.json`` in this machine's :func:`~processor.host.cache_dir`."""
    return cache_dir() / CACHE_NAME


def eligible_paths(shape: ProbeShape, device: torch.device) -> list[str]:
    """The candidates that can run this call here (:data:`GLOBAL_CANDIDATES` when the window
    holds every key)."""
    call = shape.call(device)
    every_key = sees_every_key(call.n_q, call.n_k, call.window, call.q_offset)
    candidates = (GLOBAL_CANDIDATES if every_key else CANDIDATES).get(device.type, ())
    return [path for path in candidates if path_problem(path, call) is None] or [
        "dense" if every_key else "sdpa_blocks"
    ]


def time_paths(shape: ProbeShape, paths: list[str], device: torch.device, rounds: int = 3) -> dict[str, float]:
    """Median seconds of one call (forward, and backward when ``shape.needs_grad``) through each
    path, after a warm-up call each; the paths alternate round by round, so a shared machine's
    drift falls on all of them. A path whose call raises gets ``inf``."""
    g = torch.Generator(device=device).manual_seed(0)
    dtype = getattr(torch, shape.dtype)

    def tensor(n: int) -> torch.Tensor:  # point-major, as the processor lays them out
        t = torch.randn(shape.batch, n, shape.heads, shape.head_dim, generator=g, device=device, dtype=dtype)
        return t.transpose(1, 2).requires_grad_(shape.needs_grad)

    q, k, v = tensor(shape.n_q), tensor(shape.n_k), tensor(shape.n_k)
    cotangent = torch.randn_like(q)
    times: dict[str, list[float]] = {path: [] for path in paths}
    failed: set[str] = set()
    for round_ in range(rounds + 1):
        for path in [p for p in (paths if round_ % 2 == 0 else reversed(paths)) if p not in failed]:
            try:
                seconds = _one_call(q, k, v, cotangent, shape, path)
            except (RuntimeError, ValueError, MemoryError):  # torch's OutOfMemoryError is a RuntimeError
                failed.add(path)
                continue
            if round_ > 0:  # round 0 warms up (allocations, a compiled path's first call)
                times[path].append(seconds)
    return {path: math.inf if path in failed else statistics.median(t) for path, t in times.items()}


def _one_call(q, k, v, cotangent, shape: ProbeShape, path: str) -> float:
    synchronize = torch.cuda.synchronize if q.device.type == "cuda" else (lambda: None)
    synchronize()
    start = time.perf_counter()
    with torch.set_grad_enabled(shape.needs_grad):
        out = sliding_window_attention(q, k, v, shape.window, q_offset=shape.q_offset, path=path)
        if shape.needs_grad:
            torch.autograd.grad(out, (q, k, v), cotangent)
    synchronize()
    return time.perf_counter() - start


def fastest_path(shape: ProbeShape, device: torch.device, cache_file: Path | None = None) -> PathChoice:
    """The fastest eligible path for ``shape`` on this host: from ``cache_file`` (default
    :func:`default_cache_file`) when this host has measured it, else measured now and saved."""
    cache_file = default_cache_file() if cache_file is None else cache_file
    host = host_name(device)
    paths = eligible_paths(shape, device)
    if len(paths) == 1:
        return PathChoice(paths[0], host=host)
    key = cache_key(shape, device)
    entry = read_choices(cache_file).get(key)
    if isinstance(entry, dict) and entry.get("path") in paths:
        return PathChoice(entry["path"], dict(entry.get("seconds", {})), cached=True, host=host)
    seconds = time_paths(shape, paths, device)
    if all(math.isinf(s) for s in seconds.values()):
        raise RuntimeError(f"attention_path=auto: every path failed on a call of shape {shape} ({', '.join(paths)})")
    choice = PathChoice(min(seconds, key=seconds.__getitem__), seconds, host=host)
    entry = {"path": choice.path, "seconds": seconds, "host": host, "torch": torch.__version__, **asdict(shape)}
    add_choice(cache_file, key, entry)
    return choice


def read_choices(cache_file: Path) -> dict:
    """The choices saved in ``cache_file`` by key ({} when there is none or it is unreadable)."""
    try:
        data = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: measure again
    return data if isinstance(data, dict) else {}


def add_choice(cache_file: Path, key: str, entry: dict) -> None:
    """Add ``entry`` under ``key``: under a lock, the file read again and replaced atomically,
    so that runs probing at once (a sweep's members, jobs sharing a home) keep each other's
    entries and a reader sees the old file or the new, never half."""
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        with open(cache_file.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            cache = read_choices(cache_file)
            cache[key] = entry
            partial = cache_file.with_suffix(f".{os.getpid()}.partial")
            partial.write_text(json.dumps(cache, indent=1, sort_keys=True))
            partial.replace(cache_file)
    except OSError:
        pass  # a read-only home: the choice still holds for this run
