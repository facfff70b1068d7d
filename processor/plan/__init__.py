"""The planner: what a processor step costs under each strategy on a machine, and
``strategy=auto``'s pick. Every number comes from the strategies themselves
(:class:`~processor.strategies.cost.StrategyCost`), so a strategy of your own is costed and
chosen like the built-ins (pass its class to :func:`choose`)."""

from processor.plan.flops import processor_flops, saved_activation_bytes, window_pairs
from processor.plan.load import load_machine
from processor.plan.machine import PRESETS, Machine
from processor.plan.planner import Prediction, candidates, choose, predict, processor_bytes, segment_id_bytes
from processor.strategies.cost import CommPart, Workload

__all__ = [
    "PRESETS",
    "CommPart",
    "Machine",
    "Prediction",
    "Workload",
    "candidates",
    "choose",
    "load_machine",
    "predict",
    "processor_bytes",
    "processor_flops",
    "saved_activation_bytes",
    "segment_id_bytes",
    "window_pairs",
]
