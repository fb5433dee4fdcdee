"""Memory under hostile filters: hundreds of distinct large IN lists, in a fresh interpreter so
its RSS is the retriever's. Each filter is first seen once (an access list per user): the
filter memo and the mask cache must hold them within their bounds (bytes of masks and of the
keys' values), so RSS stays flat instead of growing with every filter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import json, sys
import numpy as np
from retrieval import Retriever

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

root, filters, values = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
retriever = Retriever.load(root, {"cache": {"backend": "none"}}, encoder=None)
vector = np.ones(retriever.snapshot.manifest.encoder.dim, np.float32)
vector /= np.linalg.norm(vector)
rng = np.random.default_rng(0)
samples = []
for n in range(filters):
    spec = {"department": {"in": [f"u{n}-{v}" for v in rng.integers(0, 10**9, values)]
                           + ["cardiology"]}}
    result = retriever.search("heart disease", spec, 5, query_vector=vector)
    assert result.hits and all(h.metadata["department"] == "cardiology" for h in result.hits)
    if n in (filters // 4, filters - 1):
        samples.append(rss_mb())
masks = retriever.snapshot.metadata.masks
print(json.dumps({"rss_mb": samples, "mask_bytes": masks.nbytes, "mask_max": masks.max_bytes,
                  "masks": len(masks)}))
"""


def test_hundreds_of_distinct_large_filters_stay_within_the_cache_bytes(beir_index: Any
                                                                         ) -> None:
    """200 distinct IN lists of 40,001 values (the keys alone would hold ~600 MB unbounded):
    the mask cache stays within its bytes, and RSS from a quarter of the way to the end grows
    by less than the caches' bounds (64 MB of masks and keys, the filter memo's 400,000
    values) allow."""
    root, _, _ = beir_index("scifact")
    out = subprocess.run([sys.executable, "-c", PROBE, str(root), "200", "40000"], cwd=REPO,
                         capture_output=True, text=True, timeout=600,
                         env={"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
                              "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["mask_bytes"] <= found["mask_max"]
    early, late = found["rss_mb"]
    print(f"RSS {early:.0f} MB after 50 filters, {late:.0f} MB after 200; mask cache "
          f"{found['mask_bytes'] / 2**20:.1f} MB in {found['masks']} entries")
    assert late - early < 150, f"RSS grew {late - early:.0f} MB over 150 distinct filters"
