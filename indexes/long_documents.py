"""Documents against the encoder's window: measured in every build, split into passages on
request (``BuildConfig.passages``).

``window_report`` counts the documents longer than the window the encoder reads (their vector
sees only the beginning; BM25 still indexes all of them) and is written to the manifest and
the build report. ``split_documents`` turns documents into passage rows that inherit their
parent's id, title and metadata, plus the ``PassageMap`` of parents, positions and offsets.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from indexes.docstore import Document
from indexes.passages import (
    SPECIAL_TOKENS,
    PassageConfig,
    PassageInfo,
    PassageMap,
    TokenCounter,
    check_config,
    passage_budget,
    split_text,
)

log = logging.getLogger(__name__)


class WindowReport(BaseModel):
    """Documents longer than the encoder's window (tokens, special tokens included)."""

    model_config = ConfigDict(extra="forbid")

    window: int
    documents: int
    over_window: int
    share: float
    longest_tokens: int
    longest_id: str
    rows_over_window: int  # what the encoder truncates: documents, or passages when split
    split: bool = False  # the build split documents into passages

    def describe(self) -> str:
        line = (f"{self.over_window} of {self.documents} documents ({self.share:.1%}) are "
                f"longer than the encoder's {self.window}-token window (longest: "
                f"{self.longest_id!r}, {self.longest_tokens} tokens)")
        if self.over_window and not self.split:
            line += ("; their vectors see only the first tokens (BM25 indexes all of them): "
                     "build with passages (--passages) to search all of their text")
        elif self.over_window:
            line += f"; after splitting, {self.rows_over_window} passages exceed the window"
            if self.rows_over_window:  # the part of a title past the budget still counts
                line += " (each is embedded with its document's whole title)"
        return line


def token_counter_for(encoder: Any) -> TokenCounter | None:
    """The encoder's own tokenizer, when it names its model directory (both of ours do)."""
    model_path = getattr(encoder, "model_path", None)
    if model_path is None or not (Path(model_path) / "tokenizer.json").is_file():
        return None
    return TokenCounter.for_model(Path(model_path))


def _report(ids: Sequence[str], doc_tokens: np.ndarray, window: int, rows_over: int,
            split: bool = False) -> WindowReport:
    longest = int(np.argmax(doc_tokens)) if len(doc_tokens) else 0
    over = int(np.count_nonzero(doc_tokens > window))
    return WindowReport(window=window, documents=len(ids), over_window=over,
                        share=round(over / max(len(ids), 1), 6),
                        longest_tokens=int(doc_tokens[longest]) if len(ids) else 0,
                        longest_id=ids[longest] if len(ids) else "", rows_over_window=rows_over,
                        split=split)


def window_report(documents: Sequence[Document], counter: TokenCounter) -> WindowReport:
    """Count the documents (title + text, as embedded) longer than the encoder's window."""
    tokens = counter.count([d.content for d in documents])
    over = int(np.count_nonzero(tokens > counter.window))
    return _report([d.id for d in documents], tokens, counter.window, over)


def split_documents(
    documents: Sequence[Document], counter: TokenCounter, config: PassageConfig,
) -> tuple[list[Document], PassageMap, PassageInfo, WindowReport]:
    """Passage rows (id, title and metadata of the parent; ``text`` = the passage), the map
    from row to parent, position and offsets, what the manifest records, and the window report.
    """
    check_config(config, counter.window)
    title_tokens = [s.size for s in counter.starts([d.title for d in documents])]
    text_starts = counter.starts([d.text for d in documents])
    rows: list[Document] = []
    parent, position, start, end, row_tokens = [], [], [], [], []
    for ordinal, (doc, starts, title) in enumerate(zip(documents, text_starts, title_tokens,
                                                       strict=True)):
        spans = split_text(doc.text, starts, passage_budget(config, title),
                           config.overlap_tokens)
        for i, span in enumerate(spans):
            rows.append(Document(id=doc.id, text=doc.text[span.start:span.end], title=doc.title,
                                 metadata=doc.metadata))
            parent.append(ordinal)
            position.append(i)
            start.append(span.start)
            end.append(span.end)
            row_tokens.append(span.tokens + title + SPECIAL_TOKENS)
    passages = PassageMap(np.array(parent, dtype=np.int32), np.array(position, dtype=np.int32),
                          np.array(start, dtype=np.int64), np.array(end, dtype=np.int64))
    per_doc = np.bincount(passages.parent, minlength=len(documents))
    info = PassageInfo(max_tokens=config.max_tokens, overlap_tokens=config.overlap_tokens,
                       n_documents=len(documents), n_passages=len(rows),
                       max_per_document=int(per_doc.max()))
    doc_tokens = np.array([s.size for s in text_starts], dtype=np.int64) + np.array(
        title_tokens, dtype=np.int64) + SPECIAL_TOKENS
    rows_over = int(np.count_nonzero(np.array(row_tokens) > counter.window))
    return rows, passages, info, _report([d.id for d in documents], doc_tokens, counter.window,
                                         rows_over, split=True)
