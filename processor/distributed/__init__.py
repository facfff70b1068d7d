"""Communication for the model-parallel processor: shards, collectives, halos, gradients, and
the sharded region (:func:`shard_points` / :func:`gather_points` / :func:`reduce_scatter_points`)
for models of your own.

Every primitive here is an autograd function with its own backward, sends through an
explicit :class:`Transport`, and keeps no state between calls.
"""

from processor.distributed.collectives import all_to_all
from processor.distributed.consistency import agree_on_layout, agree_on_values
from processor.distributed.gradients import clip_grad_norm_, parallelize_gradients, sum_model_parallel_gradients
from processor.distributed.halo import HaloConfig, HaloExchange, HaloPlan, halo_extent, halo_pad, start_halo_exchange
from processor.distributed.host_staged import HostStagedTransport
from processor.distributed.mesh import GroupLike, ModelDims, ModelMesh, process_group_of
from processor.distributed.parameter_split import (
    ChannelSplit,
    full_gradients,
    full_optimizer_state,
    full_state_dict,
    load_full_optimizer_state,
    load_full_state_dict,
)
from processor.distributed.region import Downstream, gather_points, reduce_scatter_points, shard_points
from processor.distributed.shards import ShardLayout, shard_offsets, shard_sizes
from processor.distributed.transport import CommCounter, Posted, Transport

__all__ = [
    "ChannelSplit",
    "CommCounter",
    "Downstream",
    "HaloConfig",
    "HaloExchange",
    "HaloPlan",
    "HostStagedTransport",
    "GroupLike",
    "ModelDims",
    "ModelMesh",
    "Posted",
    "ShardLayout",
    "Transport",
    "agree_on_layout",
    "agree_on_values",
    "all_to_all",
    "clip_grad_norm_",
    "full_optimizer_state",
    "full_gradients",
    "full_state_dict",
    "gather_points",
    "halo_extent",
    "halo_pad",
    "load_full_optimizer_state",
    "load_full_state_dict",
    "parallelize_gradients",
    "process_group_of",
    "reduce_scatter_points",
    "shard_offsets",
    "shard_points",
    "shard_sizes",
    "start_halo_exchange",
    "sum_model_parallel_gradients",
]
