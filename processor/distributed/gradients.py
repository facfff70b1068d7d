"""Parameter gradients of a model-parallel model: summed over its ranks, averaged over replicas.

Replicated parameters (all of them, except under ``shard_channels``): after backward, a
rank's parameter gradients are the contributions of its own points, so the gradient of the
whole model is their **sum** over the model-parallel group; the
collectives' backward passes have already routed every cross-rank term to its rank. With
data parallelism on top, replicas are **averaged** as usual.

Two ways to get there, one operation:

- :func:`parallelize_gradients` wraps the model in ``DistributedDataParallel`` with a
  communication hook that does it during backward (overlapped, bucketed): after
  ``loss.backward()`` the gradients are right, nothing else to call.
- :func:`sum_model_parallel_gradients` does it explicitly after backward.

Plain DDP over the whole world would *average* over ``dp * mp`` ranks: the model-parallel
sum would come out divided by ``mp``. Parameters split over the ranks (``shard_channels``,
:mod:`processor.distributed.parameter_split`) already hold the whole gradient of their share:
they are only averaged over the replicas.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.parallel import DistributedDataParallel

from processor.distributed.parameter_split import mark_split_parameters, split_of
from processor.distributed.ranges import profiler_range


def _size(group: dist.ProcessGroup | None) -> int:
    return 1 if group is None else dist.get_world_size(group)


def sum_model_parallel_gradients(
    parameters: Iterable[nn.Parameter], mp_group: dist.ProcessGroup | None, dp_group: dist.ProcessGroup | None = None
) -> None:
    """In place, after backward: each ``p.grad`` summed over ``mp_group``, then averaged over
    ``dp_group`` (data-parallel replicas; ``None``: one replica), one flat all-reduce each.

    Parameters whose ``grad`` is None count as zero (and get a gradient), so that every rank
    reduces buffers of the same layout. A parameter split over the ranks (``shard_channels``,
    see :mod:`processor.distributed.parameter_split`) already holds the whole gradient of its
    share: it is averaged over ``dp_group`` only.
    """
    params = [p for p in parameters if p.requires_grad]
    if not params or _size(mp_group) * _size(dp_group) == 1:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    replicated = [p for p in params if split_of(p) is None]
    if _size(mp_group) > 1:
        _all_reduce_grads(replicated, mp_group)
    if _size(dp_group) > 1:
        _all_reduce_grads(params, dp_group, divide_by=_size(dp_group))


def _all_reduce_grads(params: list[nn.Parameter], group: dist.ProcessGroup, divide_by: int = 1) -> None:
    """Sum the gradients of ``params`` over ``group`` in one flat all-reduce (then divide)."""
    if not params:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    with profiler_range("all_reduce_gradients"):
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    if divide_by > 1:
        flat /= divide_by
    for p, g in zip(params, flat.split([p.numel() for p in params])):
        p.grad.copy_(g.view_as(p))


@dataclass(frozen=True)
class _Reduction:
    """The communication hook's state: sum over ``mp_group``, then average over ``dp_group``."""

    mp_group: dist.ProcessGroup
    dp_group: dist.ProcessGroup | None


def _sum_over_model_average_over_replicas(state: _Reduction, bucket):  # noqa: ANN001 - DDP checks the annotation
    """DDP's communication hook: ``bucket`` (a ``dist.GradBucket``) of gradients -> a future of
    the reduced bucket. Unannotated: DDP rejects a string annotation."""
    buffer = bucket.buffer()
    replicas = _size(state.dp_group)
    with profiler_range("all_reduce_gradients"):  # posting: DDP waits for the future
        if replicas > 1:
            buffer.div_(replicas)
            dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=state.mp_group)
            work = dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=state.dp_group, async_op=True)
        else:
            work = dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=state.mp_group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def parallelize_gradients(
    model: nn.Module,
    mesh: DeviceMesh | None = None,
    *,
    mp_group: dist.ProcessGroup | None = None,
    dp_group: dist.ProcessGroup | None = None,
) -> nn.Module:
    """``model`` wrapped so that backward leaves one-rank gradients on every rank: summed over
    the model-parallel ranks, averaged over data-parallel replicas.

    Args:
        mesh: a device mesh with axes ``("dp", "mp")`` or ``("mp",)`` (every rank of it calls).
            The sums then run on groups of their own, created here, so that they never
            interleave with the processor's exchanges on ``mesh["mp"]`` (NCCL needs that).
        mp_group, dp_group: or, instead of a mesh, this rank's model-parallel group and its
            data-parallel group (None: one replica). The sums then share ``mp_group`` with the
            exchanges: fine on gloo, whose point-to-point and collective traffic use separate
            slots; on NCCL pass a mesh.
    Returns:
        ``model`` itself when there is nothing to reduce, else a ``DistributedDataParallel``
        around it (its ``module`` is ``model``; save ``full_state_dict(model, mp_group)``).
    Raises:
        ValueError: for a processor whose strategy splits the parameters but which was not
            split yet (call ``split_parameters`` first, then wrap, then build the optimiser).
    """
    if mesh is not None:
        if mp_group is not None or dp_group is not None:
            raise ValueError("parallelize_gradients takes a device mesh or groups, not both")
        mp_group, dp_group = _gradient_groups(mesh)
    _check_split_before_wrapping(model, _size(mp_group))
    if _size(mp_group) == 1:
        # Nothing model-parallel: plain data parallelism (averaging), if any.
        return model if dp_group is None else DistributedDataParallel(model, process_group=dp_group)
    _average_split_parameters_over_replicas(model, dp_group)
    wrapped = DistributedDataParallel(model, process_group=mp_group)
    wrapped.register_comm_hook(_Reduction(mp_group, dp_group), _sum_over_model_average_over_replicas)
    return wrapped


