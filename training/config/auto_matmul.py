"""``trainer.matmul=auto``: the launching process picks the float32 GEMM of the model's linear
layers (:mod:`processor.matmul`) by measuring both on this host at a rank's thread count
(:func:`processor.matmul.probe.fastest_backend`, cached on disk per host, torch and threads),
before any rank starts, and hands every rank the concrete backend: a resumed run keeps it (it is
saved in the run's settings), and the model group never mixes them. Off a CPU it is ``aten``.
The environment variable ``GRIDSHARD_MATMUL_PROBE=0``, which test suites set, also keeps
``aten``: their runs must not depend on what a loaded machine happened to time fastest.
"""

from __future__ import annotations

import os

import torch

from processor.matmul.probe import BackendChoice, fastest_backend
from training.config.schema import RunConfig


def resolve_run_matmul(cfg: RunConfig) -> BackendChoice | None:
    """Replace ``trainer.matmul`` ``auto`` by a backend (printed with its figures) and return the
    choice; None where nothing was measured (a set backend, a GPU, or probing switched off)."""
    trainer = cfg.trainer
    if trainer.matmul != "auto":
        return None
    if trainer.device != "cpu" or os.environ.get("GRIDSHARD_MATMUL_PROBE", "1") == "0":
        trainer.matmul = "aten"
        return None
    previous = torch.get_num_threads()
    torch.set_num_threads(trainer.threads_per_rank)  # as fast as a rank runs it
    try:
        choice = fastest_backend()
    finally:
        torch.set_num_threads(previous)
    print(choice.describe())
    trainer.matmul = choice.backend
    return choice
