"""Start-up work that keeps requests and worker memory lean: the BM25 kernels' code loaded
before the first query, and forked workers sizing their threads for their share of the cores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from indexes.cpu import share_cores, usable_cores
from indexes.onnx_encoder import OnnxEncoder
from tests.small_index import index_fixture  # noqa: F401 (the `index` fixture)

REPO = Path(__file__).resolve().parents[1]

# In a fresh interpreter (numba's loaded kernels are per process): warm a build's BM25, then
# count the kernel signatures that real searches (unfiltered, filtered, dense leg) add.
PROBE = """
import json, sys
import numpy as np
from indexes import bm25_mask_walk, bm25_filtered, bm25_kernels, bm25_pruned, topk
from indexes.warmup import warm_bm25
from retrieval.loaded_build import LoadedBuild

def loaded():
    modules = (bm25_kernels, bm25_filtered, bm25_mask_walk, bm25_pruned, topk)
    kernels = [getattr(m, n) for m in modules for n in dir(m)]
    return {k.__name__: len(k.signatures) for k in kernels if hasattr(k, "signatures")}

build = LoadedBuild.load(sys.argv[1], verify=False)
before = loaded()
warm_bm25(build.bm25)
warmed = loaded()
rng = np.random.default_rng(0)
for query in ["heat transfer boundary layer", "supersonic flow over a wedge"]:
    tokens = build.analyzer(query)
    build.bm25.top_candidates(tokens, 300)
    build.bm25.score_touched(tokens)
    build.bm25.score_rows(tokens, np.arange(0, build.manifest.n_docs, 7))
    for share in (0.005, 0.3, 1.0):
        mask = rng.random(build.manifest.n_docs) < share
        build.bm25.top_candidates(tokens, 300, mask)
print(json.dumps({"before": before, "warmed": warmed, "after": loaded()}))
"""


def test_warm_up_loads_every_kernel_a_search_uses(index: Path) -> None:
    out = subprocess.run([sys.executable, "-c", PROBE, str(index)],
                         capture_output=True, text=True, check=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    counts = json.loads(out.stdout.strip().splitlines()[-1])
    assert sum(counts["before"].values()) == 0  # nothing loaded by importing or loading
    assert sum(counts["warmed"].values()) >= 3
    assert counts["after"] == counts["warmed"]  # searches found every kernel already loaded


def test_forked_workers_share_the_cores_and_keep_one_encoder_session() -> None:
    cores = usable_cores()
    try:
        share_cores(cores)  # one worker per core: one thread each
        assert usable_cores() == 1
        encoder = OnnxEncoder(quantized=True)
        assert encoder.threads == 1
        assert encoder._shared is encoder._alone  # one session's memory, not two
        share_cores(cores * 4)  # more workers than cores still leaves each one core
        assert usable_cores() == 1
    finally:
        share_cores(1)
    assert usable_cores() == cores
