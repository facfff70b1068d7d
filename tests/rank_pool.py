"""A pool of local gloo ranks that stays up for the whole test session.

Starting ranks costs seconds (process spawn, torch import, the gloo rendezvous), so the session
starts one pool and every module runs its cases in it; a pool that a case broke (a timeout, a
rank that died) is replaced before the next module (:attr:`RankPool.healthy`).

The world has ``max_ranks`` processes and one sub-group for every size ``2..max_ranks`` (ranks
``0..p-1``). ``pool.run(fn, p, *args)`` calls ``fn(group, *args)`` on the first ``p`` ranks and
returns their results in rank order; results should be numpy arrays or plain Python values, not
tensors.

A rank that raises returns a :class:`RankError` instead of a result, so a test can check
that *every* rank raised. A case that does not finish within ``timeout`` seconds fails the
test and tears the pool down (a hang never blocks the suite).
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import queue
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from processor.runtime import free_port


@dataclass
class RankError:
    """What a rank raised: its type name, message and traceback."""

    type: str
    message: str
    traceback: str


def _worker(rank: int, world: int, port: int, tasks: mp.Queue, results: mp.Queue, timeout_s: float) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    groups = {p: dist.new_group(list(range(p))) for p in range(2, world)}
    groups[world] = dist.group.WORLD
    results.put((rank, "ready", None))
    while True:
        task = tasks.get()
        if task is None:
            break
        fn, p, args = task
        if rank >= p:
            results.put((rank, "skip", None))
            continue
        try:
            out = fn(groups[p], *args) if p > 1 else fn(None, *args)
            results.put((rank, "ok", out))
        except Exception as exc:  # reported to the test, which decides
            results.put((rank, "error", RankError(type(exc).__name__, str(exc), traceback.format_exc())))
    dist.destroy_process_group()


class RankPool:
    def __init__(self, max_ranks: int, timeout: float = 120.0) -> None:
        ctx = mp.get_context("spawn")
        port = free_port()
        self.world, self.timeout = max_ranks, timeout
        self.closed = False
        self.results: mp.Queue = ctx.Queue()
        self.tasks = [ctx.Queue() for _ in range(max_ranks)]
        self.procs = [
            ctx.Process(target=_worker, args=(r, max_ranks, port, self.tasks[r], self.results, timeout), daemon=True)
            for r in range(max_ranks)
        ]
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        for p in self.procs:
            p.start()
        self._collect("ready")

    def _collect(self, what: str) -> list[tuple[str, Any]]:
        got: dict[int, tuple[str, Any]] = {}
        while len(got) < self.world:
            try:
                rank, status, value = self.results.get(timeout=self.timeout)
            except queue.Empty:
                self.close()
                raise TimeoutError(
                    f"ranks {sorted(set(range(self.world)) - set(got))} did not answer ({what}) within {self.timeout} s"
                ) from None
            got[rank] = (status, value)
        return [got[r] for r in range(self.world)]

    def run(self, fn: Callable[..., Any], ranks: int, *args: Any) -> list[Any]:
        """``fn(group, *args)`` on ranks ``0..ranks-1``; their results (or :class:`RankError`)."""
        if not 1 <= ranks <= self.world:
            raise ValueError(f"pool has {self.world} ranks, asked for {ranks}")
        for q in self.tasks:
            q.put((fn, ranks, args))
        answers = self._collect(getattr(fn, "__name__", "task"))
        return [value for status, value in answers[:ranks]]

    def run_ok(self, fn: Callable[..., Any], ranks: int, *args: Any) -> list[Any]:
        """Like :meth:`run`, but a rank's exception fails the caller with that rank's traceback."""
        out = self.run(fn, ranks, *args)
        for r, value in enumerate(out):
            if isinstance(value, RankError):
                raise AssertionError(f"rank {r} raised {value.type}: {value.message}\n{value.traceback}")
        return out

    @property
    def healthy(self) -> bool:
        """Open, and every rank's process alive (a case that timed out closes the pool)."""
        return not self.closed and all(p.is_alive() for p in self.procs)

    def close(self) -> None:
        self.closed = True
        for q in self.tasks:
            q.put(None)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
