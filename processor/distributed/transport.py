"""How the communication primitives move bytes, and the counter that sees what they send.

Every primitive (the all-to-all, the halo exchange, the sharded region's all-gather and
reduce-scatter) sends through a :class:`Transport` passed in explicitly, forward and backward
alike. The default sends over the process group; give it a :class:`CommCounter` to count the
bytes each kind of operation sends to *other* ranks (a rank's chunk to itself is not
communication). A benchmark may pass a transport of its own (say, one that copies locally
instead of sending) without the model code knowing.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor


def collective_device(group: dist.ProcessGroup | None) -> torch.device:
    """Where ``group``'s collectives take their tensors: the current CUDA device under NCCL,
    else the CPU (gloo). For the small bookkeeping tensors (agreement tables) built here."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@dataclass
class CommCounter:
    """Bytes sent and calls made, per kind of operation (``"all_to_all"``, ``"halo"``,
    ``"ring"``, ``"all_gather"``, ``"reduce_scatter"``). Safe to share between the forward thread and
    autograd's backward thread."""

    bytes_sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_sent.values())

    def record(self, kind: str, nbytes: int) -> None:
        with self._lock:
            self.bytes_sent[kind] += nbytes
            self.calls[kind] += 1

    def reset(self) -> None:
        with self._lock:
            self.bytes_sent.clear()
            self.calls.clear()


@dataclass
class Posted:
    """Point-to-point work in flight, the tensors it sends and the buffers it receives into."""

    works: list
    outgoing: list[Tensor]
    incoming: list[Tensor]

    def wait(self) -> list[Tensor]:
        for work in self.works:
            work.wait()
        return self.incoming


@dataclass(frozen=True)
class Transport:
    """Sends over ``group`` with torch.distributed; counts into ``counter`` when one is given."""

    counter: CommCounter | None = None

    def _record(self, kind: str, nbytes: int) -> None:
        if self.counter is not None:
            self.counter.record(kind, nbytes)

    def post(
        self,
        outgoing: list[tuple[int, Tensor]],
        incoming: list[tuple[int, Tensor]],
        group: dist.ProcessGroup,
        kind: str = "halo",
    ) -> Posted:
        """Post every send ``(peer, tensor)`` and receive ``(peer, buffer)`` at once (peers are
        ranks of ``group``; tensors contiguous) and return without waiting. The bytes count
        under ``kind`` (``"halo"``, ``"ring"``)."""
        ops = [dist.P2POp(dist.isend, t, dist.get_global_rank(group, p), group) for p, t in outgoing]
        ops += [dist.P2POp(dist.irecv, t, dist.get_global_rank(group, p), group) for p, t in incoming]
        if not ops:
            return Posted([], [], [])
        works = dist.batch_isend_irecv(ops)
        self._record(kind, sum(t.numel() * t.element_size() for _, t in outgoing))
        return Posted(works, [t for _, t in outgoing], [t for _, t in incoming])

    def all_to_all(self, x: Tensor, send_splits: list[int], recv_splits: list[int], group: dist.ProcessGroup) -> Tensor:
        """Flat ``x``'s chunk ``r`` to rank ``r``; the chunks received, in rank order."""
        out = x.new_empty(sum(recv_splits))
        dist.all_to_all_single(
            out, x.contiguous(), output_split_sizes=recv_splits, input_split_sizes=send_splits, group=group
        )
        rank = dist.get_rank(group)
        self._record("all_to_all", (sum(send_splits) - send_splits[rank]) * x.element_size())
        return out

    def all_gather(self, x: Tensor, splits: list[int], group: dist.ProcessGroup) -> Tensor:
        """Every rank's flat ``x`` (``splits[rank]`` elements), concatenated in rank order:
        ``(sum(splits),)``. Blocks shorter than the longest are zero-padded to it (gloo gathers
        equal chunks only); the bytes counted are those sent, padding included."""
        world, rank = len(splits), dist.get_rank(group)
        longest = max(splits, default=0)
        if longest == 0:
            return x.new_empty(0)
        mine = x.contiguous()
        if splits[rank] < longest:
            mine = torch.cat([mine, mine.new_zeros(longest - splits[rank])])
        out = x.new_empty(world * longest)
        dist.all_gather_single(out, mine, group=group)
        self._record("all_gather", (world - 1) * longest * x.element_size())
        if all(s == longest for s in splits):
            return out
        return torch.cat([out[r * longest : r * longest + s] for r, s in enumerate(splits)])

    def reduce_scatter(self, x: Tensor, splits: list[int], group: dist.ProcessGroup) -> Tensor:
        """Flat ``x`` (``sum(splits)`` elements) summed over the ranks, chunk ``r`` of the sum to
        rank ``r``: ``(splits[rank],)``. Chunks are zero-padded to the longest as in
        :meth:`all_gather`; the bytes counted are those sent, padding included."""
        world, rank = len(splits), dist.get_rank(group)
        longest = max(splits, default=0)
        if longest == 0:
            return x.new_empty(0)
        if all(s == longest for s in splits):
            padded = x.contiguous()
        else:
            padded = x.new_zeros(world, longest)
            for r, chunk in enumerate(x.split(splits)):
                padded[r, : splits[r]] = chunk
            padded = padded.view(-1)
        out = x.new_empty(longest)
        dist.reduce_scatter_single(out, padded, op=dist.ReduceOp.SUM, group=group)
        self._record("reduce_scatter", (world - 1) * longest * x.element_size())
        return out[: splits[rank]]
