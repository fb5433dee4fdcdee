"""Live updates on the serving side: the delta of write-ahead log records over the base build
(``view``, ``parts``, ``bm25_live``) and the follower that applies them (``tracker``)."""

from retrieval.live.tracker import LogFollower

__all__ = ["LogFollower"]
