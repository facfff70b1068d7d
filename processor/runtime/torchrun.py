"""Joining the process group of a ``torchrun`` attempt, on one node or several.

torchrun's agents meet at a rendezvous, start this attempt's ranks, and restart them all
(``--max-restarts``) when one fails or a node is lost and replaced. Where the ranks' c10d
store lives decides what a restart needs:

- **shared** (torchrun's default, ``TORCHELASTIC_USE_AGENT_STORE=True``): the agent of node 0
  hosts one store for every attempt. A restarted rank could read the previous attempt's
  addresses and fail to connect (pytorch issue #135712), so every attempt keys its entries
  under its restart count (:func:`attempt_prefix`). On several nodes the agents count restarts
  differently (an agent restarted for a membership change does not count it), and a
  replacement node waits for an address the surviving agent never writes again (seen here with
  torch 2.13: ``wait timeout ... MASTER_ADDR``), so restarts there cannot work: refused up front
  (:func:`check_restartable`).
- **fresh** (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` for torchrun): rank 0 hosts a new store
  each attempt, at an address the rendezvous publishes; nothing is left from earlier attempts.
"""

from __future__ import annotations

import datetime
import os

from processor.errors import UserError

FRESH_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


class TorchrunSetupError(UserError):
    """A torchrun launch that cannot work as configured (the message says how to launch it)."""


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def torchrun_rank() -> int:
    """This process's torchrun rank; 0 outside torchrun."""
    return int(os.environ["RANK"]) if under_torchrun() else 0


def shares_agent_store() -> bool:
    """Whether this attempt's store is the one the agent keeps across attempts."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def attempt_prefix() -> str:
    """A key prefix unique to this attempt within the store: the restart count when the store
    is shared across attempts, else nothing (the store is new)."""
    return f"attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/" if shares_agent_store() else ""


def check_restartable() -> None:
    """Refuse a launch on several nodes with ``--max-restarts`` whose agents share one store
    across attempts: its restarts would hang or fail (see the module's docstring)."""
    nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1"))
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    if nodes > 1 and restarts > 0 and shares_agent_store():
        raise TorchrunSetupError(
            f"torchrun on {nodes} nodes with --max-restarts {restarts} keeps one c10d store for every attempt, "
            "and a lost node's replacement cannot join it; launch torchrun with "
            f"{FRESH_STORE_ENV}=1 in its environment (rank 0 then hosts a new store each attempt)"
        )


def init_torchrun_group(backend: str, timeout_s: float) -> None:
    """Join the default group of this torchrun attempt (the store's entries under
    :func:`attempt_prefix`); every collective is bounded by ``timeout_s``."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    if not shares_agent_store():
        dist.init_process_group(backend, timeout=timeout)
        return
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False, timeout=timeout
    )
    store = dist.PrefixStore(f"gridshard/{attempt_prefix()}", agent_store)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
