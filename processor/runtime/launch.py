"""Run a function on P local processes joined in a gloo (CPU) or NCCL (GPU) process group.

For demos, benchmarks and single-machine runs; multi-node jobs use ``torchrun``. The parent
hosts the group's c10d store, so the store outlives any rank (a
:class:`~processor.runtime.watchdog.Heartbeat` can then name a lost rank 0).

gloo ranks start from a fork server (:func:`_start_context`): one process that imported torch
and the rank function's module once, for every run of this process, so a rank starts in a
fraction of a second instead of importing them again each (seconds per rank; a sweep or a test
suite starts hundreds). On a machine with a GPU ranks are spawned: nothing CUDA may come through
a fork.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue
import signal
import socket
import time
from collections.abc import Callable
from multiprocessing import forkserver
from typing import Any

from processor.runtime.failures import RankFailure, RanksFailedError

# After the first rank fails, the others get this long beyond the collective timeout to
# notice, explain and report (a diagnosis watches the heartbeats for a few seconds).
_REPORT_GRACE_S = 15.0
# The signals a launcher may have its ranks start with ignored, and Python's defaults for them.
_STOP_SIGNALS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(
    rank: int,
    world: int,
    port: int,
    backend: str,
    timeout_s: float,
    threads: int | None,
    fn: Callable[..., Any],
    args: tuple,
    results: mp.Queue,
    environ: dict[str, str],
    ignored: tuple[int, ...],
) -> None:
    import torch
    import torch.distributed as dist

    # What a spawned rank would have, not what the fork server had when it started: the
    # caller's environment, and SIGINT / SIGTERM ignored where the caller ignores them.
    os.environ.clear()
    os.environ.update(environ)
    for signum, default in _STOP_SIGNALS.items():
        signal.signal(signum, signal.SIG_IGN if signum in ignored else default)
    if threads:
        torch.set_num_threads(threads)
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    if backend == "nccl":
        torch.cuda.set_device(rank)
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
        results.put((rank, True, fn(*args)))
    except BaseException as exc:  # reported to the parent, which raises
        results.put((rank, False, RankFailure.from_exception(rank, exc)))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_local(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str = "gloo",
    timeout_s: float = 300.0,
    threads_per_rank: int | None = None,
    on_start: Callable[[list[mp.Process]], None] | None = None,
) -> list[Any]:
    """Call ``fn(*args)`` on ``world_size`` spawned ranks (the default group is initialised);
    return each rank's result in rank order. ``on_start`` is given the ranks' processes once
    they are started (e.g. to pass signals on to them).

    ``timeout_s`` bounds every collective. When a rank raises or dies, the others get
    ``timeout_s`` plus a grace period to fail and report in turn; then the ones left are killed
    and :class:`~processor.runtime.failures.RanksFailedError` (a ``RuntimeError``) says what
    happened on every rank: its text a line per rank and the first traceback, its ``failures``
    a :class:`~processor.runtime.failures.RankFailure` per failed rank.
    """
    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1",
        0,
        world_size,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    module = getattr(fn, "__module__", None)
    ctx = _start_context(backend, (module,) if module else ())
    results: mp.Queue = ctx.Queue()
    environ = dict(os.environ)
    ignored = tuple(s for s in _STOP_SIGNALS if signal.getsignal(s) is signal.SIG_IGN)
    procs = [
        ctx.Process(
            target=_entry,
            args=(r, world_size, store.port, backend, timeout_s, threads_per_rank, fn, args, results, environ, ignored),
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    if on_start is not None:
        on_start(procs)
    ok, failed = _collect(procs, results, timeout_s)
    if failed:
        silent = [RankFailure.silent(r, timeout_s + _REPORT_GRACE_S) for r in range(world_size) if r not in ok | failed]
        raise RanksFailedError(range(world_size), [*failed.values(), *silent])
    return [ok[r] for r in range(world_size)]


def start_fork_server(*modules: str) -> None:
    """Start the gloo ranks' fork server now, importing torch and ``modules``, whatever the first
    :func:`run_local` of the process will run (a test suite's). No effect where it runs already."""
    if _start_context("gloo", modules).get_start_method() == "forkserver":
        forkserver.ensure_running()


def _start_context(backend: str, modules: tuple[str, ...]) -> mp.context.BaseContext:
    """How ranks start: spawned on a machine with a GPU (a module the server imports may touch
    CUDA, and a CUDA driver initialised before a fork fails in the child: gloo ranks that share
    a GPU, NCCL ranks); else forked from the fork server, which imports torch and ``modules``
    once (those named when the process first starts it: the server outlives runs)."""
    import torch

    if backend == "nccl" or torch.cuda.is_available() or "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", *(m for m in modules if m != "__main__")])
    return ctx


def _collect(
    procs: list[mp.Process], results: mp.Queue, timeout_s: float
) -> tuple[dict[int, Any], dict[int, RankFailure]]:
    """Each rank's result or failure (in the order seen) as they arrive; once one failed, the
    others get ``timeout_s`` plus a grace period, then every rank left is killed."""
    world_size = len(procs)
    ok: dict[int, Any] = {}
    failed: dict[int, RankFailure] = {}
    deadline = float("inf")
    try:
        while len(ok) + len(failed) < world_size and time.monotonic() < deadline:
            try:
                rank, success, value = results.get(timeout=0.5)
            except queue.Empty:
                for r, p in enumerate(procs):
                    if r not in ok and r not in failed and p.exitcode not in (None, 0):
                        failed[r] = RankFailure.died(r, p.exitcode)
            else:
                (ok if success else failed)[rank] = value
            if failed and deadline == float("inf"):
                deadline = time.monotonic() + timeout_s + _REPORT_GRACE_S
    finally:
        for p in procs:
            p.join(timeout=5 if not failed else 0.1)
            if p.is_alive():
                p.kill()
                p.join()
    return ok, failed
