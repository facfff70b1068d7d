"""No import circle anywhere: a module never reaches itself through the modules it imports,
imports inside functions counted (they only hide a circle), ``if TYPE_CHECKING:`` ones not
(they never run)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("processor", "training", "benchmarks", "configs")


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:``."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
            skipped |= {id(inner) for child in node.body for inner in ast.walk(child)}
    return skipped


def _targets(node: ast.AST, package: str, modules: set[str]) -> list[str]:
    """The modules of ``modules`` an import statement loads (the deepest that exists)."""

    def deepest(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    if isinstance(node, ast.Import):
        return [m for a in node.names if (m := deepest(a.name))]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
    found = [deepest(f"{base}.{a.name}") if f"{base}.{a.name}" in modules else deepest(base) for a in node.names]
    return [m for m in found if m]


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """``{module: the modules it imports}`` of every Python file under ``root/<package>``."""
    paths = {_module_name(p, root): p for package in packages for p in sorted((root / package).rglob("*.py"))}
    graph = {}
    for name, path in paths.items():
        tree = ast.parse(path.read_text())
        skipped = _type_checking_only(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = {
            target
            for node in ast.walk(tree)
            if id(node) not in skipped
            for target in _targets(node, package, set(paths))
            if target != name
        }
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_through_others():
    assert circles(import_graph(ROOT, PACKAGES)) == []


def test_a_circle_closed_inside_a_function_is_found(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import f\n")
    (package / "b.py").write_text("def f():\n    from pkg import a\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.d import g\n")
    (package / "d.py").write_text("from . import c\n")
    assert circles(import_graph(tmp_path, ("pkg",))) == [["pkg.a", "pkg.b"]]


# Rooms of training/ that never look at each other: scoring knows nothing of how it is shown,
# the configuration nothing of the stages that use it.
FOLDER_RULES = (
    ("training.skill", "training.reporting"),
    ("training.config", "training.launch"),
    ("training.config", "training.reporting"),
    ("training.checkpoint", "training.reporting"),
    ("training.distributed", "training.launch"),
)


def test_the_folders_of_training_keep_their_rules():
    graph = import_graph(ROOT, PACKAGES)
    broken = [
        f"{module} imports {target}"
        for room, forbidden in FOLDER_RULES
        for module, targets in graph.items()
        if module.startswith(room)
        for target in targets
        if target.startswith(forbidden)
    ]
    assert not broken, broken


def test_no_module_over_400_lines_and_no_function_over_60():
    too_big = []
    for package in ("processor", "training", "benchmarks"):
        for path in sorted((ROOT / package).rglob("*.py")):
            text = path.read_text()
            if len(text.splitlines()) > 400:
                too_big.append(f"{path.relative_to(ROOT)}: {len(text.splitlines())} lines")
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                    too_big.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not too_big, too_big


def test_the_rooms_of_training_stand_on_floors():
    """No circle between the rooms of training/ (its folders and top-level modules) either: each
    room uses only the floors below it (docs/architecture.md draws them)."""

    def room(module: str) -> str:
        return ".".join(module.split(".")[:2])

    rooms: dict[str, set[str]] = {}
    for module, targets in import_graph(ROOT, PACKAGES).items():
        if module.startswith("training."):
            inner = {room(t) for t in targets if t.startswith("training.") and room(t) != room(module)}
            rooms.setdefault(room(module), set()).update(inner)
    assert circles(rooms) == []