def _check_split_before_wrapping(model: nn.Module, mp: int) -> None:
    for module in model.modules():
        strategy, share = getattr(module, "strategy", None), getattr(module, "parameter_split", None)
        if mp > 1 and getattr(strategy, "splits_parameters", False) and share is not None and share.world_size == 1:
            raise ValueError(
                f"strategy {strategy.name!r} splits the parameters: call split_parameters(group) before "
                "parallelize_gradients (and before building the optimiser)"
            )


def _average_split_parameters_over_replicas(model: nn.Module, dp_group: dist.ProcessGroup | None) -> None:
    """Split parameters (``shard_channels``) differ in shape across the model-parallel ranks and
    need no sum there: DDP leaves them alone, and a hook averages each one's gradient over the
    replicas as soon as backward has accumulated it."""
    mark_split_parameters(model)
    split = [name for name, p in model.named_parameters() if split_of(p) is not None]
    if not split:
        return
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, split)
    if _size(dp_group) == 1:
        return
    replicas = _size(dp_group)

    def average(p: torch.Tensor) -> None:
        with profiler_range("all_reduce_gradients"):
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=dp_group)
        p.grad.div_(replicas)

    for name, p in model.named_parameters():
        if name in split:
            p.register_post_accumulate_grad_hook(average)


def _gradient_groups(mesh: DeviceMesh) -> tuple[dist.ProcessGroup | None, dist.ProcessGroup | None]:
    """This rank's (model-parallel, data-parallel) groups for the gradient sums: the former new,
    one per replica, created by every rank in the same order."""
    names = mesh.mesh_dim_names or ()
    if set(names) - {"dp", "mp"} or "mp" not in names:
        raise ValueError(f'the mesh must have axes ("dp", "mp") or ("mp",), got {names}')
    ranks = mesh.mesh if "dp" in names else mesh.mesh.unsqueeze(0)
    if names[0] == "mp" and len(names) == 2:
        ranks = ranks.t()
    dp_group = mesh["dp"].get_group() if "dp" in names and mesh["dp"].size() > 1 else None
    if ranks.shape[1] == 1:
        return None, dp_group
    me = dist.get_rank()
    mine = None
    for replica in ranks.tolist():
        group = dist.new_group(replica)
        if me in replica:
            mine = group
    return mine, dp_group


def _norm_squared(params: list[nn.Parameter]) -> torch.Tensor:
    """The squared 2-norm of these parameters' gradients (0 for none), in float64 to be summed
    with other ranks': the norms in one fused call (torch's ``foreach``), as torch's clipping takes them."""
    if not params:
        return torch.zeros((), dtype=torch.float64)
    return torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True).double().square()


def clip_grad_norm_(
    parameters: Iterable[nn.Parameter], max_norm: float, *, mp_group: dist.ProcessGroup | None = None
) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` for a model-parallel model, after the reductions: the
    norm of the *whole* model's gradient, the same on every rank. Replicated parameters count
    once; split ones (``shard_channels``) are summed over ``mp_group`` (one all-reduce of a
    number). Returns the total norm before clipping."""
    params = [p for p in parameters if p.grad is not None]
    if not params:
        return torch.zeros(())
    if mp_group is None and any(len(split_of(p).sizes) > 1 for p in params if split_of(p) is not None):
        raise ValueError("clip_grad_norm_: the parameters are split over ranks; pass their mp_group")
    replicated = _norm_squared([p for p in params if split_of(p) is None])
    split = _norm_squared([p for p in params if split_of(p) is not None])
    if any(split_of(p) is not None for p in params) and _size(mp_group) > 1:
        with profiler_range("all_reduce_grad_norm"):
            dist.all_reduce(split, op=dist.ReduceOp.SUM, group=mp_group)
    total = (replicated + split).sqrt()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total.float(), foreach=True)
    return total.float()
