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


def segment_ids_problem(
    ids: object, batch: int, points: int, device: torch.device, axis: str = "local_points", like: str = "the input"
) -> str | None:
    """What is wrong with ``ids`` as ``(batch, points)``, ``(1, points)`` or ``(points,)``
    integers on ``device`` (None: nothing). ``axis`` names the points axis in the message,
    ``like`` the tensor they go with. The one check of segment ids, for the processor's input
    and for the attention kernel's keys."""
    if ids is None:
        return None
    if not isinstance(ids, Tensor):
        return f"segment_ids must be a tensor, got {type(ids).__name__}"
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        return f"segment_ids must be an integer tensor, got {ids.dtype}; e.g. ids.long()"
    if ids.dim() not in (1, 2) or ids.shape[-1] != points or (ids.dim() == 2 and ids.shape[0] not in (1, batch)):
        return (
            f"segment_ids must be (batch, {axis}) = ({batch}, {points}), (1, {axis}) or ({axis},) = ({points},) "
            f"like {like}, got {tuple(ids.shape)}"
        )
    if ids.device != device:
        return f"segment_ids are on {ids.device}, {like} on {device}"
    return None


def segment_id_rows(ids: Tensor) -> Tensor:
    """Checked ids as ``(batch or 1, points)`` int64, contiguous."""
    return (ids if ids.dim() == 2 else ids.unsqueeze(0)).long().contiguous()


def _input_problem(ids: Tensor | None, x: Tensor) -> str | None:
    """:func:`segment_ids_problem` for the processor's input ``x`` ``(batch, local_points, channels)``."""
    batch, points = (x.shape[0], x.shape[1]) if x.dim() == 3 else (-1, -1)
    return segment_ids_problem(ids, batch, points, x.device)


def segment_ids_kind(ids: Tensor | None, x: Tensor) -> str:
    """A short text that every rank of a group must share: whether ids are given and valid."""
    problem = _input_problem(ids, x)
    if problem is not None:
        return f"invalid ({problem})"
    if ids is None:
        return "none"
    return "given per sample" if ids.dim() == 2 and ids.shape[0] > 1 else "given, shared by the batch"


def normalise_segment_ids(ids: Tensor | None, x: Tensor) -> Tensor | None:
    """``ids`` as ``(batch or 1, local_points)`` int64; ``ValueError`` naming ``segment_ids`` if
    they do not fit ``x``."""
    problem = _input_problem(ids, x)
    if problem is not None:
        raise ValueError(problem)
    return None if ids is None else segment_id_rows(ids)
