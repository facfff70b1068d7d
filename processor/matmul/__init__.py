"""The model's linear layers on the host's fastest float32 GEMM (:mod:`.backends`), and the
per-host measurement that picks it (:mod:`.probe`)."""

from processor.matmul.backends import BACKENDS, Linear, linear, matmul_backend, set_matmul_backend

__all__ = ["BACKENDS", "Linear", "linear", "matmul_backend", "set_matmul_backend"]
