"""``python -m processor.attention.build_kernel``: compile the fused CPU attention kernel for this
machine, and the narrower ISA variants its tests check (:mod:`processor.attention.native_build`);
one line either way, the set-up goes on without it."""

from __future__ import annotations

import sys

from processor.attention.native_build import build, host_variants, load


def main() -> int:
    variants = host_variants()
    try:
        build(variants)
    except (RuntimeError, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"the fused CPU attention kernel did not build ({first}); the Python attention paths run instead")
        return 1
    widths = ", ".join(f"{name}: {module.isa()}" for name in variants if (module := load(name)) is not None)
    print(f"built the fused CPU attention kernel ({widths})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
