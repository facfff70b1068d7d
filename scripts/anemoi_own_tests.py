"""Extract anemoi-models' own processor tests from its sdist, aimed at gridshard's adapter.

Usage: ``python scripts/anemoi_own_tests.py SDIST OUT_DIR``; ``scripts/anemoi_own_tests.sh``
downloads the sdist, calls this and runs pytest in ``OUT_DIR``.

Only the import of the class under test changes (and the ``BaseProcessor`` fixture gains the
two settings a transformer needs): every assertion is anemoi's. A swap that no longer matches
the tests' text fails loudly, naming the file: a new anemoi-models version changed its tests.
"""

from __future__ import annotations

import sys
import tarfile
from pathlib import Path

ADAPTER = "processor.interop.anemoi_processor"

# Files taken as they are: the fixtures and markers the tests rely on.
AS_THEY_ARE = ("pytest.ini", "tests/conftest.py")

# file -> [(anemoi's text, what replaces it)], each text found exactly once.
SWAPS: dict[str, list[tuple[str, str]]] = {
    "tests/layers/processor/test_transformer_processor.py": [
        (
            "from anemoi.models.layers.processor import TransformerProcessor\n",
            f"from {ADAPTER} import AnemoiTransformerProcessor as TransformerProcessor\n",
        ),
    ],
    "tests/layers/processor/test_base_processor.py": [
        (
            "from anemoi.models.layers.processor import BaseProcessor\n",
            f"from {ADAPTER} import AnemoiTransformerProcessor as BaseProcessor\n",
        ),
        # anemoi's abstract BaseProcessor needs no heads or MLP width; a transformer does.
        (
            "    num_chunks: int = 2\n",
            "    num_chunks: int = 2\n    num_heads: int = 16\n    mlp_hidden_ratio: int = 4\n",
        ),
    ],
    "tests/layers/test_grad_checkpoint_wiring.py": [
        (
            "from anemoi.models.layers.processor import TransformerProcessor\n",
            f"from {ADAPTER} import AnemoiTransformerProcessor as TransformerProcessor\n",
        ),
    ],
}


def extract(sdist: Path, out: Path) -> list[str]:
    """Write the swapped test files (and :data:`AS_THEY_ARE`) under ``out``; return the test
    files' paths relative to ``out``."""
    with tarfile.open(sdist) as archive:
        root = archive.getnames()[0].split("/")[0]
        for name in (*AS_THEY_ARE, *SWAPS):
            member = archive.extractfile(f"{root}/{name}")
            if member is None:
                raise SystemExit(f"{sdist.name} has no {name}")
            text = member.read().decode()
            for old, new in SWAPS.get(name, []):
                if text.count(old) != 1:
                    raise SystemExit(f"{name} in {sdist.name}: expected {old.strip()!r} once, found {text.count(old)}")
                text = text.replace(old, new)
            target = out / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    return list(SWAPS)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    print("\n".join(extract(Path(sys.argv[1]), Path(sys.argv[2]))))
