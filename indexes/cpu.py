"""What the machine offers this process: the cores it may run on, and what its CPU can do."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

# The vector extensions that change which kernels run, or how fast (benchmarks record them).
VECTOR_EXTENSIONS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "asimd",
                     "sve")

# How many processes of one service run side by side on these cores (its forked workers).
_processes_sharing = 1


def share_cores(processes: int) -> None:
    """Declare this process one of ``processes`` serving side by side on the same cores.

    Each then sizes its thread pools and its encoder for its share of the cores, so together
    they do not oversubscribe them; with one thread the ONNX encoder also keeps one session
    instead of two (about 35 MB less private memory per worker).
    """
    global _processes_sharing
    _processes_sharing = max(1, processes)


def usable_cores() -> int:
    """Cores this process may use: its CPU affinity (a container's cpuset), not the host's
    count, so a service pinned to 2 of 64 cores sizes its threads for 2; divided among the
    processes declared by ``share_cores``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity API on this platform (macOS, Windows)
        cores = os.cpu_count() or 1
    return max(1, cores // _processes_sharing)


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux reports KiB, macOS bytes)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


@functools.cache
def cpu_info() -> Mapping[str, str]:
    """The first processor's fields in the kernel's ``/proc/cpuinfo`` ("model name",
    "flags"...; "Features" and "CPU part" on ARM); empty where there is none (not Linux)."""
    try:
        return parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        return MappingProxyType({})


def parse_cpuinfo(text: str) -> Mapping[str, str]:
    """``/proc/cpuinfo``'s first block (one per processor, blank-line separated) as field ->
    value, read-only; a repeated field keeps its first value."""
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    return MappingProxyType(fields)


def cpu_model(info: Mapping[str, str] | None = None) -> str | None:
    """The CPU's name (x86's "model name"; on ARM, whose kernel gives none, the implementer
    and part numbers), from ``info`` (default: this machine's ``cpu_info``)."""
    info = cpu_info() if info is None else info
    if info.get("model name"):
        return info["model name"]
    if info.get("CPU part"):
        return f"CPU implementer {info.get('CPU implementer', '?')}, part {info['CPU part']}"
    return None


def cpu_flags(info: Mapping[str, str] | None = None) -> frozenset[str]:
    """The CPU's feature flags as the kernel names them (``avx2``, ``avx512_vnni``; ARM's
    "Features": ``asimd``, ``sve``), from ``info`` (default: this machine's)."""
    info = cpu_info() if info is None else info
    return frozenset((info.get("flags") or info.get("Features") or "").split())


def vector_extensions(info: Mapping[str, str] | None = None) -> list[str]:
    """Which of ``VECTOR_EXTENSIONS`` the CPU has, in that order."""
    flags = cpu_flags(info)
    return [name for name in VECTOR_EXTENSIONS if name in flags]
