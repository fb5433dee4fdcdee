"""Training a ``DistilledEncoder``: a token table regressed onto the teacher's query embeddings.

1. Query-like texts are cut from the corpus: runs of 3-20 consecutive words at seeded random
   places (queries are short; documents are not what the encoder will see).
2. The teacher (MiniLM, ONNX fp32 = torch) embeds them: the targets.
3. Every vocabulary row starts as the teacher's embedding of that token alone ([CLS] t [SEP]),
   scaled by a SIF weight a / (a + p(t)) from the token's frequency in the texts, so frequent
   tokens start light (model2vec's distillation without dimensionality reduction).
4. The rows are trained with SparseAdam to maximise the cosine between the normalized row sum
   and the target; a held-out share of the texts picks the epoch to keep.

Deterministic given the seed: the texts, the split and the batch order come from one numpy
generator, and training runs on one torch thread (a multi-threaded sparse gradient sums in no
fixed order).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Annotated, Any

import numpy as np
from pydantic import Field, model_validator
from pydantic.dataclasses import dataclass

from indexes.distilled_encoder import DistilledEncoder, DistilledInfo, quantize_rows, table_checksum
from indexes.errors import CorpusError
from indexes.onnx_encoder import OnnxEncoder, default_cache_dir

SIF_A = 1e-3
ROWS_FORMAT = 1  # bump when vocabulary_rows changes what it computes


@dataclass(frozen=True)
class DistillSettings:
    """How much to cut and how long to train; the defaults are the measured trade-off.

    Checked when made (pydantic's ``ValidationError``, which the command reports as a bad
    flag): a negative seed, or ``min_words`` past ``max_words``, would otherwise fail in numpy
    once the passages are read and the teacher loaded.
    """

    seed: Annotated[int, Field(ge=0)] = 0
    texts: Annotated[int, Field(ge=1)] = 40_000
    min_words: Annotated[int, Field(ge=1)] = 3
    max_words: Annotated[int, Field(ge=1)] = 20
    held_out: Annotated[float, Field(gt=0, lt=1)] = 0.05
    epochs: Annotated[int, Field(ge=1)] = 12
    batch_size: Annotated[int, Field(ge=1)] = 128
    learning_rate: Annotated[float, Field(gt=0)] = 2e-3

    @model_validator(mode="after")
    def _lengths_in_order(self) -> DistillSettings:
        if self.min_words > self.max_words:
            raise ValueError(f"min_words ({self.min_words}) is past max_words "
                             f"({self.max_words})")
        return self


def query_like_texts(corpus: Sequence[str], settings: DistillSettings,
                     rng: np.random.Generator) -> list[str]:
    """``settings.texts`` word runs cut from random documents at random offsets."""
    words = [text.split() for text in corpus]
    words = [w for w in words if w]
    if not words:
        raise CorpusError("the corpus has no words to cut training texts from: distill an "
                          "index whose passages hold text")
    picks = rng.integers(0, len(words), size=settings.texts)
    lengths = rng.integers(settings.min_words, settings.max_words + 1, size=settings.texts)
    starts = rng.random(settings.texts)
    out = []
    for doc, length, start in zip(picks, lengths, starts, strict=True):
        tokens = words[doc]
        first = int(start * max(1, len(tokens) - length + 1))
        out.append(" ".join(tokens[first:first + length]))
    return out


def vocabulary_rows(teacher: OnnxEncoder, batch: int = 512) -> np.ndarray:
    """(V, d): the teacher's unit embedding of each token alone, between [CLS] and [SEP].

    A pure function of the teacher's weights and precision (~30k short texts, most of a minute
    on 2 cores): kept beside the teacher's exported graph and computed once per machine and
    precision (an INT8 teacher's rows differ from the fp32 one's by up to 0.05).
    """
    cached = (default_cache_dir(teacher.model_path)
              / f"vocabulary-rows-v{ROWS_FORMAT}-{teacher.precision}.npy")
    if cached.is_file():
        return np.load(cached)
    cls_id, sep_id = _special_ids(teacher)
    rows = []
    for start in range(0, teacher.vocab_size, batch):
        ids = [[cls_id, t, sep_id] for t in range(start, min(teacher.vocab_size, start + batch))]
        rows.append(teacher.encode_ids(ids))
    table = np.vstack(rows)
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(f".{os.getpid()}.tmp.npy")
    np.save(partial, table)
    partial.replace(cached)
    return table


def _special_ids(teacher: OnnxEncoder) -> tuple[int, int]:
    ids = teacher.token_ids([""])[0]  # [CLS] [SEP]
    return int(ids[0]), int(ids[-1])


def sif_weights(ids: Sequence[Sequence[int]], vocab_size: int) -> np.ndarray:
    counts = np.bincount(np.fromiter((t for row in ids for t in row), dtype=np.int64),
                         minlength=vocab_size).astype(np.float64)
    share = counts / max(1.0, counts.sum())
    return (SIF_A / (SIF_A + share)).astype(np.float32)


def initial_table(teacher: OnnxEncoder, ids: Sequence[Sequence[int]]) -> np.ndarray:
    rows = vocabulary_rows(teacher) * sif_weights(ids, teacher.vocab_size)[:, None]
    cls_id, sep_id = _special_ids(teacher)
    rows[cls_id] = teacher.encode_ids([[cls_id, sep_id]])[0] * SIF_A * 10
    rows[sep_id] = 0.0
    return rows.astype(np.float32)


def fit_table(init: np.ndarray, ids: Sequence[Sequence[int]], targets: np.ndarray,
              held: np.ndarray, settings: DistillSettings, rng: np.random.Generator,
              log: Callable[[str], None] = print) -> tuple[np.ndarray, list[float]]:
    """Train the rows; returns the table of the best held-out epoch and each epoch's cosine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(settings.seed)
        bag = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(init.copy()), freeze=False,
                                                    mode="sum", sparse=True)
        optimizer = torch.optim.SparseAdam(list(bag.parameters()), lr=settings.learning_rate)
        train = np.flatnonzero(~held)
        best, best_cos, history = init.copy(), _held_cosine(bag, ids, targets, held), []
        log(f"  held-out cosine before training: {best_cos:.4f}")
        for epoch in range(settings.epochs):
            for batch in np.array_split(rng.permutation(train),
                                        max(1, len(train) // settings.batch_size)):
                flat, offsets = _bag_input(ids, batch)
                out = bag(flat, offsets)
                wanted = torch.from_numpy(targets[batch])
                loss = (1 - torch.nn.functional.cosine_similarity(out, wanted)).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            cosine = _held_cosine(bag, ids, targets, held)
            history.append(cosine)
            log(f"  epoch {epoch + 1}: held-out cosine {cosine:.4f}")
            if cosine > best_cos:
                best, best_cos = bag.weight.detach().numpy().copy(), cosine
            elif epoch >= 2:
                break  # past the best epoch: more only fits the training texts
        return best, history
    finally:
        torch.set_num_threads(threads)


def _bag_input(ids: Sequence[Sequence[int]], rows: np.ndarray) -> tuple[Any, Any]:
    import torch

    picked = [ids[r] for r in rows]
    flat = torch.from_numpy(np.fromiter((t for row in picked for t in row), dtype=np.int64))
    offsets = torch.from_numpy(np.cumsum([0] + [len(row) for row in picked[:-1]]))
    return flat, offsets


def _held_cosine(bag: Any, ids: Sequence[Sequence[int]], targets: np.ndarray,
                 held: np.ndarray) -> float:
    import torch

    rows = np.flatnonzero(held)
    with torch.no_grad():
        out = bag(*_bag_input(ids, rows))
        wanted = torch.from_numpy(targets[rows])
        return float(torch.nn.functional.cosine_similarity(out, wanted).mean())


def distill(corpus: Sequence[str], trained_on: str, settings: DistillSettings | None = None,
            teacher: OnnxEncoder | None = None, log: Callable[[str], None] = print
            ) -> DistilledEncoder:
    """Train a distilled query encoder on texts cut from ``corpus`` (see the module doc).

    ``info.quality`` records the held-out cosine to the teacher (of the stored int8 table).
    """
    settings = settings or DistillSettings()
    started = time.perf_counter()
    teacher = teacher or OnnxEncoder(quantized=False, threads=None)
    rng = np.random.default_rng(settings.seed)
    texts = query_like_texts(corpus, settings, rng)
    held = rng.random(len(texts)) < settings.held_out
    if held.all() or not held.any():  # nothing to train on, or nothing to measure it with
        raise CorpusError(f"{len(texts)} query-like texts left {int(held.sum())} held out "
                          f"and {int((~held).sum())} to train on; distilling needs both: "
                          "give it more texts (--texts, or a larger corpus)")
    log(f"  {len(texts):,} query-like texts ({int(held.sum()):,} held out); teacher "
        f"{teacher.encoder_id} embedding them")
    targets = teacher.encode(texts, batch_size=128)
    ids = teacher.token_ids(texts)
    table, history = fit_table(initial_table(teacher, ids), ids, targets, held, settings, rng,
                               log)
    rows, scales = quantize_rows(table)
    info = DistilledInfo(
        model=teacher.model, teacher_id=teacher.encoder_id, dim=table.shape[1],
        vocab_size=table.shape[0], checksum=table_checksum(rows, scales), trained_on=trained_on,
        training={**asdict(settings), "epoch_cosines": [round(c, 5) for c in history],
                  "seconds": round(time.perf_counter() - started, 1)})
    student = DistilledEncoder(rows, scales, info, teacher.model_path)
    held_rows = np.flatnonzero(held)
    cosine = np.einsum("nd,nd->n", student.vectors([ids[r] for r in held_rows]),
                       targets[held_rows])
    info.quality["held_out_cosine"] = round(float(cosine.mean()), 5)
    info.quality["held_out_cosine_p05"] = round(float(np.quantile(cosine, 0.05)), 5)
    return student

