"""The wheels the GPU machine needs carried: the lists, and a check of a downloaded folder.

``scripts/gpu_image_packages.txt`` names what the machine's image has; ``scripts/gpu_wheels.txt``
pins what ``scripts/gpu_wheels.sh`` fetches (``name==version``, each without its dependencies)
and marks dependencies left out on purpose (``!name``). ``python -m benchmarks.gpu.wheels check
DIR`` reads every wheel's ``Requires-Dist`` (markers evaluated for the target Python on Linux
x86_64, no extras) and names each requirement that is neither carried, in the image, nor left
out, each carried wheel whose version a requirement excludes, and pins without a wheel.

Standard library only, but for ``packaging`` (pip's own copy where it is not installed).
"""

from __future__ import annotations

import argparse
import re
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMAGE_LIST = ROOT / "scripts" / "gpu_image_packages.txt"
WHEEL_LIST = ROOT / "scripts" / "gpu_wheels.txt"


def normalize(name: str) -> str:
    """A distribution's name as PEP 503 compares them: ``PyYAML`` -> ``pyyaml``, ``a_b.c`` -> ``a-b-c``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _lines(path: Path) -> list[str]:
    """The lines of ``path`` without comments and blanks."""
    return [s for line in path.read_text().splitlines() if (s := line.split("#", 1)[0].strip())]


def image_packages(path: Path | None = None) -> set[str]:
    """The distributions the GPU machine's image has (normalised names; default list: :data:`IMAGE_LIST`)."""
    return {normalize(line) for line in _lines(path or IMAGE_LIST)}


def wheel_list(path: Path | None = None) -> tuple[dict[str, str], set[str]]:
    """``({name: version} carried, {name} left out on purpose)``, names normalised (default list:
    :data:`WHEEL_LIST`)."""
    path = path or WHEEL_LIST
    pins: dict[str, str] = {}
    left_out: set[str] = set()
    for line in _lines(path):
        if line.startswith("!"):
            left_out.add(normalize(line[1:]))
        else:
            name, _, version = line.partition("==")
            if not version:
                raise ValueError(f"{path}: {line!r} is not name==version")
            pins[normalize(name)] = version.strip()
    return pins, left_out


def _packaging():
    try:
        from packaging import markers, requirements, version
    except ImportError:  # pragma: no cover - pip's vendored copy
        from pip._vendor.packaging import markers, requirements, version  # type: ignore[no-redef]
    return markers, requirements, version


def target_environment(python_version: str) -> dict[str, str]:
    """Marker variables of CPython ``python_version`` on Linux x86_64."""
    return {
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "os_name": "posix",
        "extra": "",
    }


def wheel_metadata(wheel: Path) -> tuple[str, str, list[str]]:
    """``(name, version, Requires-Dist lines)`` from a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        text = z.read(meta).decode()
    head = text.split("\n\n", 1)[0].splitlines()
    field = {k: v.strip() for k, _, v in (line.partition(":") for line in head) if k in ("Name", "Version")}
    requires = [line.partition(":")[2].strip() for line in head if line.startswith("Requires-Dist:")]
    return normalize(field["Name"]), field["Version"], requires


def check(folder: Path, python_version: str = "3.12") -> list[str]:
    """What is wrong with the wheels in ``folder`` against the lists (empty: nothing)."""
    markers, requirements, version = _packaging()
    pins, left_out = wheel_list()
    image = image_packages()
    env = target_environment(python_version)
    found = {name: (ver, reqs) for name, ver, reqs in map(wheel_metadata, sorted(folder.glob("*.whl")))}
    problems = [f"{n}=={v}: pinned, but no wheel of it in {folder}" for n, v in pins.items() if n not in found]
    problems += [f"{n}: a wheel in {folder}, but not in {WHEEL_LIST.name}" for n in found if n not in pins]
    for name, (ver, reqs) in sorted(found.items()):
        if name in pins and ver != pins[name]:
            problems.append(f"{name}: the wheel is {ver}, the list pins {pins[name]}")
        for line in reqs:
            req = requirements.Requirement(line)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            dep = normalize(req.name)
            if dep in found:
                if not req.specifier.contains(version.Version(found[dep][0]), prereleases=True):
                    problems.append(f"{name} needs {line}, the wheel is {dep} {found[dep][0]}")
            elif dep not in image and dep not in left_out:
                problems.append(f"{name} needs {line}: neither carried, in the image, nor left out")
    return problems


def folder_report(folder: Path) -> str:
    """Each wheel's size and the total, in MiB."""
    wheels = sorted(folder.glob("*.whl"))
    sizes = [w.stat().st_size for w in wheels]
    lines = [f"{s / 2**20:7.2f} MiB  {w.name}" for w, s in zip(wheels, sizes)]
    lines.append(f"{sum(sizes) / 2**20:7.2f} MiB  in all: {len(wheels)} wheels in {folder}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu.wheels", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("pins", help="print the carried wheels as name==version lines")
    pin = sub.add_parser("pin", help="print one carried wheel's name==version")
    pin.add_argument("name")
    checked = sub.add_parser("check", help="check a downloaded folder; print its wheels and size")
    checked.add_argument("folder", type=Path)
    checked.add_argument("--python-version", default="3.12")
    args = parser.parse_args(argv)
    pins, _ = wheel_list()
    if args.command == "pins":
        print("\n".join(f"{n}=={v}" for n, v in pins.items()))
        return 0
    if args.command == "pin":
        print(f"{normalize(args.name)}=={pins[normalize(args.name)]}")
        return 0
    print(folder_report(args.folder))
    problems = check(args.folder, args.python_version)
    for problem in problems:
        print(f"problem: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
