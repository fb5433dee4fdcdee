"""The merged /metrics view over the workers' sample files survives a worker's file still at
0 bytes: a worker creates it before sizing it, and one SIGKILLed in between leaves it empty for
good. prometheus-client's own collector fails every scrape on such a file."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import multiprocess as prometheus_multiprocess
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.parser import text_string_to_metric_families

from retrieval.service.metrics import WorkerFiles


def worker_file(directory: Path, pid: int, reloads: float) -> None:
    samples = MmapedDict(str(directory / f"counter_{pid}.db"))
    key = mmap_key("retrieval_reloads", "retrieval_reloads_total", ["outcome"], ["loaded"],
                   "Build reloads by outcome")
    samples.write_value(key, reloads, 0.0)
    samples.close()


def scrape(collector: object) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(collector)  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    return {s.name: s.value for family in text_string_to_metric_families(text)
            for s in family.samples}


def test_an_empty_worker_file_is_a_worker_with_no_samples(tmp_path: Path) -> None:
    worker_file(tmp_path, 101, 2.0)
    worker_file(tmp_path, 102, 3.0)
    (tmp_path / "counter_103.db").touch()  # created, never sized: its worker was killed
    (tmp_path / "gauge_livesum_103.db").touch()
    with pytest.raises(struct.error):  # the library's collector, on the same files
        scrape(prometheus_multiprocess.MultiProcessCollector(None, path=str(tmp_path)))
    assert scrape(WorkerFiles(str(tmp_path))) == {"retrieval_reloads_total": 5.0}


def test_a_made_up_http_method_is_counted_as_other(monkeypatch) -> None:
    """Each method a client made up was a series of its own: no key was needed to grow the
    registry without bound."""
    from retrieval.service.metrics import ServiceMetrics

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    metrics = ServiceMetrics()
    for n in range(5):
        metrics.observe_request("/healthz", f"X{n}RANDOM", 405, 0.001)
    metrics.observe_request("/healthz", "GET", 200, 0.001)
    methods = {sample.labels["method"]
               for family in text_string_to_metric_families(metrics.exposition().decode())
               for sample in family.samples if "method" in sample.labels}
    assert methods == {"other", "GET"}
