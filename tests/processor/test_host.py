"""The host as figures name it: the CPU's model and its vector extensions."""

from __future__ import annotations

from pathlib import Path

import torch

from processor.host import ISA_FLAGS, cpu_isa, cpu_name, device_name


def test_the_cpu_is_named_with_the_extensions_its_flags_show():
    isa = cpu_isa()
    assert set(isa) <= {name for _, name in ISA_FLAGS}
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        flags = next((line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")), "").split()
        assert ("AVX-512" in isa) == ("avx512f" in flags) and ("AVX2" in isa) == ("avx2" in flags)
    name = cpu_name()
    assert all(extension in name for extension in isa)
    assert device_name(torch.device("cpu")) == name
