"""What the machine's CPU can do, as the kernel reports it (``indexes.cpu``), and the machine
line of the benchmarks page that names it."""

from __future__ import annotations

import sys

import pytest

from benchmarks import report_page
from benchmarks.common import environment
from indexes.cpu import cpu_flags, cpu_model, parse_cpuinfo, vector_extensions

X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx2 fma avx512f avx512_vnni
vmx flags\t: ept vpid

processor\t: 1
model name\t: Another CPU
flags\t\t: fpu sse2
"""
ARM = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm sve
CPU implementer\t: 0x41
CPU part\t: 0xd0c

processor\t: 1
Features\t: fp
"""


def test_x86_reads_the_first_processor_and_its_flags_line() -> None:
    info = parse_cpuinfo(X86)
    assert cpu_model(info) == "AMD EPYC 7B13"
    assert "ept" not in cpu_flags(info)  # "vmx flags" is another field
    assert vector_extensions(info) == ["avx2", "fma", "avx512f", "avx512_vnni"]


def test_arm_reads_features_and_names_the_part() -> None:
    info = parse_cpuinfo(ARM)
    assert cpu_model(info) == "CPU implementer 0x41, part 0xd0c"
    assert vector_extensions(info) == ["asimd", "sve"]
    assert cpu_model(parse_cpuinfo("")) is None and vector_extensions(parse_cpuinfo("")) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/cpuinfo")
def test_this_machines_cpu_is_read() -> None:
    flags = cpu_flags()
    # Every x86-64 CPU has SSE2, every 64-bit ARM one ASIMD.
    assert "sse2" in flags or "asimd" in flags
    assert cpu_model()


def test_the_benchmarks_page_names_the_cpu_and_its_extensions() -> None:
    here = environment()
    recorded = {**here, "cpu_model": "Some CPU", "vector_extensions": ["avx2", "fma"]}
    assert "Some CPU; vector extensions: avx2, fma;" in report_page.machine(recorded)
    none = {**recorded, "vector_extensions": []}
    assert "vector extensions: none of those looked for" in report_page.machine(none)
    older = {k: v for k, v in here.items() if k not in ("cpu_model", "vector_extensions")}
    assert "vector extensions" not in report_page.machine(older)  # not recorded then
    assert here["vector_extensions"] == vector_extensions()
