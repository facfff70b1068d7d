"""Heartbeats in the c10d store, so that a failed collective can name the rank to blame.

gloo reports a dead peer as "Connection closed by peer [address]" and a stuck one as a
timeout; neither names a rank. Each rank therefore runs a :class:`Heartbeat`: a daemon thread
that bumps the counter ``heartbeat/<rank>`` in the process group's store every ``interval_s``.
A rank that leaves writes why to ``left/<rank>`` (``finished`` or the error it raised). When a
collective fails, :meth:`Heartbeat.explain` watches the counters for a few intervals:

- a rank that neither beats nor left word is **lost** (killed, crashed, its host gone);
- a rank that beats but left no word is **stuck**: alive, but not in the collective;
- a rank that left with an error **stopped** with that error.

The store must outlive every rank: torchrun's agent hosts it, and so does the parent process
of :func:`processor.runtime.launch.run_local`.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import time
from types import TracebackType

import torch.distributed as dist

from processor.runtime.torchrun import attempt_prefix

log = logging.getLogger(__name__)

_PREFIX = "gridshard/"
# Substrings of the errors gloo and NCCL raise when a peer or the network fails.
_COLLECTIVE_MARKERS = ("gloo", "nccl", "connection closed", "connection reset", "timed out", "broken pipe")


class PeerFailureError(RuntimeError):
    """A collective failed because another rank was lost, is stuck, or stopped with an error."""


def is_collective_failure(exc: BaseException) -> bool:
    """Whether ``exc`` looks like a failed collective rather than this rank's own error."""
    if isinstance(exc, dist.DistError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in _COLLECTIVE_MARKERS)


class Heartbeat:
    """This rank's heartbeat, and the diagnosis of the others' when a collective fails.

    Use as a context manager around everything that communicates: on the way out it records
    why this rank left, and turns a failed collective into a :class:`PeerFailureError` that
    names the rank to blame (the original error is its ``__cause__``).

    Args:
        store: a c10d store shared by the ranks and hosted outside them (or by rank 0).
        rank, world: this rank and the number of ranks.
        interval_s: seconds between beats; a diagnosis watches ``3 * interval_s``.
        nodes: the node of every rank (:func:`~processor.runtime.placement.this_node`): on
            several nodes, lost ranks are named by node.
    """

    def __init__(
        self, store: dist.Store, rank: int, world: int, interval_s: float = 1.0, nodes: list[str] | None = None
    ) -> None:
        self.store, self.rank, self.world, self.interval_s = store, rank, world, interval_s
        self.nodes = nodes if nodes and len(nodes) == world else None
        # torchrun's restarts may share a store: keep each attempt's keys apart.
        self._prefix = f"{_PREFIX}{attempt_prefix()}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{rank}", daemon=True)

    @classmethod
    def from_env(
        cls, rank: int, world: int, interval_s: float = 1.0, timeout_s: float = 60.0, nodes: list[str] | None = None
    ) -> Heartbeat:
        """A heartbeat in the store at ``MASTER_ADDR:MASTER_PORT``: the one torchrun's agent
        hosts (or rank 0, see :mod:`processor.runtime.torchrun`), or
        :func:`~processor.runtime.launch.run_local`'s parent. A client connection of its own, so
        it beats while the process group is busy."""
        try:
            host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        except (KeyError, ValueError):
            raise ValueError("a heartbeat needs MASTER_ADDR and MASTER_PORT (set by torchrun and run_local)") from None
        store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
        return cls(store, rank, world, interval_s, nodes)

    def _key(self, kind: str, rank: int) -> str:
        return f"{self._prefix}{kind}/{rank}"

    def _beat(self) -> None:
        while True:
            try:
                self.store.add(self._key("heartbeat", self.rank), 1)
            except Exception:  # the store is gone; the diagnosis will say so
                return
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if exc is None:
            self._leave("finished")
        elif isinstance(exc, PeerFailureError) or not is_collective_failure(exc):
            self._leave(f"{type(exc).__name__}: {exc}")
        else:
            self._leave("a collective failed")
            cause = self.explain()
            self._stop.set()
            if cause is not None:
                first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise PeerFailureError(f"{cause} [the collective raised: {first_line}]") from exc
        self._stop.set()
        return False

    def _leave(self, reason: str) -> None:
        try:
            self.store.set(self._key("left", self.rank), reason[:500])
        except Exception:
            log.debug("could not record why rank %d left", self.rank)

    def _counters(self, ranks: list[int]) -> list[int]:
        return [self.store.add(self._key("heartbeat", r), 0) for r in ranks]

    def _left(self, ranks: list[int]) -> dict[int, str]:
        keys = {r: self._key("left", r) for r in ranks}
        return {r: self.store.get(k).decode() for r, k in keys.items() if self.store.check([k])}

    def explain(self) -> str | None:
        """Watch the other ranks for ``3 * interval_s`` and say which one is to blame, or ``None``
        when every other rank is alive and failed too (nothing more to say)."""
        others = [r for r in range(self.world) if r != self.rank]
        try:
            before = self._counters(others)
            time.sleep(3 * self.interval_s)
            after = self._counters(others)
            left = self._left(others)
        except Exception as exc:
            return f"the c10d store is unreachable ({type(exc).__name__}): {self._store_host()} was lost"
        lost = [r for r, b, a in zip(others, before, after) if a == b and r not in left]
        if lost:
            return f"{self._name_lost(lost)} (no heartbeat for {3 * self.interval_s:g} s)"
        stuck = [r for r in others if r not in left]
        if stuck:
            return f"{_ranks(stuck)} {'is' if len(stuck) == 1 else 'are'} stuck: alive, but not in the collective"
        stopped = {r: why for r, why in left.items() if why not in ("finished", "a collective failed")}
        if stopped:
            return "; ".join(f"rank {r} stopped with {why}" for r, why in sorted(stopped.items()))
        return None

    def _several_nodes(self) -> bool:
        return self.nodes is not None and len(set(self.nodes)) > 1

    def _name_lost(self, lost: list[int]) -> str:
        """``rank 1 was lost``; on several nodes, by node: ``node 1 (host) (ranks [2, 3]) was lost``
        when all its ranks are, else ``rank 3 of node 1 (host) was lost``."""
        if not self._several_nodes():
            return f"{_ranks(lost)} {'was' if len(lost) == 1 else 'were'} lost"
        parts, whole = [], []
        for node in dict.fromkeys(self.nodes[r] for r in lost):
            on_node = [r for r in range(self.world) if self.nodes[r] == node]
            mine = [r for r in lost if self.nodes[r] == node]
            if mine == on_node:
                whole.append(f"{node} (ranks {mine})" if len(mine) > 1 else f"{node} (rank {mine[0]})")
            else:
                parts.append(f"{_ranks(mine)} of {node}")
        return f"{' and '.join(whole + parts)} {'was' if len(whole + parts) == 1 else 'were'} lost"

    def _store_host(self) -> str:
        """Who hosted the store: torchrun's agent of rank 0's node or rank 0 itself, else the launcher."""
        if self._several_nodes():
            return f"{self.nodes[0]}, which hosts it with rank 0,"
        return "the rank or launcher hosting it"


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"
