"""Agree on the shard layout (or any set of values) across ranks, or fail on every rank together.

A rank that raised on its own would leave the others waiting in the next collective until
the timeout. So each rank first reports what it sees (its problem, if any; batch, local
points, channels; a fingerprint of the configuration) in one small ``all_gather``, and every
rank then runs the same checks on the same table and raises the same ``ValueError``.
"""

from __future__ import annotations

import os
import zlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from enum import IntEnum
from types import MappingProxyType

import torch
import torch.distributed as dist
from torch import Tensor

from processor.distributed.ranges import profiler_range
from processor.distributed.shards import ShardLayout
from processor.distributed.transport import collective_device


class LocalProblem(IntEnum):
    """What a rank found wrong with its own input, sent to all ranks as a code."""

    NONE = 0
    NOT_3D = 1
    WRONG_CHANNELS = 2
    SIZES_WRONG_LENGTH = 3
    SIZE_DISAGREES = 4


_DESCRIPTIONS = MappingProxyType(
    {
        LocalProblem.NOT_3D: "input is not (batch, local_points, channels)",
        LocalProblem.WRONG_CHANNELS: "input has the wrong number of channels",
        LocalProblem.SIZES_WRONG_LENGTH: "shard_sizes does not have one entry per rank",
        LocalProblem.SIZE_DISAGREES: "local_points differs from shard_sizes[rank]",
    }
)


def fingerprint(values: Sequence[object]) -> int:
    """A stable 32-bit hash of a configuration, equal on every rank for equal values."""
    return zlib.crc32(repr(tuple(values)).encode())


def _as_text(values: Mapping[str, object]) -> dict[str, str]:
    """Keys and values as text, sorted by key: what rank-agreement compares."""
    return {str(k): v if isinstance(v, str) else repr(v) for k, v in sorted(values.items())}


def settings_fingerprint(values: Mapping[str, object]) -> int:
    """The fingerprint of a mapping of settings, as :func:`agree_on_values` compares them."""
    return fingerprint(list(_as_text(values).items()))


def _local_problem(x: Tensor, channels: int, world: int, rank: int, sizes: Sequence[int] | None) -> LocalProblem:
    if x.dim() != 3:
        return LocalProblem.NOT_3D
    if x.shape[2] != channels:
        return LocalProblem.WRONG_CHANNELS
    if sizes is not None and len(sizes) != world:
        return LocalProblem.SIZES_WRONG_LENGTH
    if sizes is not None and sizes[rank] != x.shape[1]:
        return LocalProblem.SIZE_DISAGREES
    return LocalProblem.NONE


def agree_on_layout(
    x: Tensor,
    group: dist.ProcessGroup,
    channels: int,
    config: Mapping[str, object],
    shard_sizes: Sequence[int] | None = None,
) -> ShardLayout:
    """Gather every rank's view of the input and return the common layout of points.

    Args:
        x: this rank's ``(batch, local_points, channels)`` block.
        channels: the channel count the model expects.
        config: settings that must be equal on every rank (all of the processor's); when they
            differ the error names the settings and the ranks.
        shard_sizes: optional expected points per rank; checked against the actual blocks.
    Raises:
        ValueError: on every rank, when any rank's input or configuration disagrees.
    """
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    problem = _local_problem(x, channels, world, rank, shard_sizes)
    shape = list(x.shape) if x.dim() == 3 else [-1, -1, -1]
    sizes_print = -1 if shard_sizes is None else fingerprint(shard_sizes)
    device = collective_device(group)
    mine = torch.tensor(
        [int(problem), *shape, settings_fingerprint(config), sizes_print], dtype=torch.int64, device=device
    )
    table = torch.empty(world * mine.numel(), dtype=torch.int64, device=device)
    with profiler_range("agree_on_layout"):
        dist.all_gather_single(table, mine, group=group)
        rows = table.view(world, -1).tolist()  # the host sync

    for r, row in enumerate(rows):
        if row[0] != LocalProblem.NONE:
            detail = _DESCRIPTIONS[LocalProblem(row[0])]
            raise ValueError(
                f"rank {r} of the model-parallel group: {detail} (shape {tuple(row[1:4])}, channels {channels})"
            )
    batches = [row[1] for row in rows]
    if len(set(batches)) > 1:
        raise ValueError(f"batch size differs across ranks: {batches}")
    if batches[0] == 0:  # shard_heads' all-to-all cannot split an empty batch
        raise ValueError("the batch is empty (batch size 0 on every rank)")
    if len({row[4] for row in rows}) > 1:  # every rank takes this branch: it raises, naming the settings
        agree_on_values(config, group, what="processor settings")
        raise ValueError("processor settings differ across ranks")  # not reached: the line above names them
    given = {row[5] for row in rows}
    if len(given) > 1:
        raise ValueError("shard_sizes passed to forward differ across ranks")
    sizes = tuple(row[2] for row in rows)
    if any(s == 0 for s in sizes):
        raise ValueError(f"every rank needs at least one point; points per rank are {list(sizes)}")
    return ShardLayout(sizes, rank)


