"""A matmul backend forced on every product, however small: the tests' shapes are below the size
at which oneDNN takes over (:data:`processor.matmul.backends.MIN_MACS_PER_THREAD`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

import processor.matmul.backends as backends_module
from processor.matmul import matmul_backend, set_matmul_backend

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN")


@contextlib.contextmanager
def forced_backend(name: str) -> Iterator[None]:
    """``name`` for every product inside, the backend and the size threshold restored after."""
    previous, smallest = matmul_backend(), backends_module.MIN_MACS_PER_THREAD
    set_matmul_backend(name)
    backends_module.MIN_MACS_PER_THREAD = 0
    try:
        yield
    finally:
        set_matmul_backend(previous)
        backends_module.MIN_MACS_PER_THREAD = smallest
