"""Communication for the model-parallel processor: shards, collectives, halos, gradients."""

from processor.distributed.collectives import all_to_all
from processor.distributed.comm_stats import CommCounter, count_communication
from processor.distributed.consistency import agree_on_layout
from processor.distributed.gradients import all_reduce_gradients, sum_model_parallel_gradients
from processor.distributed.halo import HaloConfig, HaloExchange, HaloPlan, halo_extent, halo_pad, start_halo_exchange
from processor.distributed.shards import ShardLayout, shard_offsets, shard_sizes

__all__ = [
    "CommCounter",
    "HaloConfig",
    "HaloExchange",
    "HaloPlan",
    "ShardLayout",
    "agree_on_layout",
    "all_reduce_gradients",
    "all_to_all",
    "count_communication",
    "halo_extent",
    "halo_pad",
    "shard_offsets",
    "shard_sizes",
    "start_halo_exchange",
    "sum_model_parallel_gradients",
]
