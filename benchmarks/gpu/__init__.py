"""The parts of the one-command GPU check (:mod:`benchmarks.gpu_check`) and its wheel lists.

Nothing here imports more than torch, einops, numpy and pytest at import time: a bare GPU
machine has those; Hydra, MLflow and zarr come as carried wheels, used in subprocesses.
"""