AGREE_EVERY_FORWARD_ENV = "GRIDSHARD_AGREE_EVERY_FORWARD"


class LayoutAgreement:
    """:func:`agree_on_layout` once per input key, not on every call: the agreed layouts of the
    last ``keep`` keys are remembered (one model's cache; a copy starts empty).

    The key is everything of this rank's that the agreement compares: the group (by identity),
    the input's shape (batch, local points, channels), the fingerprint of ``config`` (the
    processor's settings, which include the segment ids' kind and the parameters' split) and the
    ``shard_sizes`` passed. A key seen before was agreed with the other ranks, so the call
    returns its layout without communicating; a new key is agreed (one ``all_gather`` and a
    host sync), and a disagreement raises the same ``ValueError`` on every rank as before.

    Assumption (SPMD): the ranks of a group make the same sequence of calls, and when the layout
    changes every rank's key changes in the same call. A rank whose key is unchanged while a
    peer's changed would skip the agreement its peer enters (a hang until the collective
    timeout, or a mismatched collective). That holds when every rank's block changes with the
    number of points, or when ``shard_sizes`` (global, part of every rank's key) is passed:
    pass it when the number of points can change such that some rank's block keeps its length
    (a balanced split of 20 then 21 points over 2 ranks: 10, 10 then 11, 10).

    Args:
        keep: how many keys to remember (alternating shapes, e.g. training and validation
            batches, each agreed once).
        every_forward: agree on every call (the debug switch); ``None``: when the environment
            variable ``GRIDSHARD_AGREE_EVERY_FORWARD`` is ``1`` (read on every call).
    """

    def __init__(self, keep: int = 8, every_forward: bool | None = None) -> None:
        self.keep, self.every_forward = keep, every_forward
        self._agreed: OrderedDict[tuple, ShardLayout] = OrderedDict()

    def __deepcopy__(self, memo: dict) -> LayoutAgreement:  # a copy agrees anew (no groups copied)
        return LayoutAgreement(self.keep, self.every_forward)

    def __reduce__(self) -> tuple[type, tuple[int, bool | None]]:
        return LayoutAgreement, (self.keep, self.every_forward)

    def _every_forward(self) -> bool:
        if self.every_forward is not None:
            return self.every_forward
        return os.environ.get(AGREE_EVERY_FORWARD_ENV) == "1"

    def layout(
        self,
        x: Tensor,
        group: dist.ProcessGroup,
        channels: int,
        config: Mapping[str, object],
        shard_sizes: Sequence[int] | None = None,
    ) -> ShardLayout:
        """:func:`agree_on_layout`'s result (same arguments), agreed once per key."""
        sizes = None if shard_sizes is None else tuple(int(s) for s in shard_sizes)
        key = (group, tuple(x.shape), channels, settings_fingerprint(config), sizes)
        if key in self._agreed and not self._every_forward():
            self._agreed.move_to_end(key)
            return self._agreed[key]
        layout = agree_on_layout(x, group, channels, config, shard_sizes)
        self._agreed[key] = layout
        while len(self._agreed) > self.keep:
            self._agreed.popitem(last=False)
        return layout


def agree_on_values(values: Mapping[str, object], group: dist.ProcessGroup | None = None, what: str = "values") -> None:
    """Return if ``values`` are equal on every rank of ``group``; else raise the same ``ValueError``
    on every rank, naming the ranks that differ from rank 0 and the keys that differ.

    One ``all_gather`` of a fingerprint; only when the fingerprints differ are the values
    themselves gathered, to name the keys.
    """
    items = _as_text(values)
    world = dist.get_world_size(group)
    device = collective_device(group)
    mine = torch.tensor([settings_fingerprint(values)], dtype=torch.int64, device=device)
    prints = torch.empty(world, dtype=torch.int64, device=device)
    with profiler_range("agree_on_values"):
        dist.all_gather_single(prints, mine, group=group)
    if len(set(prints.tolist())) == 1:
        return
    every: list[dict[str, str]] = [{} for _ in range(world)]
    dist.all_gather_object(every, items, group=group)
    odd = [r for r in range(world) if every[r] != every[0]]
    keys = sorted({k for d in every for k in d if len({e.get(k) for e in every}) > 1})
    details = []
    for key in keys[:8]:
        by_value: dict[str, list[int]] = {}
        for r, d in enumerate(every):
            by_value.setdefault(d.get(key, "<missing>"), []).append(r)
        details.append(f"{key}: " + ", ".join(f"{v} on ranks {rs}" for v, rs in by_value.items()))
    more = f" (and {len(keys) - 8} more keys)" if len(keys) > 8 else ""
    raise ValueError(f"{what} differ between rank 0 and ranks {odd}: " + "; ".join(details) + more)
