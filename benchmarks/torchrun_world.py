"""Benchmark points on the ranks ``torchrun`` started, on one node or several.

``torchrun --nnodes 2 --nproc-per-node 2 ... -m benchmarks --multirun ...`` runs the sweep on
every rank in step: each point measures on a group of ``ranks`` of the world, chosen as
training chooses a model group (``placement``: inside a node when it fits, or across nodes;
:mod:`processor.runtime.placement`), while the other ranks wait; the group's reports reach
every rank, and rank 0 writes the rows. Points whose ``ranks`` do not divide the world are
skipped (:func:`benchmarks.config.world_skip_reason`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from processor.runtime.failures import RankFailure, RanksFailedError
from processor.runtime.placement import gather_nodes, model_groups
from processor.runtime.torchrun import init_torchrun_group

if TYPE_CHECKING:
    from benchmarks.config import BenchmarkConfig


def _join(cfg: BenchmarkConfig) -> list[str]:
    """Join this attempt's group (once per process); the node of every world rank."""
    if not dist.is_initialized():
        init_torchrun_group("nccl" if cfg.device == "cuda" else "gloo", cfg.timeout_s)
    return gather_nodes()


def run_on_torchrun_world(cfg: BenchmarkConfig) -> list[dict[str, Any]]:
    """Every torchrun rank: measure the point on its group of ``cfg.ranks`` ranks; return the
    group's reports in group order (on every rank). A failure on members is raised on every
    rank, as a :class:`~processor.runtime.failures.RanksFailedError` holding their records, so
    that all go on to the next point together."""
    from benchmarks.worker import measure  # the model's modules: only when a point runs

    members = model_groups(_join(cfg), cfg.ranks, cfg.placement)[0]
    group = dist.new_group(members)  # collective over the world: every rank creates it
    report: Any = None
    if dist.get_rank() in members:
        torch.set_num_threads(cfg.threads_per_rank)
        if cfg.device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        try:
            report = ("ok", measure(group if len(members) > 1 else None, cfg))
        except Exception as exc:
            report = ("error", RankFailure.from_exception(dist.get_rank(), exc))
    reports: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(reports, report)
    dist.destroy_process_group(group)
    failed = [reports[r][1] for r in members if reports[r][0] == "error"]
    if failed:
        raise RanksFailedError(members, failed)
    return [reports[r][1] for r in members]
