"""The model code's shape: no mutable module state, no runtime tools, a short path to the kernel."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import processor

# The model code: everything a forward and backward run. The runtime package and the demo
# are programs' tools; grids are data.
MODEL_PACKAGES = ("processor.attention", "processor.strategies", "processor.distributed")
MODEL_MODULES = ("processor", "processor.config", "processor.mlp", "processor.segments", "processor.transformer")


def _model_modules() -> list[str]:
    names = list(MODEL_MODULES)
    for package in MODEL_PACKAGES:
        names.append(package)
        path = importlib.import_module(package).__path__
        names += [f"{package}.{m.name}" for m in pkgutil.iter_modules(path)]
    return names


# Process-wide caches of files, not model state: each named with why it is one.
CACHES_OF_FILES = {
    "processor.attention.native_build._LOADED": "the native kernel's libraries loaded in this process",
}


def test_no_model_module_holds_mutable_globals():
    mutable = (list, dict, set, bytearray)
    found = []
    for name in _model_modules():
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if f"{name}.{attr}" in CACHES_OF_FILES:
                continue
            if not attr.startswith("__") and isinstance(value, mutable):
                found.append(f"{name}.{attr}: {type(value).__name__}")
    assert not found, found


def test_model_code_never_imports_the_runtime():
    root = Path(processor.__file__).parent.parent
    offenders = []
    for name in _model_modules():
        module = importlib.import_module(name)
        tree = ast.parse(Path(module.__file__).read_text())
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            offenders += [f"{Path(module.__file__).relative_to(root)}: {t}" for t in targets if "runtime" in t]
    assert not offenders, offenders


def test_the_attention_layer_knows_nothing_of_strategies():
    """Strategies call the layer (the block plan), never the other way round: no import circle."""
    offenders = []
    for name in _model_modules():
        if not name.startswith("processor.attention"):
            continue
        tree = ast.parse(Path(importlib.import_module(name).__file__).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("processor.strategies"):
                offenders.append(f"{name}: {node.module}")
    assert not offenders, offenders


def test_public_api_is_declared():
    for name in _model_modules():
        module = importlib.import_module(name)
        if name in MODEL_MODULES[:1] + MODEL_PACKAGES:
            assert all(hasattr(module, a) for a in module.__all__), name
    assert {"ProcessorConfig", "TransformerProcessor", "TransformerBlock", "SelfAttention"} <= set(processor.__all__)
