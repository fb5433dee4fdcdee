"""A query the encoder refuses, inside a call shared with other queries: the error names
that query (its position in a batch), and the queries sharing the call are not blamed.

The encoder is the real ONNX query encoder behind a wrapper that refuses one text, as a
remote model's client refuses an input it cannot take.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import pytest
from small_index import QUERIES, index_fixture, query_encoder_fixture  # noqa: F401

from retrieval import Retriever
from retrieval.errors import EncoderMismatchError, InvalidQueryError, RetrievalError
from retrieval.request_path.batching import BatchingConfig, EncodeBatcher

REFUSED = "a query the model refuses"


class RefusingEncoder:
    """The real encoder, refusing every call that holds a text starting with ``REFUSED``; with
    ``most`` set, also every call of more than ``most`` texts (a model server's limit on one
    request)."""

    def __init__(self, inner, most: int | None = None) -> None:
        self.inner, self.most = inner, most
        self.encoder_id, self.model, self.dim = inner.encoder_id, inner.model, inner.dim
        self.calls: list[int] = []

    def encode(self, texts: Sequence[str], *, batch_size: int = 64, progress: bool = False
               ) -> np.ndarray:
        texts = list(texts)
        self.calls.append(len(texts))
        if any(text.startswith(REFUSED) for text in texts):
            raise InvalidQueryError("the model cannot encode this text")
        if self.most is not None and len(texts) > self.most:
            raise InvalidQueryError(f"the model takes at most {self.most} texts a call")
        return self.inner.encode(texts)


@pytest.mark.parametrize("cache", ["none", "memory"])
@pytest.mark.parametrize("deadline_ms", [None, 60_000])
def test_a_refused_query_is_named_by_its_position(index, query_encoder, cache, deadline_ms):
    """With a deadline the call ran in another thread and its error surfaced at query 0's
    wait, labelled "query 0"; without one it named no query at all."""
    batch = [QUERIES[0], QUERIES[1], REFUSED, QUERIES[2]]
    with Retriever.load(index, {"cache": {"backend": cache}},
                        encoder=RefusingEncoder(query_encoder)) as retriever:
        for _ in range(2):  # the second time the cache holds the queries before the refused
            with pytest.raises(InvalidQueryError, match="^query 2 of the batch: the model "
                                                        "cannot encode this text$"):
                retriever.search_batch(batch, k=3, deadline_ms=deadline_ms)


@pytest.mark.parametrize("deadline_ms", [None, 60_000])
def test_texts_refused_only_together_are_encoded_in_smaller_calls(index, query_encoder,
                                                                   deadline_ms):
    limited = RefusingEncoder(query_encoder, most=2)
    config = {"cache": {"backend": "none"}}
    with Retriever.load(index, config, encoder=query_encoder) as plain, \
            Retriever.load(index, config, encoder=limited) as retriever:
        expected = plain.search_batch(QUERIES[:5], k=3)
        limited.calls.clear()
        results = retriever.search_batch(QUERIES[:5], k=3, deadline_ms=deadline_ms)
    assert [r.hits for r in results] == [r.hits for r in expected]
    assert [r.degraded for r in results] == [[]] * 5
    assert limited.calls == [5, 2, 3, 1, 2]  # halves until the model takes each call


class HeldRefusingEncoder(RefusingEncoder):
    """Its first call waits for ``release``, so the searches submitted meanwhile queue up
    and form the batcher's next call together."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.entered, self.release = threading.Event(), threading.Event()

    def encode(self, texts: Sequence[str], *, batch_size: int = 64, progress: bool = False
               ) -> np.ndarray:
        if not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(30), "the test never released the encoder"
        return super().encode(texts, batch_size=batch_size, progress=progress)


def test_a_refused_search_does_not_fail_the_searches_batched_with_it(query_encoder):
    """Concurrent searches share the batcher's encoder calls: one search's refused text
    failed every search in its call with that search's error."""
    held = HeldRefusingEncoder(query_encoder)
    batcher = EncodeBatcher(held, BatchingConfig(enabled=True, workers=1))
    try:
        first = batcher.submit(QUERIES[0])
        assert held.entered.wait(30)
        queued = [batcher.submit(text) for text in (QUERIES[1], REFUSED, QUERIES[2])]
        held.release.set()
        assert first.result(30)[0].shape == (held.dim,)
        good, refused, after = (future.exception(30) for future in queued)
        assert good is None and after is None
        assert isinstance(refused, InvalidQueryError)
        assert str(refused) == "the model cannot encode this text"
        expected = query_encoder.encode([QUERIES[1], QUERIES[2]])
        vectors = [queued[0].result()[0], queued[2].result()[0]]
        np.testing.assert_allclose(vectors, expected, atol=1e-5)
        assert held.calls == [1, 3, 1, 2, 1, 1]  # the call of 3, halving to the refused, the rest
    finally:
        batcher.close()


@pytest.mark.parametrize("refused", [set(range(64)), {0, 5, 6, 31, 32, 63}, {17}],
                         ids=["all", "some", "one"])
