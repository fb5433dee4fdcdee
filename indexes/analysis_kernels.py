"""Numba kernels of the compiled analyzer (``indexes.analysis``).

``split_words`` finds the tokens of ``TOKEN_PATTERN`` (a word character, then a maximal run of
word characters and combining marks, two or more code points in all) or of
``WORD_CHARACTER_TOKEN_PATTERN`` (maximal runs of two or more word characters) in UTF-8 text
and gives every distinct word an id in first-occurrence order, in a hash table whose keys are
checked byte for byte (no collision can merge two words).
``count_terms`` turns a part's word ids into term-frequency postings (row, term, tf) in the
order the Python analyzer's ``Counter`` produced them: rows ascending, and within a row its
terms in first-occurrence order. ``to_columns`` groups postings by term (a stable counting
sort: rows stay ascending within a term) and ``bm25_impacts`` evaluates the BM25 formula per
posting with the same float64 operations, in the same order, as ``indexes.bm25.impacts_for``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

FNV_OFFSET = np.uint64(14695981039346656037)
FNV_PRIME = np.uint64(1099511628211)
# split_words's answers besides "done": which table must grow before the next call.
GROW_WORDS, GROW_ARENA = -1, -2


@njit(nogil=True, cache=True, inline="always")
def _code_point(buf, i):  # pragma: no cover - compiled
    """(code point, byte length) of the UTF-8 sequence at ``buf[i]`` (Python wrote it)."""
    b0 = np.int64(buf[i])
    if b0 < 0x80:
        return b0, 1
    if b0 < 0xE0:
        return ((b0 & 0x1F) << 6) | (buf[i + 1] & 0x3F), 2
    if b0 < 0xF0:
        return ((b0 & 0x0F) << 12) | ((buf[i + 1] & 0x3F) << 6) | (buf[i + 2] & 0x3F), 3
    return (((b0 & 0x07) << 18) | ((buf[i + 1] & 0x3F) << 12) | ((buf[i + 2] & 0x3F) << 6)
            | (buf[i + 3] & 0x3F)), 4


HIGH = np.uint64(0xFFFFFFFF00000000)


@njit(nogil=True, cache=True, inline="always")
def _word_id(buf, start, end, h, key, slots, words, arena, state):  # pragma: no cover - compiled
    """The id of the word ``buf[start:end]`` (hash ``h``, first 8 bytes packed in ``key``),
    added to the table if new.

    A slot holds the word's first 8 bytes and the high half of its hash with its id + 1 (0:
    empty). No word holds a zero byte, so for a word of 8 bytes or fewer the packed bytes are
    the word: the slot alone answers, where reading the word's record and then its bytes took
    two more dependent reads (at 200,000 passages the table was 80% of the split's time).
    Longer words compare the rest of their bytes with the arena's; ``words`` (hash, arena
    start, byte length) per word.
    """
    mask = np.uint64(slots.shape[0] - 1)
    slot = h & mask
    tag = h & HIGH
    n = end - start
    while True:
        entry = np.uint64(slots[slot, 1])
        if entry == 0:
            break
        if entry & HIGH == tag and slots[slot, 0] == key:
            w = np.int64(entry & ~HIGH) - 1
            if n <= 8:
                return w
            if words[w, 2] == n:
                s = words[w, 1]
                same = True
                for j in range(8, n):
                    if arena[s + j] != buf[start + j]:
                        same = False
                        break
                if same:
                    return w
        slot = (slot + np.uint64(1)) & mask
    w = state[0]
    used = state[1]
    for j in range(n):
        arena[used + j] = buf[start + j]
    words[w, 0], words[w, 1], words[w, 2] = np.int64(h), used, n
    slots[slot, 0] = key
    slots[slot, 1] = np.int64(tag | np.uint64(w + 1))
    state[0], state[1] = w + 1, used + n
    return w


@njit(nogil=True, cache=True, inline="always")
def _packed(arena, start, n):  # pragma: no cover - compiled
    """The first 8 (or fewer) bytes of ``arena[start:start + n]`` in one int64, byte j at bits
    8j (as ``split_words`` packs a word while it reads it)."""
    key = np.uint64(0)
    for j in range(min(n, 8)):
        key |= np.uint64(arena[start + j]) << np.uint64(8 * j)
    return np.int64(key)


@njit(nogil=True, cache=True)
def rehash(words, arena, n_words, size):  # pragma: no cover - compiled
    """A fresh slot array of ``size`` (a power of two) slots for the first ``n_words``
    words."""
    slots = np.zeros((size, 2), dtype=np.int64)
    mask = np.uint64(size - 1)
    for w in range(n_words):
        h = np.uint64(words[w, 0])
        slot = h & mask
        while slots[slot, 1] != 0:
            slot = (slot + np.uint64(1)) & mask
        slots[slot, 0] = _packed(arena, words[w, 1], words[w, 2])
        slots[slot, 1] = np.int64((h & HIGH) | np.uint64(w + 1))
    return slots


@njit(nogil=True, cache=True)
def split_words(buf, doc_ends, first_doc, is_word, goes_on, slots, words, arena, state,
                out_words, doc_token_ends):  # pragma: no cover - compiled
    """Tokenize documents ``first_doc..`` of ``buf`` (uint8, UTF-8; document d ends at byte
    ``doc_ends[d]``) into ``out_words`` (int32 word ids, document d's ending at
    ``doc_token_ends[d]``), adding new words to the table (``slots`` int64 (size, 2),
    power-of-two open addressing; ``words`` int64 (capacity, 3); their bytes in ``arena``;
    ``state`` int64 [words, arena bytes used, tokens written, documents done]). A token starts
    at a code point ``is_word`` holds and goes on through those ``goes_on`` holds (bool tables
    over all code points; ``goes_on`` holds every word character, so a token is a maximal run
    and the next one starts past a code point outside it).

    A document is started only when the table has room for every word it could add (a word
    takes at least 2 bytes and a separator), so a document is never half done. Returns 0 when
    every document is done, else GROW_WORDS or GROW_ARENA: grow that, then call again from
    document ``state[3]``.
    """
    n_docs = doc_ends.shape[0]
    d = first_doc
    while d < n_docs:
        begin = 0 if d == 0 else doc_ends[d - 1]
        end = doc_ends[d]
        worst = (end - begin) // 3 + 1
        if 2 * (state[0] + worst) > slots.shape[0] or state[0] + worst > words.shape[0]:
            state[3] = d
            return GROW_WORDS
        if state[1] + (end - begin) > arena.shape[0]:
            state[3] = d
            return GROW_ARENA
        t = state[2]
        i = begin
        while i < end:
            cp, size = _code_point(buf, i)
            if not is_word[cp]:
                i += size
                continue
            start, chars, h, key = i, 0, FNV_OFFSET, np.uint64(0)
            while i < end:
                cp, size = _code_point(buf, i)
                if not goes_on[cp]:
                    break
                for j in range(i, i + size):
                    byte = np.uint64(buf[j])
                    h = (h ^ byte) * FNV_PRIME
                    if j - start < 8:
                        key |= byte << np.uint64(8 * (j - start))
                i += size
                chars += 1
            if chars >= 2:
                out_words[t] = _word_id(buf, start, i, h, np.int64(key), slots, words, arena,
                                        state)
                t += 1
        state[2] = t
        doc_token_ends[d] = t
        d += 1
    state[3] = d
    return 0


@njit(nogil=True, cache=True)
def count_terms(words, doc_token_ends, word_term, n_terms, first_row
                ):  # pragma: no cover - compiled
    """Postings (term int32, row int32, tf int32) of rows ``first_row..``, rows ascending and
    each row's terms in first-occurrence order, and each row's length (its tokens with a
    term).

    words int32: the rows' word ids; doc_token_ends int64 (rows,); word_term int32 (words,):
    a word's term id, -1 for a stop word.
    """
    n_rows = doc_token_ends.shape[0]
    terms = np.empty(words.shape[0], dtype=np.int32)
    rows = np.empty(words.shape[0], dtype=np.int32)
    tfs = np.zeros(words.shape[0], dtype=np.int32)
    lengths = np.zeros(n_rows, dtype=np.int32)
    seen_in = np.full(n_terms, -1, dtype=np.int32)  # the last row a term was seen in
    slot_of = np.empty(n_terms, dtype=np.int64)
    m = 0
    begin = 0
    for r in range(n_rows):
        end = doc_token_ends[r]
        length = 0
        for j in range(begin, end):
            t = word_term[words[j]]
            if t < 0:
                continue
            length += 1
            if seen_in[t] != r:
                seen_in[t] = r
                slot_of[t] = m
                terms[m], rows[m], tfs[m] = t, first_row + r, 1
                m += 1
            else:
                tfs[slot_of[t]] += 1
        lengths[r] = length
        begin = end
    return terms[:m].copy(), rows[:m].copy(), tfs[:m].copy(), lengths


@njit(nogil=True, cache=True)
def to_columns(terms, rows, tfs, n_terms):  # pragma: no cover - compiled
    """Postings grouped by term: (indptr int64 (n_terms + 1,), rows int32, tfs int32), a
    stable counting sort, so rows keep their order (ascending) within each term."""
    indptr = np.zeros(n_terms + 1, dtype=np.int64)
    for i in range(terms.shape[0]):
        indptr[terms[i] + 1] += 1
    for t in range(n_terms):
        indptr[t + 1] += indptr[t]
    at = indptr[:-1].copy()
    out_rows = np.empty(rows.shape[0], dtype=np.int32)
    out_tfs = np.empty(rows.shape[0], dtype=np.int32)
    for i in range(terms.shape[0]):
        p = at[terms[i]]
        out_rows[p], out_tfs[p] = rows[i], tfs[i]
        at[terms[i]] = p + 1
    return indptr, out_rows, out_tfs


@njit(nogil=True, cache=True)
def bm25_impacts(indptr, rows, tfs, lengths, idf, avgdl, k1, b, okapi
                 ):  # pragma: no cover - compiled
    """float32 impact per posting: ``impacts_for``'s float64 expression, operation for
    operation (so the same bits), without its per-posting temporaries."""
    out = np.empty(rows.shape[0], dtype=np.float32)
    for t in range(indptr.shape[0] - 1):
        w = idf[t]
        for p in range(indptr[t], indptr[t + 1]):
            tf = np.float64(tfs[p])
            norm = k1 * (1.0 - b + b * np.float64(lengths[rows[p]]) / avgdl)
            numerator = tf * (k1 + 1.0) if okapi else tf
            out[p] = np.float32(w * numerator / (tf + norm))
    return out
