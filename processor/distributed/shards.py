"""How points (or heads) are split into contiguous blocks over the ranks of a group.

The split is anemoi's: the first ``n % p`` ranks get ``n // p + 1`` items, the rest
``n // p``. Rank ``r`` holds the half-open range ``[offsets[r], offsets[r] + sizes[r])``.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate


def shard_sizes(n_items: int, n_ranks: int) -> list[int]:
    """Balanced contiguous block sizes: ``n_items`` split over ``n_ranks``, larger blocks first."""
    if n_ranks < 1:
        raise ValueError(f"n_ranks must be >= 1, got {n_ranks}")
    if n_items < 0:
        raise ValueError(f"n_items must be >= 0, got {n_items}")
    base, extra = divmod(n_items, n_ranks)
    return [base + 1 if r < extra else base for r in range(n_ranks)]


def shard_offsets(sizes: list[int]) -> list[int]:
    """First global index of each block: the exclusive prefix sum of ``sizes``."""
    return [0, *accumulate(sizes)][:-1]


@dataclass(frozen=True)
class ShardLayout:
    """One rank's view of a split of ``sum(sizes)`` points over ``len(sizes)`` ranks."""

    sizes: tuple[int, ...]
    rank: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < len(self.sizes):
            raise ValueError(f"rank {self.rank} outside a group of {len(self.sizes)} ranks")
        if any(s < 0 for s in self.sizes):
            raise ValueError(f"shard sizes must be >= 0, got {list(self.sizes)}")

    @property
    def world_size(self) -> int:
        return len(self.sizes)

    @property
    def total(self) -> int:
        return sum(self.sizes)

    @property
    def offsets(self) -> list[int]:
        return shard_offsets(list(self.sizes))

    @property
    def start(self) -> int:
        return self.offsets[self.rank]

    @property
    def stop(self) -> int:
        return self.start + self.sizes[self.rank]

    @property
    def local_size(self) -> int:
        return self.sizes[self.rank]
