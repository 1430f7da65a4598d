"""What machine a benchmark ran on, as its results record it."""

from __future__ import annotations

import platform

# the vector extensions that change which kernels llama.cpp runs, so its speed and its sums
SIMD = ("avx2", "avx512f", "avx512_vnni", "amx_int8")


def cpu() -> str:
    """The CPU's model name and which of :data:`SIMD` it has, e.g. ``Intel(R) Xeon(R)
    Processor (avx2 avx512f avx512_vnni amx_int8)``; the platform's processor name where
    /proc/cpuinfo cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return platform.processor() or "unknown"
    fields = dict(
        (k.strip(), v.strip()) for k, _, v in (ln.partition(":") for ln in info.splitlines())
    )
    name = fields.get("model name") or platform.processor() or "unknown"
    flags = set(fields.get("flags", "").split())
    have = [f for f in SIMD if f in flags]
    return f"{name} ({' '.join(have)})" if have else name
