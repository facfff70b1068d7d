"""Per-point segment ids: validation and the one layout the layers use.

A caller passes ``(batch, local_points)`` or ``(local_points,)`` integer ids, sharded like the
input. :func:`segment_ids_problem` says what is wrong with them in one line (or None) without
raising, so that every rank can first agree on it (a rank that raised alone would leave the
others waiting); :func:`normalise_segment_ids` returns them as ``(batch or 1, local_points)``
int64, or raises that line.
"""

from __future__ import annotations

import torch
from torch import Tensor


def segment_ids_problem(ids: Tensor | None, x: Tensor) -> str | None:
    """What is wrong with ``ids`` for the input ``x`` ``(batch, local_points, channels)``."""
    if ids is None:
        return None
    if not isinstance(ids, Tensor):
        return f"segment_ids must be a tensor, got {type(ids).__name__}"
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        return f"segment_ids must be an integer tensor, got {ids.dtype}; e.g. ids.long()"
    points = x.shape[1] if x.dim() == 3 else -1
    batch = x.shape[0] if x.dim() == 3 else -1
    if ids.dim() not in (1, 2) or ids.shape[-1] != points or (ids.dim() == 2 and ids.shape[0] not in (1, batch)):
        return (
            f"segment_ids must be (batch, local_points) = ({batch}, {points}) or (local_points,) = ({points},) "
            f"like the input, got {tuple(ids.shape)}"
        )
    if ids.device != x.device:
        return f"segment_ids are on {ids.device}, the input on {x.device}"
    return None


def segment_ids_kind(ids: Tensor | None, x: Tensor) -> str:
    """A short text that every rank of a group must share: whether ids are given and valid."""
    problem = segment_ids_problem(ids, x)
    if problem is not None:
        return f"invalid ({problem})"
    if ids is None:
        return "none"
    return "given per sample" if ids.dim() == 2 and ids.shape[0] > 1 else "given, shared by the batch"


def normalise_segment_ids(ids: Tensor | None, x: Tensor) -> Tensor | None:
    """``ids`` as ``(batch or 1, local_points)`` int64; ``ValueError`` naming ``segment_ids`` if
    they do not fit ``x``."""
    problem = segment_ids_problem(ids, x)
    if problem is not None:
        raise ValueError(problem)
    if ids is None:
        return None
    return (ids if ids.dim() == 2 else ids.unsqueeze(0)).long().contiguous()
