"""Run a function on P local processes joined in a gloo (CPU) or NCCL (GPU) process group.

For demos, benchmarks and single-machine runs; multi-node jobs use ``torchrun``. The parent
hosts the group's c10d store, so the store outlives any rank (a
:class:`~processor.runtime.watchdog.Heartbeat` can then name a lost rank 0).
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue
import signal
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

# After the first rank fails, the others get this long beyond the collective timeout to
# notice, explain and report (a diagnosis watches the heartbeats for a few seconds).
_REPORT_GRACE_S = 15.0


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
    except BaseException:  # reported to the parent, which raises
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _death(exitcode: int) -> str:
    if exitcode < 0:
        return f"died without a result (killed by {signal.Signals(-exitcode).name})"
    return f"died without a result (exit code {exitcode})"


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
    and ``RuntimeError`` lists what happened on every rank, with the first traceback.
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
    ctx = mp.get_context("spawn")
    results: mp.Queue = ctx.Queue()
    procs = [
        ctx.Process(
            target=_entry,
            args=(r, world_size, store.port, backend, timeout_s, threads_per_rank, fn, args, results),
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    if on_start is not None:
        on_start(procs)
    ok: dict[int, Any] = {}
    failed: dict[int, str] = {}  # rank -> traceback or how it died, in the order seen
    deadline = float("inf")
    try:
        while len(ok) + len(failed) < world_size and time.monotonic() < deadline:
            try:
                rank, success, value = results.get(timeout=0.5)
            except queue.Empty:
                for r, p in enumerate(procs):
                    if r not in ok and r not in failed and p.exitcode not in (None, 0):
                        failed[r] = _death(p.exitcode)
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
    if failed:
        raise RuntimeError(_failure_report(world_size, ok, failed, timeout_s + _REPORT_GRACE_S))
    return [ok[r] for r in range(world_size)]


def _failure_report(world: int, ok: dict[int, Any], failed: dict[int, str], waited_s: float) -> str:
    """One line per rank, then the first traceback a rank sent."""
    lines = [f"{len(failed)} of {world} ranks failed:"]
    for r in range(world):
        if r in ok:
            lines.append(f"  rank {r}: finished")
        elif r in failed:
            lines.append(f"  rank {r}: {failed[r].strip().splitlines()[-1]}")
        else:
            lines.append(f"  rank {r}: did not report within {waited_s:g} s of the first failure (killed)")
    first = next((r for r, text in failed.items() if text.startswith("Traceback")), None)
    if first is not None:
        lines.append(f"rank {first}'s traceback:\n{failed[first]}")
    return "\n".join(lines)
