"""What a benchmark records of the machine: the CPU's name and the vector extensions that
change llama.cpp's kernels (results from an AVX2 and an AVX-512 machine differ in speed and in
their sums, so a table must say which it came from)."""

from __future__ import annotations

from pathlib import Path

from continuum.bench.machine import SIMD, cpu


def test_the_cpu_is_named_with_the_extensions_it_has() -> None:
    info = Path("/proc/cpuinfo").read_text()
    name = next(ln.split(":", 1)[1].strip() for ln in info.splitlines() if "model name" in ln)
    flags = set(
        next(ln for ln in info.splitlines() if ln.startswith("flags")).split(":")[1].split()
    )
    got = cpu()
    assert got.startswith(name)
    listed = got[len(name) :].strip(" ()").split()
    assert listed == [f for f in SIMD if f in flags]  # in SIMD's order, only those present
