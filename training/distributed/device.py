"""Where a rank computes: ``trainer.device`` resolved, checked against the GPUs there are, and
the pieces every run needs from it (the process group's backend, autocast, batches copied to
the device, the device's peak memory per step).

- ``auto``: CUDA when torch sees a GPU, else the CPU; ``cpu`` and ``cuda`` force one (``cuda``
  without a GPU is a one-line error).
- On CUDA each local rank owns one GPU (``cuda:<LOCAL_RANK>``, set as the current device before
  the process group starts) and the ranks talk over NCCL; more local ranks than GPUs is an error
  naming both numbers.
- ``debug.share_gpu=true`` (tests and debugging only, never chosen by itself): the local
  ranks share the GPUs round-robin, talk over gloo, and the strategies' messages are staged
  through host memory (:class:`processor.distributed.HostStagedTransport`). It lets one GPU run
  every strategy's CUDA path sharded; it is slow, and NCCL is what real multi-GPU runs use.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from processor.host import usable_cores
from processor.runtime.torchrun import under_torchrun
from training.config.schema import ConfigValueError

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(setting: str) -> str:
    """``trainer.device`` as ``"cpu"`` or ``"cuda"`` on this machine."""
    if setting not in DEVICES:
        raise ConfigValueError(f"config key trainer.device = {setting!r} is out of range: expected auto|cpu|cuda")
    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if setting == "cuda" and not torch.cuda.is_available():
        raise ConfigValueError(
            "trainer.device = cuda, but torch sees no CUDA device here (torch.cuda.is_available() is False; "
            f"torch {torch.__version__}): use trainer.device=cpu or auto, or run on a machine with a GPU"
        )
    return setting


def threads_per_rank(asked: int, local_ranks: int) -> int:
    """``asked`` (``trainer.threads_per_rank``), or for 0 the cores this process may run on
    shared evenly among the node's ``local_ranks`` (at least one each)."""
    if asked > 0:
        return asked
    return max(1, usable_cores() // local_ranks)


def check_local_ranks(device: str, local_ranks: int, share_gpu: bool) -> None:
    """On CUDA, one GPU per local rank unless ``share_gpu`` (``debug.share_gpu``)."""
    if share_gpu and device != "cuda":
        raise ConfigValueError(
            f"debug.share_gpu = true shares a GPU between ranks, but trainer.device resolves to {device}: "
            "set trainer.device=cuda on a machine with a GPU, or drop debug.share_gpu"
        )
    if device != "cuda" or share_gpu:
        return
    gpus = torch.cuda.device_count()
    if local_ranks > gpus:
        raise ConfigValueError(
            f"trainer.device = cuda with {local_ranks} local ranks but {gpus} CUDA device(s) on this node: "
            f"one GPU per rank, so at most {gpus} ranks per node (trainer.nprocs or torchrun's --nproc-per-node); "
            "for tests only, debug.share_gpu=true lets ranks share a GPU"
        )


def backend_for(device: str, share_gpu: bool) -> str:
    """The process group's backend: NCCL between GPUs, gloo on the CPU and when ranks share a GPU."""
    return "nccl" if device == "cuda" and not share_gpu else "gloo"


def launch_world(nprocs: int) -> int:
    """The ranks this launch has: torchrun's world, else ``trainer.nprocs`` spawned locally."""
    return int(os.environ["WORLD_SIZE"]) if under_torchrun() else nprocs


def local_rank() -> int:
    """This process's rank on its node (torchrun's or :func:`processor.runtime.run_local`'s)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def rank_device(device: str) -> torch.device:
    """This rank's device, made the current CUDA device (NCCL and its object collectives use it)."""
    if device == "cpu":
        return torch.device("cpu")
    cuda = torch.device("cuda", local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(cuda)
    return cuda


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """``array`` as a tensor on ``device``: on CUDA through pinned host memory, copied without
    blocking the host (the copy is ordered before the kernels that read it)."""
    tensor = torch.from_numpy(array)
    if device.type != "cuda":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def autocast(device: torch.device, precision: str) -> torch.autocast:
    """The autocast of ``trainer.precision`` on ``device``: bf16 (``"bf16"``) or off (``"fp32"``)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a step's wall time includes it)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PeakDeviceMemory:
    """The CUDA allocator's high-water mark since :meth:`reset` (0 on the CPU, where the
    resident set size is what is reported instead)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak_gib(self) -> float:
        if self.device.type != "cuda":
            return 0.0
        return torch.cuda.max_memory_allocated(self.device) / 2**30


def device_free(value: object) -> object:
    """``value`` (a tensor, or dicts, lists and tuples of them) with every tensor on the CPU: what
    a checkpoint holds, so it loads on any device."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: device_free(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(device_free(v) for v in value)
    return value
