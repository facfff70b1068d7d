"""How the packages depend on each other: the library stands alone, the training app uses the
library and never the benchmarks, and only a strategy's own file names it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STRATEGY_NAMES = {"shard_sequence", "shard_heads", "shard_channels", "shard_hybrid"}


def _python_files(*packages: str) -> list[Path]:
    return [p for package in packages for p in sorted((ROOT / package).rglob("*.py"))]


def _imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
    return found


def _offenders(packages: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{path.relative_to(ROOT)}: {name}"
        for path in _python_files(*packages)
        for name in _imports(path)
        if name.split(".")[0] in forbidden
    ]


def test_training_never_imports_the_benchmarks() -> None:
    assert not _offenders(("training",), ("benchmarks",))


def test_the_library_imports_neither_app_nor_their_tools() -> None:
    assert not _offenders(("processor",), ("training", "benchmarks", "configs", "hydra", "mlflow", "omegaconf"))


def _names_a_strategy(node: ast.AST) -> bool:
    """A comparison with a built-in strategy's name (``x == "shard_heads"``, ``x in (...)``)."""
    if not isinstance(node, ast.Compare):
        return False
    for side in [node.left, *node.comparators]:
        values = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
        if any(isinstance(v, ast.Constant) and v.value in STRATEGY_NAMES for v in values):
            return True
    return False


def test_only_a_strategy_names_itself() -> None:
    """Nothing outside ``processor/strategies`` branches on a strategy's name: it asks the strategy."""
    offenders = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in _python_files("processor", "training", "benchmarks")
        if path.parent.name != "strategies"
        for node in ast.walk(ast.parse(path.read_text()))
        if _names_a_strategy(node)
    ]
    assert not offenders, offenders


COMMANDS = ("training.app", "training.evaluate", "training.predict", "training.parity")


def test_no_command_imports_another() -> None:
    """The commands are siblings: each tells the launcher what it is (``training.launch.command``)."""
    offenders = []
    for path in _python_files("training"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        own = next((c for c in COMMANDS if module == c or module.startswith(c + ".")), None)
        for name in _imports(path):
            other = next((c for c in COMMANDS if name == c or name.startswith(c + ".")), None)
            if own is not None and other is not None and other != own:
                offenders.append(f"{module} imports {name}")
    assert not offenders, offenders


def test_imports_inside_functions_say_why_they_are_deferred() -> None:
    """Imports sit at the top of a module; one inside a function names the heavy or optional
    dependency it waits for (``# deferred: mlflow (1.3 s)``)."""
    unexplained = []
    for path in _python_files("training"):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    if isinstance(inner, (ast.Import, ast.ImportFrom)) and "# deferred:" not in lines[inner.lineno - 1]:
                        unexplained.append(f"{path.relative_to(ROOT)}:{inner.lineno}")
    assert not unexplained, unexplained
