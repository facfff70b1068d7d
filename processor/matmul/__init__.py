"""The model's linear layers on the host's fastest float32 GEMM (:mod:`.linear`), and the
per-host measurement that picks it (:mod:`.probe`)."""

from processor.matmul.linear import BACKENDS, Linear, linear, matmul_backend, set_matmul_backend

__all__ = ["BACKENDS", "Linear", "linear", "matmul_backend", "set_matmul_backend"]
