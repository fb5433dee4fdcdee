"""What the machine offers this process: the cores it may run on."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity (a container's cpuset), not the host's
    count, so a service pinned to 2 of 64 cores sizes its threads for 2."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity API on this platform (macOS, Windows)
        return max(1, os.cpu_count() or 1)
