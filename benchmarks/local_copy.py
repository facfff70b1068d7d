"""A transport that sends nothing: the benchmark's yardstick for what communication costs.

Each primitive still copies the bytes it would send (so the memory traffic of packing stays)
and zero-fills what it would receive. Results are wrong; the step time against a real
transport is what the communication costs after overlap.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch import Tensor

from processor.distributed import Posted, Transport


@dataclass(frozen=True)
class LocalCopyTransport(Transport):
    """Halo exchanges, ring passes, all-to-alls, all-gathers and reduce-scatters as local
    copies; counts nothing."""

    def post(
        self,
        outgoing: list[tuple[int, Tensor]],
        incoming: list[tuple[int, Tensor]],
        group: dist.ProcessGroup,
        kind: str = "halo",
    ) -> Posted:
        sent = [t.clone() for _, t in outgoing]
        return Posted([], sent, [t.zero_() for _, t in incoming])

    def all_to_all(self, x: Tensor, send_splits: list[int], recv_splits: list[int], group: dist.ProcessGroup) -> Tensor:
        packed = x.contiguous().clone()  # the copy a real send makes of what it sends
        del packed
        return x.new_zeros(sum(recv_splits))

    def all_gather(self, x: Tensor, splits: list[int], group: dist.ProcessGroup) -> Tensor:
        sent = x.contiguous().clone()  # the copy a real send makes of what it sends
        del sent
        return x.new_zeros(sum(splits))

    def reduce_scatter(self, x: Tensor, splits: list[int], group: dist.ProcessGroup) -> Tensor:
        sent = x.contiguous().clone()
        del sent
        return x.new_zeros(splits[dist.get_rank(group)])
