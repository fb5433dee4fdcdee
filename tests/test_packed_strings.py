"""Packed string kernels (sort, lookup) and the large-IN paths built on them, against the plain
Python they replace: ``sorted(set())``, dict lookups, tuple equality, ``json.dumps``."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from indexes.metadata import MetadataIndex, keyword_value
from indexes.packed_strings import (
    _HIGH,
    StringTable,
    _find,
    digest,
    distinct_order,
    joined_in_order,
    pack,
)
from retrieval.config import Limits
from retrieval.filters import In, canonical, evaluate, parse_filter
from retrieval.filters.nodes import PACKED_FROM, one_of, one_of_strings
from retrieval.filters.spec_key import spec_key
from retrieval.request_path.validate import FilterMemo

# Characters whose UTF-8 forms have 1 to 4 bytes, lone surrogates, and the bytes JSON escapes.
ALPHABET = ["a", "b", "z", "A", " ", "~", "\x7f", "\n", '"', "\\", "é", "\u4e2d", "\U0001f600",
            "\ud800", "\udfff"]


def random_strings(rng: random.Random, n: int) -> list[str]:
    """Values sharing a random prefix (longer than the 8 bytes the sort keys on, at times),
    with duplicates and empty strings."""
    prefix = "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(0, 20)))
    letters = ALPHABET[: rng.randrange(1, len(ALPHABET) + 1)]
    values = [prefix + "".join(rng.choice(letters) for _ in range(rng.randrange(0, 14)))
              for _ in range(n)]
    values += rng.sample(values, min(len(values), rng.randrange(0, 5)))
    rng.shuffle(values)
    return values


def test_distinct_order_equals_sorted_set() -> None:
    rng = random.Random(1)
    for _ in range(2000):
        values = random_strings(rng, rng.randrange(0, 80))
        packed = pack(values)
        assert packed is not None and len(packed) == len(values)
        order = distinct_order(packed)
        assert [values[i] for i in order] == sorted(set(values))
        assert joined_in_order(packed, order) == "\0".join(sorted(set(values)))


def test_string_table_ids_equal_dict_lookups() -> None:
    rng = random.Random(2)
    for _ in range(300):
        values = random_strings(rng, rng.randrange(1, 80))
        universe = sorted(set(values[: len(values) // 2 + 1]))
        table = StringTable(universe)
        queries = pack(values)
        assert queries is not None
        position = {v: i for i, v in enumerate(universe)}
        expected = [position.get(v, -1) for v in values]
        assert table.ids(queries).tolist() == expected
        # Every slot a candidate (as if all hashes collided): the bytes still decide.
        ids = _find(table._slots, table.packed.buf, table.packed.starts, queries.buf,
                    queries.starts, np.uint64(0))
        assert ids.tolist() == expected
        assert _HIGH != 0


def test_digest_counts_nul_bytes_and_hashes_the_bytes() -> None:
    rng = random.Random(7)
    for _ in range(500):
        text = "".join(rng.choice(ALPHABET + ["\0"]) for _ in range(rng.randrange(0, 120)))
        hashed, nuls = digest(text)
        assert nuls == text.encode("utf-8", "surrogatepass").count(b"\0")
        assert digest(str(text)) == (hashed, nuls)
    assert digest("a\0b") != digest("a\0c")


def test_values_holding_nul_are_not_packed() -> None:
    assert pack(["a\0", "b"]) is None
    assert pack(["a", "b"]) is not None
    with pytest.raises(ValueError, match="NUL"):
        StringTable(["a\0b", "c"])
    with pytest.raises(TypeError):
        pack(["a", 1])  # type: ignore[list-item]


def test_spec_keys_of_string_lists_are_exact() -> None:
    assert spec_key({"f": ["a\0", "b"]}) != spec_key({"f": ["a", "\0b"]})  # same NUL join
    assert spec_key({"f": ["a", "b"]}) == spec_key({"f": json.loads('["a", "b"]')})
    assert spec_key({"f": ["a", "b"]}) != spec_key({"f": ["b", "a"]})
    assert spec_key({"f": []}) != spec_key({"f": [""]})
    assert spec_key({"f": ["a", True]}) != spec_key({"f": ["a", "true"]})


class Renamed(str):
    """A str whose str() is another string (a ``class C(str, Enum)`` member's is its name):
    the parser keys by its own characters, as the build indexes it (``keyword_value``)."""

    def __str__(self) -> str:
        return "renamed-" + str.__str__(self)


def test_one_of_strings_equals_one_of() -> None:
    rng = random.Random(3)
    for n in (0, 1, 2, PACKED_FROM - 1, PACKED_FROM, 500):
        values = random_strings(rng, n)
        assert one_of_strings("f", values) == one_of("f", map(str, values))
    values = [f"v{i}" for i in range(PACKED_FROM * 2)] * 2
    assert one_of_strings("f", values) == one_of("f", values)
    assert one_of_strings("f", ["x"] * 100) == one_of("f", ["x"])  # one value: equality
    odd = [Renamed(f"v{i}") for i in range(PACKED_FROM)] + [f"v{i}" for i in range(PACKED_FROM)]
    leaf = one_of_strings("f", odd)
    assert leaf == one_of("f", map(keyword_value, odd)) == one_of("f", [f"v{i}" for i in
                                                                         range(PACKED_FROM)])
    assert isinstance(leaf, In) and all(type(v) is str for v in leaf.values)
    nul = [f"v{i}\0" for i in range(PACKED_FROM)]
    assert one_of_strings("f", nul) == one_of("f", nul)


def test_in_equality_and_hash_of_distinct_equal_nodes() -> None:
    values = tuple(f"id-{i:05d}" for i in range(1000))
    a, b = In("f", values), In("f", tuple(json.loads(json.dumps(values))))
    assert a == b and hash(a) == hash(b) and a is not b
    assert a != In("f", values[:-1] + ("id-x",))
    assert a != In("g", values)
    assert In("f", ("a\0", "b")) != In("f", ("a", "\0b"))
    assert In("f", ("a\0", "b")) == In("f", ("a\0", "b"))
    assert In("f", (1.0, 2.0)) == In("f", (1.0, 2.0))
    assert In("f", ("a", "b")) != ("f", ("a", "b"))
    rng = random.Random(6)
    for _ in range(200):  # parsed (hash and join from packed bytes) against hand-built
        strings = random_strings(rng, rng.randrange(PACKED_FROM, 3 * PACKED_FROM))
        parsed = one_of_strings("f", strings)
        built = In("f", tuple(sorted(set(strings))))
        if isinstance(parsed, In):
            assert parsed == built and hash(parsed) == hash(built)
            assert parsed.joined == built.joined


def test_canonical_of_large_in_lists_equals_json_dumps() -> None:
    rng = random.Random(4)
    for _ in range(300):
        values = sorted(set(random_strings(rng, rng.randrange(2, 100))))
        if len(values) < 2:
            continue
        expected = json.dumps({"op": "in", "field": "f", "values": values}, sort_keys=True,
                              separators=(",", ":"))
        assert canonical(In("f", tuple(values))) == expected
        shuffled = values[::-1] + values[:3]
        assert canonical(In("f", tuple(shuffled))) == expected


def test_large_in_filter_through_the_memo_matches_naive() -> None:
    rng = random.Random(5)
    records = [{"acl": [f"g{rng.randrange(5000):04d}" for _ in range(2)]} for _ in range(3000)]
    index = MetadataIndex.build(records)
    assert "acl" in index._tables  # the field has enough values for a table
    wanted = [f"g{rng.randrange(6000):04d}" for _ in range(3000)]  # some in no document
    memo = FilterMemo(index.kinds, Limits())
    first, key = memo.parse({"acl": {"in": wanted}})
    again, _ = memo.parse(json.loads(json.dumps({"acl": {"in": wanted}})))
    assert again is first
    assert first == parse_filter({"acl": {"in": wanted}}, index.kinds, max_in_values=10_000)
    wanted_set = set(wanted)
    expected = np.array([bool(wanted_set.intersection(r["acl"])) for r in records])
    np.testing.assert_array_equal(evaluate(first, index), expected)
    assert key == canonical(first)
    # A node equal to a remembered one but another object hits the same mask.
    other = parse_filter({"acl": {"in": wanted[::-1]}}, index.kinds, max_in_values=10_000)
    assert other is not first and evaluate(other, index) is evaluate(first, index)
