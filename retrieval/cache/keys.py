"""Cache key builders: namespaced, versioned, and made only of hashes (never user text).

Layout::

    <namespace>:v4:emb:{<tag>}:<digest of encoder_id + text>
    <namespace>:v4:res:{<tag>}:<digest of build, snapshot, config, text, filters, k>

``<tag>`` is a short hash of the normalized query text inside a Redis Cluster hash tag, so the
embedding key and the result key of one request live in the same hash slot and a single
``MGET`` can fetch both. The digest covers every input (as an unambiguous JSON list), so any
differing part gives a different key.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from retrieval.cache.base import CacheConfigError

# Bump when key layout or value encodings change: old entries just miss, and workers of two
# versions side by side (a rolling deploy) never overwrite each other's values.
# v4: embeddings carry a crc32 (codec version 2).
KEY_VERSION = "v4"
NAMESPACE_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$")
_TAG_BYTES = 8  # 64-bit tag: only for slot placement, the digest carries the identity
_DIGEST_BYTES = 16


# What both the analyzer and the encoder's tokenizer read as a space between words: Unicode
# white space except control characters. str.split() also splits on those (\x0b, \x0c,
# \x1c-\x1f, \x85), which the tokenizer deletes: "heat\x1ftransfer" is embedded as
# "heattransfer", not as "heat transfer" (tests check this set against the tokenizer).
_SEPARATORS = re.compile(
    "[ \t\n\r\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+")


def normalize_query(text: str) -> str:
    """Canonical form of a query for caching: runs of separators (``_SEPARATORS``) collapsed
    to one space and stripped, nothing else. The analyzer's and the encoder's own
    normalizations differ (a cased encoder, an analyzer without lowercasing, "ß" against
    "ss"), so folding case, compatibility forms or other characters here would serve one
    query another's results."""
    return _SEPARATORS.sub(" ", text).strip(" ")


def validate_namespace(namespace: str) -> str:
    """Return ``namespace`` or raise: braces would hijack the Cluster hash tag."""
    if not isinstance(namespace, str) or not NAMESPACE_PATTERN.match(namespace):
        raise CacheConfigError(
            f"namespace {namespace!r} is invalid: use 1-100 characters from "
            "letters, digits, '_', '.', ':', '-' (starting with a letter or digit)"
        )
    return namespace


def canonicalize_filters(filters: Mapping[str, Any] | Sequence[Any] | None) -> str:
    """Order-independent JSON text for a filter structure ("" when there are none)."""
    if not filters:
        return ""
    return json.dumps(
        filters, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def query_tag(text: str) -> str:
    """Hex hash of the normalized query: the hash-tag content shared by a request's keys."""
    return _tag(normalize_query(text))


def embedding_key(namespace: str, encoder_id: str, normalized_text: str) -> str:
    """Key of a query embedding for one encoder (model + dimension + options)."""
    text = normalize_query(normalized_text)
    digest = _digest(["emb", encoder_id, text])
    return f"{validate_namespace(namespace)}:{KEY_VERSION}:emb:{{{_tag(text)}}}:{digest}"


def result_key(
    namespace: str,
    build_id: str,
    snapshot_id: str,
    config_fingerprint: str,
    normalized_text: str,
    canonical_filters: str,
    k: int,
) -> str:
    """Key of a final result list: changes with the index build, snapshot and search config."""
    text = normalize_query(normalized_text)
    digest = _digest(["res", build_id, snapshot_id, config_fingerprint, text, canonical_filters, k])
    return f"{validate_namespace(namespace)}:{KEY_VERSION}:res:{{{_tag(text)}}}:{digest}"


def _tag(normalized: str) -> str:
    return _blake(normalized.encode("utf-8", "surrogatepass"), _TAG_BYTES)


def _digest(parts: list[Any]) -> str:
    # A JSON list is unambiguous: ("ab", "c") and ("a", "bc") encode differently.
    payload = json.dumps(parts, ensure_ascii=False, separators=(",", ":"))
    return _blake(payload.encode("utf-8", "surrogatepass"), _DIGEST_BYTES)


def _blake(data: bytes, size: int) -> str:
    return hashlib.blake2b(data, digest_size=size).hexdigest()
