"""Run a function on P local processes joined in a gloo (CPU) or NCCL (GPU) process group.

For demos, benchmarks and single-machine runs; multi-node jobs use ``torchrun``.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue
import socket
import traceback
from collections.abc import Callable
from typing import Any


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
) -> None:
    import torch
    import torch.distributed as dist

    if threads:
        torch.set_num_threads(threads)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    if backend == "nccl":
        torch.cuda.set_device(rank)
    try:
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        results.put((rank, True, fn(*args)))
    except BaseException:  # reported to the parent, which raises
        results.put((rank, False, traceback.format_exc()))
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
) -> list[Any]:
    """Call ``fn(*args)`` on ``world_size`` spawned ranks (the default group is initialised);
    return each rank's result in rank order. A rank that raises or dies raises ``RuntimeError``
    here and the remaining ranks are killed; ``timeout_s`` bounds every collective."""
    ctx = mp.get_context("spawn")
    results: mp.Queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_entry, args=(r, world_size, port, backend, timeout_s, threads_per_rank, fn, args, results))
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    try:
        while len(got) < world_size:
            try:
                rank, ok, value = results.get(timeout=1.0)
            except queue.Empty:
                # A rank that died without reporting (killed, crashed) ends the run, not a hang.
                dead = [r for r, p in enumerate(procs) if r not in got and p.exitcode not in (None, 0)]
                if dead:
                    codes = {r: procs[r].exitcode for r in dead}
                    raise RuntimeError(f"ranks {dead} died without a result (exit codes {codes})") from None
                continue
            if not ok:
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            got[rank] = value
    finally:
        for p in procs:
            p.join(timeout=5 if len(got) == world_size else 0.1)
            if p.is_alive():
                p.kill()
    return [got[r] for r in range(world_size)]
