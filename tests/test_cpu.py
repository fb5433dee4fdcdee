"""What the machine's CPU can do, as the kernel reports it (``indexes.cpu``), and the machine
line of the benchmarks page that names it."""

from __future__ import annotations

import sys

import pytest

from benchmarks import report_page
from benchmarks.common import environment
from indexes.cpu import VECTOR_EXTENSIONS, cpu_flags, cpu_info, vector_extensions


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/cpuinfo")
def test_the_flags_and_extensions_are_the_kernels() -> None:
    flags = cpu_flags()
    assert flags, "the kernel lists the CPU's flags"
    extensions = vector_extensions()
    assert set(extensions) <= flags
    assert extensions == [name for name in VECTOR_EXTENSIONS if name in extensions]
    # Every x86-64 CPU has SSE2, every 64-bit ARM one ASIMD: the flags are this CPU's own.
    assert "sse2" in flags or "asimd" in flags
    assert cpu_info().get("model name") or cpu_info().get("CPU part")


def test_the_benchmarks_page_names_the_cpu_and_its_extensions() -> None:
    line = report_page.machine(environment())
    assert "vector extensions: " in line
    for name in vector_extensions():
        assert name in line
    recorded = {**environment(), "cpu_model": "Some CPU", "vector_extensions": []}
    assert "Some CPU; vector extensions: none of those looked for" in report_page.machine(
        recorded)
    older = {k: v for k, v in environment().items() if k not in ("cpu_model",
                                                                  "vector_extensions")}
    assert "vector extensions" not in report_page.machine(older)  # not recorded then
