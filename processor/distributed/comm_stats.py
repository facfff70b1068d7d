"""Bytes sent by this process's collectives, counted where they are issued.

Benchmarks and training wrap steps in :func:`count_communication`; every primitive in
:mod:`processor.distributed.collectives` and :mod:`processor.distributed.halo` reports what
it sends to *other* ranks (a rank's chunk to itself is not communication). Counting is
process-wide rather than per thread because autograd may run backward on another thread.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

_lock = threading.Lock()
_active: list[CommCounter] = []


@dataclass
class CommCounter:
    """Bytes sent and calls made, per kind of operation (e.g. ``"all_to_all"``, ``"halo"``)."""

    bytes_sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_sent.values())

    def reset(self) -> None:
        self.bytes_sent.clear()
        self.calls.clear()


def record_sent(kind: str, nbytes: int) -> None:
    """Add ``nbytes`` sent by one ``kind`` operation to every active counter."""
    with _lock:
        for counter in _active:
            counter.bytes_sent[kind] += nbytes
            counter.calls[kind] += 1


@contextmanager
def count_communication() -> Iterator[CommCounter]:
    """Count the bytes this process sends inside the ``with`` block (forward and backward)."""
    counter = CommCounter()
    with _lock:
        _active.append(counter)
    try:
        yield counter
    finally:
        with _lock:
            _active.remove(counter)
