"""Lists of strings packed into one UTF-8 buffer, for compiled work over large keyword lists.

An access-control filter names thousands to 100,000 ids. Per-value Python work on them (a dict
lookup, a hash, a comparison in ``sorted``) costs 50-500 ns a value, most of it pointer chasing
through scattered string objects; packed, the values are one contiguous byte buffer and compiled
loops hash, look up and sort them at a few ns a byte.

``pack`` joins the values with NUL and encodes them (UTF-8, lone surrogates passed through, so
every str packs and byte order is code point order, as Python compares strings). A value that
holds NUL itself cannot be told apart from the separator: ``pack`` returns None and callers take
their per-value path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from numba import njit

# 64-bit mixing constants (splitmix64 / murmur3's finalizer): any fixed odd multipliers would
# do, equality is always checked on the bytes.
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_SEED = np.uint64(0x9E3779B97F4A7C15)


class Packed(NamedTuple):
    """Value i is ``buf[starts[i] : starts[i + 1] - 1]`` (uint8 buf, int64 starts (n + 1,))."""

    buf: np.ndarray
    starts: np.ndarray

    def __len__(self) -> int:  # type: ignore[override]
        return int(self.starts.shape[0]) - 1


def pack(values: Sequence[str]) -> Packed | None:
    """``values`` packed, or None when a value holds NUL. Raises TypeError for a non-str value
    (``str.join`` checks each item's type in the same pass that copies it)."""
    return pack_joined("\0".join(values), len(values))


def pack_joined(joined: str, n: int) -> Packed | None:
    """``pack`` of the ``n`` values whose NUL join is ``joined`` (None: a value holds NUL)."""
    buf = np.frombuffer(joined.encode("utf-8", "surrogatepass"), dtype=np.uint8)
    separators = np.flatnonzero(buf == 0)
    if separators.shape[0] != max(n - 1, 0):
        return None
    starts = np.empty(n + 1, dtype=np.int64)
    starts[0] = 0
    starts[1:n] = separators + 1
    starts[n] = buf.shape[0] + 1
    return Packed(buf, starts)


@njit(nogil=True, cache=True)
def _gather(buf, starts, order):  # pragma: no cover - compiled
    size = 0
    for i in order:
        size += starts[i + 1] - starts[i]
    out = np.zeros(max(size - 1, 0), dtype=np.uint8)  # NUL separators stay 0
    at = 0
    for i in order:  # a byte loop: a slice assignment per value costs ~100 ns in numba
        for k in range(starts[i], starts[i + 1] - 1):
            out[at] = buf[k]
            at += 1
        at += 1
    return out


def joined_in_order(packed: Packed, order: np.ndarray) -> str:
    """``"\\0".join(values[i] for i in order)`` from the packed bytes: a copy and a decode of
    contiguous memory, not a pass over scattered string objects (~10x at 100,000 values)."""
    return _gather(packed.buf, packed.starts, order).tobytes().decode("utf-8", "surrogatepass")


@njit(nogil=True, cache=True, inline="always")
def _word(buf, i):  # pragma: no cover - compiled
    """The 8 bytes at ``buf[i]`` as a little-endian integer (one unaligned load, compiled)."""
    return (np.uint64(buf[i]) | np.uint64(buf[i + 1]) << np.uint64(8)
            | np.uint64(buf[i + 2]) << np.uint64(16) | np.uint64(buf[i + 3]) << np.uint64(24)
            | np.uint64(buf[i + 4]) << np.uint64(32) | np.uint64(buf[i + 5]) << np.uint64(40)
            | np.uint64(buf[i + 6]) << np.uint64(48) | np.uint64(buf[i + 7]) << np.uint64(56))


@njit(nogil=True, cache=True, inline="always")
def _hash(buf, start, stop):  # pragma: no cover - compiled
    """64-bit hash of ``buf[start:stop]``, a word at a time."""
    h = _SEED ^ np.uint64(stop - start)
    i = start
    while i + 8 <= stop:
        h = (h ^ _word(buf, i)) * _M1
        h ^= h >> np.uint64(31)
        i += 8
    if i < stop:
        if stop - start >= 8:  # the last 8 bytes, shifted past those already hashed
            tail = _word(buf, stop - 8) >> np.uint64(8 * (8 - (stop - i)))
        else:
            tail = np.uint64(0)
            for k in range(stop - i):
                tail |= np.uint64(buf[i + k]) << np.uint64(8 * k)
        h = (h ^ tail) * _M1
    h ^= h >> np.uint64(30)
    h *= _M2
    return h ^ (h >> np.uint64(31))


@njit(nogil=True, cache=True, inline="always")
def _same(a_buf, a_start, a_stop, b_buf, b_start, b_stop):  # pragma: no cover - compiled
    n = a_stop - a_start
    if n != b_stop - b_start:
        return False
    k = 0
    while k + 8 <= n:
        if _word(a_buf, a_start + k) != _word(b_buf, b_start + k):
            return False
        k += 8
    while k < n:
        if a_buf[a_start + k] != b_buf[b_start + k]:
            return False
        k += 1
    return True


_LOW7 = np.uint64(0x7F7F7F7F7F7F7F7F)
_HIGH_BITS = np.uint64(0x8080808080808080)
_ONES = np.uint64(0x0101010101010101)


@njit(nogil=True, cache=True, inline="always")
def _zero_bytes(word):  # pragma: no cover - compiled
    """How many of the 8 bytes of ``word`` are 0: a byte's high bit is set in ``nonzero`` iff
    the byte is not 0 (no carry crosses bytes), and the multiply sums those bits."""
    nonzero = (((word & _LOW7) + _LOW7) | word) & _HIGH_BITS
    return 8 - np.int64(((nonzero >> np.uint64(7)) * _ONES) >> np.uint64(56))


@njit(nogil=True, cache=True, inline="always")
def _mix(h):  # pragma: no cover - compiled
    h ^= h >> np.uint64(30)
    h *= _M2
    return h ^ (h >> np.uint64(31))


@njit(nogil=True, cache=True)
def _digest(buf):  # pragma: no cover - compiled
    """(64-bit hash, number of 0 bytes) of ``buf`` in one pass: four lanes a word each, whose
    multiplies do not wait on each other."""
    n = buf.shape[0]
    h0, h1, h2, h3 = _SEED, _SEED ^ _M1, _SEED ^ _M2, _SEED ^ _LOW7
    zeros = 0
    i = 0
    while i + 32 <= n:
        w0, w1, w2, w3 = _word(buf, i), _word(buf, i + 8), _word(buf, i + 16), _word(buf, i + 24)
        h0 = (h0 ^ w0) * _M1
        h1 = (h1 ^ w1) * _M1
        h2 = (h2 ^ w2) * _M1
        h3 = (h3 ^ w3) * _M1
        h0 ^= h0 >> np.uint64(32)
        h1 ^= h1 >> np.uint64(32)
        h2 ^= h2 >> np.uint64(32)
        h3 ^= h3 >> np.uint64(32)
        zeros += _zero_bytes(w0) + _zero_bytes(w1) + _zero_bytes(w2) + _zero_bytes(w3)
        i += 32
    while i < n:
        h0 = (h0 ^ np.uint64(buf[i])) * _M1
        h0 ^= h0 >> np.uint64(32)
        zeros += buf[i] == 0
        i += 1
    h = _mix(h0 ^ _mix(h1 ^ _mix(h2 ^ _mix(h3 ^ np.uint64(n)))))
    return h, zeros


def digest(text: str) -> tuple[int, int]:
    """(a 64-bit hash of ``text``'s UTF-8 bytes, its number of NULs), one compiled pass: ~4x
    ``hash(text)`` on long strings, whose SipHash is one dependency chain."""
    h, zeros = _digest(np.frombuffer(text.encode("utf-8", "surrogatepass"), dtype=np.uint8))
    return int(h), int(zeros)


# A slot is one uint64: the value's hash's high 32 bits, then its id + 1 (0: an empty slot).
_HIGH = np.uint64(0xFFFFFFFF00000000)
_LOW = np.uint64(0xFFFFFFFF)


@njit(nogil=True, cache=True)
def _build_table(buf, starts, capacity):  # pragma: no cover - compiled
    """Open addressing over ``capacity`` slots (a power of two). Values are distinct (an
    index's sorted keyword values), so inserting never checks for equals."""
    slots = np.zeros(capacity, dtype=np.uint64)
    mask = capacity - 1
    for i in range(starts.shape[0] - 1):
        h = _hash(buf, starts[i], starts[i + 1] - 1)
        p = np.int64(h & np.uint64(mask))
        while slots[p] != 0:
            p = (p + 1) & mask
        slots[p] = (h & _HIGH) | np.uint64(i + 1)
    return slots


@njit(nogil=True, cache=True)
def _find(slots, buf, starts, q_buf, q_starts, high):  # pragma: no cover - compiled
    """int64 (m,): each query value's id in the table, -1 when absent.

    Two passes (hash and probe, then check the bytes of each candidate) rather than one: each
    loop is short and its iterations independent, so the CPU keeps many cache misses in flight
    (one fused loop measured 1.5x slower). A candidate whose bytes differ (its 32 hash bits
    collided) is followed by a full probe: exactness never rests on the hash. ``high``: the
    hash bits slots are compared on (_HIGH; tests pass 0 to make every slot a candidate).
    """
    m = q_starts.shape[0] - 1
    mask = slots.shape[0] - 1
    hashes = np.empty(m, dtype=np.uint64)
    out = np.full(m, -1, dtype=np.int64)
    for j in range(m):
        h = _hash(q_buf, q_starts[j], q_starts[j + 1] - 1)
        hashes[j] = h
        p = np.int64(h & np.uint64(mask))
        while slots[p] != 0:
            if (slots[p] & high) == (h & high):
                out[j] = np.int64(slots[p] & _LOW) - 1
                break
            p = (p + 1) & mask
    for j in range(m):
        i = out[j]
        a, b = q_starts[j], q_starts[j + 1] - 1
        if i >= 0 and not _same(buf, starts[i], starts[i + 1] - 1, q_buf, a, b):
            out[j] = _probe_all(slots, buf, starts, q_buf, a, b, hashes[j], high)
    return out


@njit(nogil=True, cache=True)
def _probe_all(slots, buf, starts, q_buf, a, b, h, high):  # pragma: no cover - compiled
    """The id of ``q_buf[a:b]`` checking the bytes of every slot whose hash bits match."""
    mask = slots.shape[0] - 1
    p = np.int64(h & np.uint64(mask))
    while slots[p] != 0:
        i = np.int64(slots[p] & _LOW) - 1
        if (slots[p] & high) == (h & high) and \
                _same(buf, starts[i], starts[i + 1] - 1, q_buf, a, b):
            return i
        p = (p + 1) & mask
    return -1


class StringTable:
    """Ids of distinct strings (their positions in ``values``), looked up a packed list at a
    time: a hash, a probe and a byte comparison per value in compiled loops, ~15x a loop of
    dict lookups over 200,000 values (whose scattered keys miss the caches)."""

    def __init__(self, values: Sequence[str]) -> None:
        packed = pack(values)
        if packed is None:
            raise ValueError("a value holds NUL; look such values up one at a time")
        self.packed = packed
        capacity = 1 << max(3, (2 * len(values)).bit_length())  # at most half full
        self._slots = _build_table(packed.buf, packed.starts, capacity)

    def ids(self, queries: Packed) -> np.ndarray:
        """int64 (len(queries),): each value's id, -1 for values not in the table."""
        return _find(self._slots, self.packed.buf, self.packed.starts, queries.buf,
                     queries.starts, _HIGH)

    @property
    def nbytes(self) -> int:
        return int(self._slots.nbytes + self.packed.buf.nbytes + self.packed.starts.nbytes)


@njit(inline="always")
def _compare(buf, starts, x, y, skip):  # pragma: no cover - compiled
    """-1 / 0 / 1: value x against value y by bytes (code points), their first ``skip`` bytes
    known equal."""
    a, a_end = starts[x] + skip, starts[x + 1] - 1
    b, b_end = starts[y] + skip, starts[y + 1] - 1
    while a < a_end and b < b_end:
        if buf[a] != buf[b]:
            return -1 if buf[a] < buf[b] else 1
        a += 1
        b += 1
    if a < a_end:
        return 1
    return -1 if b < b_end else 0


@njit(nogil=True, cache=True)
def _sort_run(order, lo, hi, buf, starts, skip, scratch):  # pragma: no cover - compiled
    """Merge sort of order[lo:hi] by full comparison (stable; ties are equal values)."""
    width = 1
    n = hi - lo
    while width < n:
        for left in range(lo, hi, 2 * width):
            mid, right = min(left + width, hi), min(left + 2 * width, hi)
            i, j, k = left, mid, left
            while i < mid and j < right:
                if _compare(buf, starts, order[j], order[i], skip) < 0:
                    scratch[k] = order[j]
                    j += 1
                else:
                    scratch[k] = order[i]
                    i += 1
                k += 1
            while i < mid:
                scratch[k] = order[i]
                i += 1
                k += 1
            while j < right:
                scratch[k] = order[j]
                j += 1
                k += 1
        order[lo:hi] = scratch[lo:hi]
        width *= 2


@njit(nogil=True, cache=True)
def _radix_sort(keys):  # pragma: no cover - compiled
    """(sorted keys, stable argsort) of uint64 keys: LSD radix on bytes, keys moved with their
    positions so every pass reads sequentially; bytes all keys share are skipped (2.5x
    numba's argsort at 10,000 keys)."""
    n = keys.shape[0]
    order, spare_order = np.arange(n), np.empty(n, dtype=np.int64)
    keys, spare_keys = keys.copy(), np.empty(n, dtype=np.uint64)
    counts = np.empty(256, dtype=np.int64)
    for shift in range(0, 64, 8):
        digit_shift = np.uint64(shift)
        counts[:] = 0
        for i in range(n):
            counts[(keys[i] >> digit_shift) & np.uint64(255)] += 1
        if counts.max() == n:
            continue
        total = 0
        for d in range(256):
            count = counts[d]
            counts[d] = total
            total += count
        for i in range(n):
            d = (keys[i] >> digit_shift) & np.uint64(255)
            spare_keys[counts[d]] = keys[i]
            spare_order[counts[d]] = order[i]
            counts[d] += 1
        keys, spare_keys = spare_keys, keys
        order, spare_order = spare_order, order
    return keys, order


@njit(nogil=True, cache=True)
def _distinct_order(buf, starts):  # pragma: no cover - compiled
    """Positions of the distinct values in ascending order (of each run of equal values, the
    first). Sorts by the 8 bytes that follow the values' common prefix as one integer, then
    compares bytes only where those 8 bytes tie."""
    n = starts.shape[0] - 1
    common = starts[1] - 1 - starts[0]
    for i in range(1, n):
        a, b, k = starts[0], starts[i], 0
        limit = min(common, starts[i + 1] - 1 - b)
        while k < limit and buf[a + k] == buf[b + k]:
            k += 1
        common = k
    keys = np.empty(n, dtype=np.uint64)
    for i in range(n):
        key = np.uint64(0)
        start, stop = starts[i] + common, starts[i + 1] - 1
        for k in range(8):  # big-endian: integer order is byte order; a shorter value pads 0
            byte = np.uint64(buf[start + k]) if start + k < stop else np.uint64(0)
            key = (key << np.uint64(8)) | byte
        keys[i] = key
    keys, order = _radix_sort(keys)
    scratch = np.empty(n, dtype=np.int64)
    lo = 0
    while lo < n:
        hi = lo + 1
        while hi < n and keys[hi] == keys[lo]:
            hi += 1
        if hi - lo > 1:
            _sort_run(order, lo, hi, buf, starts, common + 8, scratch)
        lo = hi
    keep = np.empty(n, dtype=np.int64)
    kept = 0
    for i in range(n):  # different keys: different values, no bytes read
        if i == 0 or keys[i] != keys[i - 1] or \
                _compare(buf, starts, order[i], keep[kept - 1], common) != 0:
            keep[kept] = order[i]
            kept += 1
    return keep[:kept]


def distinct_order(packed: Packed) -> np.ndarray:
    """int64 positions of the distinct values of ``packed`` in ascending (code point) order;
    of equal values, the first. ``[values[i] for i in distinct_order(pack(values))]`` equals
    ``sorted(set(values))`` for a list of str."""
    if len(packed) == 0:
        return np.empty(0, dtype=np.int64)
    return _distinct_order(packed.buf, packed.starts)


def warm(table: StringTable) -> None:
    """Load the lookup, sort and gather kernels' machine code (numba loads it on a kernel's
    first call: tens of ms) with a table, not on the first large IN list."""
    few = pack(["b", "a", "b"])
    assert few is not None
    digest("a\0b")
    table.ids(few)
    joined_in_order(few, distinct_order(few))

