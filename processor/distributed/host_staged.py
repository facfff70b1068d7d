"""A transport that stages every message through host memory, so that several ranks can share
one GPU over gloo: a test and debugging tool, never a training transport.

NCCL cannot put two ranks on one device, and gloo's point-to-point sends (the halo, the ring)
take a raw data pointer that must be host memory. :class:`HostStagedTransport` copies what a
rank sends to host memory (pinned when it comes from CUDA), runs :class:`Transport`'s gloo
operation on the host copies, and copies what it receives back to the caller's device and
dtype. With it, ``P`` gloo ranks on one GPU run every strategy's CUDA path sharded (halo,
ring, head all-to-all, ``shard_channels``' all-gathers and reduce-scatters, the 2-D hybrid)
and can be compared with one rank on the same GPU.

It is never chosen silently: NCCL is the transport of real multi-GPU runs, and training uses
this one only under an explicit ``debug.share_gpu=true``. Its cost is two host copies
per message (device to host before sending, host to device after receiving), each a
synchronising copy on CUDA, on top of gloo's TCP transfer. On CPU tensors it copies too, so the
staging path runs (and is tested) without a GPU. The bytes counted are exactly those of
:class:`Transport`: the same tensors, counted by the same code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from processor.distributed.transport import Posted, Transport


def _host_like(t: Tensor) -> Tensor:
    """An uninitialised host tensor of ``t``'s shape and dtype (pinned when ``t`` is on CUDA)."""
    return torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=t.is_cuda)


def _to_host(t: Tensor) -> Tensor:
    """A contiguous host copy of ``t`` (a real copy, also when ``t`` is on the CPU)."""
    return _host_like(t).copy_(t)


def _to_device(host: Tensor, like: Tensor) -> Tensor:
    """A copy of ``host`` on ``like``'s device, in ``like``'s dtype (same shape as ``host``)."""
    return torch.empty(host.shape, dtype=like.dtype, device=like.device).copy_(host)


@dataclass
class StagedPosted(Posted):
    """Point-to-point work in flight on host buffers. ``incoming`` are the caller's buffers (any
    device), ``staged`` the host buffers gloo receives into, one per caller buffer, same shape
    and dtype; ``outgoing`` holds the caller's tensors and their host copies until :meth:`wait`.
    """

    staged: list[Tensor] = field(default_factory=list)

    def wait(self) -> list[Tensor]:
        """Wait for every transfer, copy each host buffer into the caller's buffer and return the
        caller's buffers (the tensor objects passed to :meth:`HostStagedTransport.post`)."""
        for work in self.works:
            work.wait()
        for buf, host in zip(self.incoming, self.staged):
            buf.copy_(host)
        return self.incoming


@dataclass(frozen=True)
class HostStagedTransport(Transport):
    """:class:`Transport` over gloo with every tensor staged through host memory (see the module
    docstring); counts into ``counter`` exactly what :class:`Transport` counts."""

    def post(
        self,
        outgoing: list[tuple[int, Tensor]],
        incoming: list[tuple[int, Tensor]],
        group: dist.ProcessGroup,
        kind: str = "halo",
    ) -> StagedPosted:
        """As :meth:`Transport.post`: sends ``(peer, tensor)`` and receive buffers ``(peer, buffer)``
        of any shape; host copies travel, and :meth:`StagedPosted.wait` fills the caller's buffers."""
        host_out = [(p, _to_host(t)) for p, t in outgoing]
        host_in = [(p, _host_like(b)) for p, b in incoming]
        posted = super().post(host_out, host_in, group, kind)
        keep = [t for _, t in outgoing] + [t for _, t in host_out]
        return StagedPosted(posted.works, keep, [b for _, b in incoming], [h for _, h in host_in])

    def all_to_all(self, x: Tensor, send_splits: list[int], recv_splits: list[int], group: dist.ProcessGroup) -> Tensor:
        """As :meth:`Transport.all_to_all`: flat ``x`` -> ``(sum(recv_splits),)`` on ``x``'s device."""
        return _to_device(super().all_to_all(_to_host(x), send_splits, recv_splits, group), x)

    def all_gather(self, x: Tensor, splits: list[int], group: dist.ProcessGroup) -> Tensor:
        """As :meth:`Transport.all_gather`: flat ``x`` -> ``(sum(splits),)`` on ``x``'s device."""
        return _to_device(super().all_gather(_to_host(x), splits, group), x)

    def reduce_scatter(self, x: Tensor, splits: list[int], group: dist.ProcessGroup) -> Tensor:
        """As :meth:`Transport.reduce_scatter`: flat ``x`` -> ``(splits[rank],)`` on ``x``'s device."""
        return _to_device(super().reduce_scatter(_to_host(x), splits, group), x)
