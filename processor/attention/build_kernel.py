"""``python -m processor.attention.build_kernel``: compile the fused CPU attention kernel for this
machine (:mod:`processor.attention.native`); one line either way, the set-up goes on without it."""

from __future__ import annotations

import sys

from processor.attention.native import build


def main() -> int:
    try:
        library = build()
    except (RuntimeError, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"the fused CPU attention kernel did not build ({first}); the Python attention paths run instead")
        return 1
    print(f"built the fused CPU attention kernel: {library}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
