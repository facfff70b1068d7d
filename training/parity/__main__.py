"""``python -m training.parity``: does the configured strategy give one rank's numbers here?

python -m training.parity                                          # the default run split over 2 ranks
python -m training.parity strategy=shard_heads trainer.precision=bf16
python -m training.parity trainer.nprocs=4 trainer.ranks_per_model=4 parity.reference=2
torchrun --nnodes 2 --nproc-per-node 4 -m training.parity trainer.ranks_per_model=8 trainer.device=cuda

Takes a training run's configuration, every group and override (data, model, strategy, ranks,
precision, device), and trains ``parity.steps`` steps twice from the same initial parameters on
the same batches: on a reference layout (:mod:`training.parity.layouts`: one rank, or
``parity.reference`` model-parallel ranks when one cannot hold the model) and on the configured
ranks and strategy. Per step it compares the loss, every parameter's gradient (before clipping)
and every parameter after the optimiser step (:mod:`training.parity.compare`).

It prints the worst tensor of each step and quantity and one verdict line against
``parity.tolerance`` (default: fp32 1e-5, bf16 0.25, :data:`training.config.parity_settings.TOLERANCES`),
and writes ``parity.csv`` (every tensor) in its run directory and an MLflow run tagged
``kind=parity`` (``parity/<quantity>``, the worst of each step). Exit code 0 within the
tolerance, 4 (:data:`training.parity.check.EXIT_BREACH`) beyond it (under torchrun rank 0 exits
4 and torchrun itself 1, naming it; the others exit 0); bad input is one line and exit code 2,
a lost rank exit code 3 (:mod:`training.launch.errors`); Ctrl-C or SIGTERM stops every rank after the
step in flight, with no verdict (exit code 130 or 143).
"""

from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig

from processor.runtime.torchrun import torchrun_rank
from training.launch.interrupt import exit_code, signal_name
from training.launch.launcher import run_reporting_errors
from training.parity.check import EXIT_BREACH, run

log = logging.getLogger(__name__)


@hydra.main(version_base="1.3", config_path="../../configs", config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    result = run_reporting_errors(run, cfg)
    first = torchrun_rank() == 0
    signum = result.get("signal") or result.get("stopped")  # the launcher's signal, else the rank's
    if signum is not None:
        if first:
            print(f"parity: stopped by {signal_name(signum)} after the step in flight: no verdict", file=sys.stderr)
        sys.exit(exit_code(signum))
    if not first:
        return  # rank 0 reports, and alone exits EXIT_BREACH (torchrun then exits 1, naming it)
    log.info("parity by step (max relative difference, the worst tensor):\n%s", result["table"])
    log.info(
        "run times: reference %.1f s, configured %.1f s; every tensor: %s/parity.csv",
        result["reference_s"],
        result["configured_s"],
        cfg.run_dir,
    )
    print(result["verdict"], flush=True)
    if result["breach"]:
        sys.exit(EXIT_BREACH)


if __name__ == "__main__":
    from training.launch.launcher import main

    main(_hydra_main)
