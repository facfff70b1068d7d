"""Two torchrun agents on one machine as two nodes of 2 ranks: they meet at a c10d rendezvous on
loopback; ``--local-addr`` 127.0.0.1 and 127.0.0.2 make the first node 0 (the rendezvous sorts
nodes by address), and node 0 hosts the rendezvous (``is_host``)."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import pytest

from processor.runtime import free_port
from tests.processes import kill_tree, start_in_own_session

AGENT_TIMEOUT_S = 240


def agent_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def standalone(nproc: int, *torchrun_args: str) -> list[str]:
    """torchrun for ``nproc`` ranks on this machine alone (its own rendezvous)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *torchrun_args]


def agent(node: int, port: int, run_id: str, *torchrun_args: str) -> list[str]:
    """torchrun for node ``node`` of 2; node 0 hosts the rendezvous and sorts first (its address)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={run_id}",
        f"--rdzv-conf=is_host={'true' if node == 0 else 'false'}",
        f"--local-addr=127.0.0.{node + 1}",
        *torchrun_args,
    ]


def _wait_listening(port: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"no rendezvous on port {port} after {timeout_s} s")


def wait_agents(procs: list, logs: list[Path], timeout_s: float = AGENT_TIMEOUT_S) -> list[int]:
    """The agents' exit codes; all killed (and the test failed) if one runs past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    try:
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except Exception:
        pytest.fail("agents ran past the time limit:\n" + "\n".join(log.read_text()[-3000:] for log in logs))
    finally:
        for proc in procs:
            kill_tree(proc)
    return [proc.returncode for proc in procs]


def two_nodes(tmp_path: Path, name: str, args: list[str], env: dict[str, str], *torchrun_args: str):
    """Start node 0, then node 1 once the rendezvous listens; the processes and their logs."""
    port = free_port()
    logs = [tmp_path / f"{name}-node{n}.log" for n in (0, 1)]
    node0 = start_in_own_session([*agent(0, port, name, *torchrun_args), *args], tmp_path, env, logs[0])
    _wait_listening(port)
    node1 = start_in_own_session([*agent(1, port, name, *torchrun_args), *args], tmp_path, env, logs[1])
    return [node0, node1], logs, port
