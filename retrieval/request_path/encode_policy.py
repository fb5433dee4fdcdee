"""How the retriever spends its cores on the query encoder: dynamic batching, stages in
parallel, and the thread count of a single encode under load."""

from __future__ import annotations

import threading

from indexes.cpu import usable_cores
from indexes.encoders import Encoder, parse_encoder_id
from retrieval.config import RetrieverConfig
from retrieval.errors import OverloadedError, RetrieverClosedError


class InFlight:
    """How many searches are running now; ``with in_flight:`` around each one.

    With a ``limit``, entering while ``limit`` searches run raises ``OverloadedError`` at once
    (load shedding: a bounded wait beats an unbounded queue); ``shed`` counts the refusals.
    """

    def __init__(self, limit: int | None = None) -> None:
        self.count = 0
        self.limit = limit
        self.shed = 0
        self.closed = False
        self._lock = threading.Lock()

    def close(self) -> None:
        """Refuse every later search (``RetrieverClosedError``); those running finish."""
        with self._lock:
            self.closed = True

    def __enter__(self) -> InFlight:
        with self._lock:
            if self.closed:
                raise RetrieverClosedError()
            if self.limit is not None and self.count >= self.limit:
                self.shed += 1
                raise OverloadedError(
                    f"{self.count} searches already in flight (max_in_flight={self.limit}); "
                    "retry after a short back-off, or raise max_in_flight if the machine has "
                    "headroom")
            self.count += 1
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.count -= 1


def batching_on(encoder: Encoder, config: RetrieverConfig) -> bool:
    """Explicit setting, else on only for torch encoders (measured: see BatchingConfig)."""
    if config.batching.enabled is not None:
        return config.batching.enabled
    parts = parse_encoder_id(encoder.encoder_id)
    return parts is not None and parts[1] == "torch"


class StageOverlap:
    """Whether a search encodes its query in the worker pool while filter + BM25 run.

    ``parallel_stages`` True or False decides. Auto (None) overlaps when there is a core to
    spare: always for an encoder that runs a lone query on fewer threads than there are
    cores, and otherwise only while other searches are in flight. An encoder spreading one
    query over every core gains nothing from the overlap, because BM25 then competes with it
    (measurements: benchmarks/README.md, "Parallel stages"); under load the pool's one worker
    per core queues encodes fairly instead of running one model per thread.
    """

    def __init__(self, encoder: Encoder, config: RetrieverConfig) -> None:
        self.setting = config.parallel_stages
        self.spare_core = int(getattr(encoder, "threads", 1)) < usable_cores()

    def now(self, in_flight: int) -> bool:
        if self.setting is not None:
            return self.setting
        return self.spare_core or in_flight > 1

    def describe(self) -> str:
        if self.setting is not None:
            return "always" if self.setting else "never"
        return "always" if self.spare_core else "under load"