def test_refused_texts_cost_the_batcher_at_most_two_calls_a_text(query_encoder, refused):
    """The batcher halved its call down to the first refused text, then encoded every text
    after it anew: a batch of 64 texts all refused took 328 encoder calls, n log n."""
    texts = [f"{REFUSED} {i}" if i in refused else f"{QUERIES[i % len(QUERIES)]} {i}"
             for i in range(64)]
    held = HeldRefusingEncoder(query_encoder)
    batcher = EncodeBatcher(held, BatchingConfig(enabled=True, workers=1, max_batch=64))
    try:
        first = batcher.submit(QUERIES[0])
        assert held.entered.wait(30)
        futures = [batcher.submit(text) for text in texts]  # one call of 64 once released
        held.release.set()
        assert first.result(30)[0].shape == (held.dim,)
        errors = [future.exception(30) for future in futures]
    finally:
        batcher.close()
    batch_calls = held.calls[1:]
    assert batch_calls[0] == len(texts)  # the whole batch, in one call
    assert len(batch_calls) <= 2 * len(texts) - 1
    if len(refused) == len(texts):
        assert len(batch_calls) == 2 * len(texts) - 1  # each node of the halving tree, once
    assert [i for i, error in enumerate(errors) if error is not None] == sorted(refused)
    assert {str(errors[i]) for i in refused} == {"the model cannot encode this text"}
    assert all(isinstance(errors[i], InvalidQueryError) for i in refused)
    good = [i for i in range(len(texts)) if i not in refused]
    if good:
        expected = query_encoder.encode([texts[i] for i in good])
        np.testing.assert_allclose([futures[i].result()[0] for i in good], expected,
                                   atol=1e-5)


class ShortEncoder(HeldRefusingEncoder):
    """Held like its parent, then dropping the last row of every call of more than one text
    (a remote model's client that loses an item)."""

    def encode(self, texts: Sequence[str], *, batch_size: int = 64, progress: bool = False
               ) -> np.ndarray:
        vectors = super().encode(texts, batch_size=batch_size, progress=progress)
        return vectors[:-1] if len(vectors) > 1 else vectors


def test_an_encoder_returning_too_few_rows_fails_its_batch_with_a_typed_error(query_encoder):
    """A call answered with fewer rows than texts left the last jobs with a StopIteration, or
    before that killed the batcher's worker so their searches waited out their deadlines."""
    short = ShortEncoder(query_encoder)
    batcher = EncodeBatcher(short, BatchingConfig(enabled=True, workers=1, max_batch=8))
    try:
        first = batcher.submit(QUERIES[0])
        assert short.entered.wait(30)
        futures = [batcher.submit(text) for text in QUERIES[1:5]]  # one call of 4 once released
        short.release.set()
        assert first.result(30)[0].shape == (short.dim,)
        errors = [future.exception(30) for future in futures]
        alone = batcher.submit(QUERIES[0]).result(30)  # the batcher still serves
    finally:
        batcher.close()
    assert short.calls[1] == 4
    for error in errors:
        assert isinstance(error, EncoderMismatchError), error
        assert str(error) == ("the query encoder returned 3 vectors for 4 texts: an encoder's "
                              "encode(texts) must return one row per text, in order")
    np.testing.assert_allclose(alone[0], query_encoder.encode([QUERIES[0]])[0], atol=1e-5)


class RowDroppingEncoder(RefusingEncoder):
    """Refusing like its parent, and dropping the last row of every call of more than one
    text."""

    def encode(self, texts: Sequence[str], *, batch_size: int = 64, progress: bool = False
               ) -> np.ndarray:
        vectors = super().encode(texts, batch_size=batch_size, progress=progress)
        return vectors[:-1] if len(vectors) > 1 else vectors


def test_a_batch_search_with_too_few_rows_back_fails_with_a_typed_error(index, query_encoder):
    """search_batch's own encoder call was not checked: with a text refused, the rows came
    back one short and shifted, one query got another's vector and the wrong one was named
    refused."""
    dropping = RowDroppingEncoder(query_encoder)
    with Retriever.load(index, {"cache": {"backend": "none"}}, encoder=dropping) as retriever:
        for batch in ([*QUERIES[:3], REFUSED, QUERIES[3]], QUERIES[:4]):
            with pytest.raises(EncoderMismatchError, match="returned 3 vectors for 4 texts|"
                                                           "returned 1 vectors for 2 texts"):
                retriever.search_batch(batch, k=3)


class NanEncoder(RefusingEncoder):
    """A broken model: NaN for every text."""

    def encode(self, texts: Sequence[str], *, batch_size: int = 64, progress: bool = False
               ) -> np.ndarray:
        vectors = super().encode(texts, batch_size=batch_size, progress=progress)
        return np.full_like(vectors, np.nan)


def test_the_batchers_calls_are_checked_for_nan_as_a_lone_searchs_are(query_encoder):
    """A lone search's encode refused NaN, naming the encoder; concurrent searches, whose
    queries the batcher encodes, took the NaN vectors and ranked every document alike."""
    batcher = EncodeBatcher(NanEncoder(query_encoder), BatchingConfig(enabled=True, workers=1))
    try:
        error = batcher.submit(QUERIES[0]).exception(30)
    finally:
        batcher.close()
    assert isinstance(error, RetrievalError)
    assert "gave NaN or infinity for these queries" in str(error)
