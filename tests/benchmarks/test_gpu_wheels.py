"""The wheels carried to the GPU machine: every third-party module the app imports is in its
image or carried; the carried list is a closed set (each wheel's requirements carried, in the
image, or left out on purpose), meets pyproject's bounds, and never carries torch; the check
that ``scripts/gpu_wheels.sh`` runs names what is wrong; both scripts read the same lists."""

from __future__ import annotations

import ast
import importlib.metadata
import sys
import zipfile
from pathlib import Path

import pytest

from benchmarks.gpu import wheels

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = {"training", "benchmarks", "processor", "configs", "tests"}


def _guarded(tree: ast.AST) -> set[int]:
    """Ids of import nodes inside a ``try`` that catches ImportError (optional imports)."""
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            names = {ast.unparse(h.type) for h in node.handlers if h.type is not None}
            if names & {"ImportError", "ModuleNotFoundError", "(ImportError, ModuleNotFoundError)"}:
                guarded |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return guarded


def app_imports() -> dict[str, str]:
    """Top-level third-party modules imported by training/, benchmarks/ and processor/ (not
    optional ones): ``{module: a file importing it}``."""
    found: dict[str, str] = {}
    for folder in ("training", "benchmarks", "processor"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            skip = _guarded(tree)
            for node in ast.walk(tree):
                if id(node) in skip:
                    continue
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for top in {n.split(".")[0] for n in names} - FIRST_PARTY - set(sys.stdlib_module_names):
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_every_module_the_app_imports_is_in_the_image_or_carried():
    pins, _ = wheels.wheel_list()
    image = wheels.image_packages()
    by_module = importlib.metadata.packages_distributions()
    imports = app_imports()
    assert {"hydra", "omegaconf", "mlflow", "zarr", "yaml", "torch"} <= set(imports)
    for module, where in sorted(imports.items()):
        dists = {wheels.normalize(d) for d in by_module.get(module, [])}
        assert dists, f"{module} (imported by {where}) is not installed here: cannot tell its distribution"
        lists = f"{wheels.IMAGE_LIST.name} nor in {wheels.WHEEL_LIST.name}"
        assert dists & (image | set(pins)), f"{module} ({', '.join(dists)}, imported by {where}) is neither in {lists}"


def test_the_lists_are_apart_and_torch_is_never_carried():
    pins, left_out = wheels.wheel_list()
    image = wheels.image_packages()
    assert not set(pins) & image and not set(pins) & left_out and not left_out & image
    assert {"torch", "numpy", "triton", "torch-geometric"} <= image
    assert {"hydra-core", "omegaconf", "antlr4-python3-runtime", "mlflow-skinny", "zarr", "numcodecs"} <= set(pins)


def test_the_pins_meet_pyproject():
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement

    pins, _ = wheels.wheel_list()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for line in project["dependencies"]:
        req = Requirement(line)
        name = wheels.normalize(req.name)
        name = "mlflow-skinny" if name == "mlflow" else name  # the tracking client of the same release
        if name in pins:
            assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} vs {line}"


def test_the_carried_set_is_closed_by_the_installed_metadata():
    """Each carried distribution installed here at its pinned version: its requirements (for
    CPython 3.12 on Linux) are carried, in the image, or left out on purpose."""
    from packaging.requirements import Requirement

    pins, left_out = wheels.wheel_list()
    known = set(pins) | wheels.image_packages() | left_out
    env = wheels.target_environment("3.12")
    checked = 0
    for name, version in pins.items():
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if dist.version != version:
            continue
        checked += 1
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate(env):
                assert wheels.normalize(req.name) in known, f"{name} {version} needs {line}"
    assert checked >= 10  # most of the list is installed here at its pin


def _fake_wheel(folder: Path, name: str, version: str, *requires: str) -> None:
    head = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta = head + "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", meta + "\nDescription.\n")


def test_the_check_names_what_is_missing_or_too_old(tmp_path, monkeypatch):
    (tmp_path / "image.txt").write_text("# the image\nnumpy\n")
    (tmp_path / "wheels.txt").write_text("a==1.0\nb==1.5\nc==2.0  # comment\n!left\n")
    monkeypatch.setattr(wheels, "IMAGE_LIST", tmp_path / "image.txt")
    monkeypatch.setattr(wheels, "WHEEL_LIST", tmp_path / "wheels.txt")
    folder = tmp_path / "w"
    folder.mkdir()
    _fake_wheel(folder, "a", "1.0", "b>=2", "numpy", "left", "old; python_version < '3.8'", "x; extra == 'y'")
    _fake_wheel(folder, "b", "1.5", "missing>=1")
    _fake_wheel(folder, "stray", "0.1")
    assert wheels.check(folder) == [
        "c==2.0: pinned, but no wheel of it in " + str(folder),
        f"stray: a wheel in {folder}, but not in wheels.txt",
        "a needs b>=2, the wheel is b 1.5",
        "b needs missing>=1: neither carried, in the image, nor left out",
    ]
    assert "in all: 3 wheels" in wheels.folder_report(folder)


def test_the_scripts_use_the_lists_and_install_offline():
    fetch = (ROOT / "scripts" / "gpu_wheels.sh").read_text()
    assert "benchmarks.gpu.wheels pins" in fetch and "benchmarks.gpu.wheels check" in fetch
    assert "--python-version" in fetch and "--no-deps --only-binary=:all:" in fetch
    check = (ROOT / "scripts" / "gpu_check.sh").read_text()
    assert "--no-index --no-deps" in check and ".gpu-wheels" in check and "PYTHONPATH" in check
    assert ".gpu-wheels/" in (ROOT / ".gitignore").read_text().splitlines()
