"""overlap@k, the figure the console's comparison and the publish gate's canaries share.

It divided by k: two identical rankings shorter than k (a filter, a small build) overlapped
less than 1 (two empty ones 0.0), so a canary with few hits refused a build that changed
nothing.
"""

from __future__ import annotations

import pytest

from retrieval.publishing.config import Canary, GateConfig
from retrieval.publishing.quality import canary_figures, overlap_at_k, within

TEN = [str(i) for i in range(10)]


@pytest.mark.parametrize(("a", "b", "k", "overlap"), [
    (TEN, TEN, 10, 1.0),
    (TEN, TEN[:7] + ["x", "y", "z"], 10, 0.7),
    (["145", "21"], ["145", "21"], 10, 1.0),  # same two hits at k = 10: no change
    (["145", "21"], ["21", "145"], 10, 1.0),  # overlap ignores order (moves show it)
    ([], [], 10, 1.0),  # no hits on either side: no change
    (TEN, [], 10, 0.0),
    (TEN, TEN[:3], 10, 0.3),  # hits lost still count against the candidate
    (TEN[:3], TEN, 10, 0.3),
    (TEN, TEN[:5] + ["x"] * 5, 5, 1.0),  # only the first k count
    (["a", "a", "b"], ["a", "b"], 10, 1.0),  # one document's passages, ranked by document
])
def test_overlap_is_over_the_longer_top_k(a: list[str], b: list[str], k: int,
                                         overlap: float) -> None:
    assert overlap_at_k(a, b, k) == pytest.approx(overlap)
    assert overlap_at_k(b, a, k) == pytest.approx(overlap)  # symmetric


def test_a_canary_with_fewer_hits_than_k_passes_when_nothing_changed() -> None:
    """Canaries whose filters leave 2 and 0 hits, identical on both builds: they refused the
    build (mean 0.1) under the gate's default threshold of 0.7."""
    gate = GateConfig(k=10, min_canary_overlap_each=0.9)
    canaries = [Canary(query="heat transfer"), Canary(query="nothing matches")]
    same = [["145", "21"], []]
    figures = canary_figures(same, same, canaries, gate.k)
    assert figures["overlaps"] == [1.0, 1.0] and figures["mean_overlap"] == 1.0
    assert within(gate, figures) == (True, True)
    lost = canary_figures(same, [["145"], []], canaries, gate.k)
    assert lost["min_overlap"] == 0.5 and lost["worst_canary"] == "heat transfer"
    assert within(gate, lost)[0] is False
