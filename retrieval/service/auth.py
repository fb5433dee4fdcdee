"""API keys: bearer tokens from a file and/or an environment variable, checked in constant time.

Keys are kept only as SHA-256 digests, and a presented token is hashed and compared with every
digest (``hmac.compare_digest``, no early exit), so neither the length nor a prefix of a key
leaks through response timing.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from retrieval.service.errors import ServiceConfigError
from retrieval.service.settings import ServerSettings


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


class ApiKeys:
    """The accepted tokens; ``enabled`` is False when none are configured (open service)."""

    def __init__(self, tokens: Iterable[str]) -> None:
        self._digests = tuple(_digest(t) for t in tokens)

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def accepts(self, authorization: str | None) -> bool:
        """True for ``Bearer <known token>``; any other header (or none) is False."""
        if authorization is None:
            return False
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return False
        presented = _digest(token.strip())
        matched = False
        for known in self._digests:
            matched |= hmac.compare_digest(presented, known)
        return matched


def _tokens_from_file(path: str) -> list[str]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ServiceConfigError(f"cannot read server.api_keys_file {path}: {exc.strerror}"
                                 ) from exc
    tokens = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    if not tokens:
        raise ServiceConfigError(f"server.api_keys_file {path} holds no keys (one per line)")
    return tokens


def load_api_keys(settings: ServerSettings, environ: Mapping[str, str] | None = None) -> ApiKeys:
    """Keys from ``api_keys_file`` and ``api_keys_env``; a configured but empty source is an
    error (a typo must not silently open the service)."""
    environ = os.environ if environ is None else environ
    tokens: list[str] = []
    if settings.api_keys_file:
        tokens += _tokens_from_file(settings.api_keys_file)
    if settings.api_keys_env:
        raw = environ.get(settings.api_keys_env, "")
        found = [t.strip() for t in raw.split(",") if t.strip()]
        if not found:
            raise ServiceConfigError(f"server.api_keys_env names {settings.api_keys_env}, which "
                                     "is unset or empty; export the keys (comma-separated)")
        tokens += found
    return ApiKeys(tokens)
