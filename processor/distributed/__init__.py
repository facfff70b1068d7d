"""Communication for the model-parallel processor: shards, collectives, halos, gradients.

Every primitive here is an autograd function with its own backward, sends through an
explicit :class:`Transport`, and keeps no state between calls.
"""

from processor.distributed.collectives import all_to_all
from processor.distributed.consistency import agree_on_layout, agree_on_values
from processor.distributed.gradients import parallelize_gradients, sum_model_parallel_gradients
from processor.distributed.halo import HaloConfig, HaloExchange, HaloPlan, halo_extent, halo_pad, start_halo_exchange
from processor.distributed.shards import ShardLayout, shard_offsets, shard_sizes
from processor.distributed.transport import CommCounter, Posted, Transport

__all__ = [
    "CommCounter",
    "HaloConfig",
    "HaloExchange",
    "HaloPlan",
    "Posted",
    "ShardLayout",
    "Transport",
    "agree_on_layout",
    "agree_on_values",
    "all_to_all",
    "halo_extent",
    "halo_pad",
    "parallelize_gradients",
    "shard_offsets",
    "shard_sizes",
    "start_halo_exchange",
    "sum_model_parallel_gradients",
]
