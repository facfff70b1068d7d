"""Benchmark points on the ranks ``torchrun`` started, on one node or several.

``torchrun --nnodes 2 --nproc-per-node 2 ... -m benchmarks --multirun ...`` runs the sweep on
every rank in step: each point measures on a group of ``ranks`` of the world, chosen as
training chooses a model group (``placement``: inside a node when it fits, or across nodes;
:mod:`processor.runtime.placement`), while the other ranks wait; the group's reports reach
every rank, and rank 0 writes the rows. Points whose ``ranks`` do not divide the world are
skipped (:func:`world_skip_reason`).
"""

from __future__ import annotations

import os
import traceback
from typing import Any

import torch
import torch.distributed as dist

from processor.runtime.placement import gather_nodes, model_groups
from processor.runtime.torchrun import init_torchrun_group, under_torchrun


def world_skip_reason(ranks: int) -> str | None:
    """Why a point of ``ranks`` cannot run on this torchrun world (None outside torchrun)."""
    if not under_torchrun():
        return None
    world = int(os.environ["WORLD_SIZE"])
    if world % ranks:
        return f"ranks = {ranks} does not divide the {world} ranks torchrun started"
    return None


def _join(cfg: dict[str, Any]) -> list[str]:
    """Join this attempt's group (once per process); the node of every world rank."""
    if not dist.is_initialized():
        init_torchrun_group("nccl" if cfg["device"] == "cuda" else "gloo", cfg["timeout_s"])
    return gather_nodes()


def run_on_torchrun_world(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """Every torchrun rank: measure the point on its group of ``cfg["ranks"]`` ranks; return the
    group's reports in group order (on every rank). A failure on a member is raised on every
    rank, as a ``RuntimeError`` naming the rank, so that all go on to the next point together."""
    from benchmarks.worker import measure  # (it imports benchmarks.config, which imports this module)

    members = model_groups(_join(cfg), cfg["ranks"], cfg["placement"])[0]
    group = dist.new_group(members)  # collective over the world: every rank creates it
    report: Any = None
    if dist.get_rank() in members:
        torch.set_num_threads(cfg["threads_per_rank"])
        if cfg["device"] == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        try:
            report = ("ok", measure(group if len(members) > 1 else None, cfg))
        except Exception:
            report = ("error", traceback.format_exc())
    reports: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(reports, report)
    dist.destroy_process_group(group)
    failed = [(r, reports[r][1]) for r in members if reports[r][0] == "error"]
    if failed:
        rank, text = failed[0]
        raise RuntimeError(f"rank {rank} failed: {text.strip().splitlines()[-1]}\n{text}")
    return [reports[r][1] for r in members]
