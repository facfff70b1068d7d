"""``trainer.matmul``: the float32 GEMM of the model's linear layers (:mod:`processor.matmul`).
``auto``: the launching process measures both backends on this host at a rank's thread count
(:func:`processor.matmul.probe.fastest_backend`, cached on disk per host, torch and threads),
before any rank starts, and hands every rank the concrete backend: a resumed run keeps it (it is
saved in the run's settings), and the model group never mixes them. Where oneDNN would not run
the model's products, ``auto`` is ``aten`` without measuring: on a GPU, and under bf16 autocast.
The environment variable ``GRIDSHARD_MATMUL_PROBE=0``, which test suites set, also keeps
``aten``: their runs must not depend on what a loaded machine happened to time fastest.
"""

from __future__ import annotations

import os

import torch

from processor.host import torch_threads
from processor.matmul import set_matmul_backend
from processor.matmul.probe import BackendChoice, fastest_backend
from training.config.schema import RunConfig
from training.config.settings import ConfigValueError


def resolve_run_matmul(cfg: RunConfig) -> BackendChoice | None:
    """Replace ``trainer.matmul`` ``auto`` by a backend (printed with its figures), make it this
    process's too (the cost model's probe then times the GEMM the ranks will run), and return
    the choice; None where nothing was measured.

    Raises:
        ConfigValueError: ``onednn`` on a torch build without oneDNN.
    """
    trainer = cfg.trainer
    choice = None
    if trainer.matmul == "onednn" and not torch.backends.mkldnn.is_available():
        raise ConfigValueError("config key trainer.matmul = onednn: this torch build has no oneDNN; use aten or auto")
    if trainer.matmul == "auto":
        probing = os.environ.get("GRIDSHARD_MATMUL_PROBE", "1") != "0"
        if trainer.device != "cpu" or trainer.precision != "fp32" or not probing:
            trainer.matmul = "aten"
        else:
            with torch_threads(trainer.threads_per_rank):  # as fast as a rank runs it
                choice = fastest_backend()
            print(choice.describe())
            trainer.matmul = choice.backend
    set_matmul_backend(trainer.matmul)
    return choice
