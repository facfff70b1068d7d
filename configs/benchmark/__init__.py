"""Hydra configuration of benchmark points (``python -m benchmarks``); a root of its own so that
its ``strategy`` and ``model`` keys are plain values, not the training config groups."""
