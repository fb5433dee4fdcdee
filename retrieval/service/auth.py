"""API keys: bearer tokens from a file and/or an environment variable, checked in constant time.

Each entry is ``TOKEN`` or ``TOKEN SCOPE`` with SCOPE one of ``read`` (the default: searches,
index info, fetching documents), ``write`` (also upserts and deletes) or ``admin`` (also
snapshots). A service without keys is open for reads and refuses writes unless
``server.open_writes`` says its network is trusted.

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
from typing import Literal

from retrieval.service.errors import ServiceConfigError
from retrieval.service.settings import ServerSettings

Scope = Literal["read", "write", "admin"]
SCOPES: tuple[Scope, ...] = ("read", "write", "admin")  # each allows what those before do


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def allows(granted: Scope, needed: Scope) -> bool:
    return SCOPES.index(granted) >= SCOPES.index(needed)


class ApiKeys:
    """The accepted tokens and their scopes; ``enabled`` is False when none are configured
    (an open service)."""

    def __init__(self, tokens: Iterable[str | tuple[str, Scope]]) -> None:
        entries: list[tuple[str, Scope]] = [(t, "read") if isinstance(t, str) else t
                                            for t in tokens]
        self._digests = tuple((_digest(token), scope) for token, scope in entries)

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def accepts(self, authorization: str | None) -> bool:
        """True for ``Bearer <known token>``; any other header (or none) is False."""
        return self.scope_of(authorization) is not None

    def scope_of(self, authorization: str | None) -> Scope | None:
        """The scope of ``Bearer <known token>``; None for any other header (or none)."""
        if authorization is None:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        presented = _digest(token.strip())
        found: Scope | None = None
        for known, scope in self._digests:  # every digest compared: no early exit
            if hmac.compare_digest(presented, known):
                found = scope
        return found


def parse_entry(entry: str, source: str) -> tuple[str, Scope]:
    """``TOKEN`` or ``TOKEN SCOPE`` as (token, scope)."""
    token, _, scope = entry.strip().partition(" ")
    scope = scope.strip() or "read"
    if scope not in SCOPES:
        raise ServiceConfigError(f"{source}: key scope {scope!r} is not one of "
                                 f"{list(SCOPES)} (write an entry as 'TOKEN' or 'TOKEN SCOPE')")
    return token, scope  # type: ignore[return-value]


def _tokens_from_file(path: str) -> list[tuple[str, Scope]]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ServiceConfigError(f"cannot read server.api_keys_file {path}: {exc.strerror}"
                                 ) from exc
    tokens = [parse_entry(line, f"server.api_keys_file {path}") for line in lines
              if line.strip() and not line.startswith("#")]
    if not tokens:
        raise ServiceConfigError(f"server.api_keys_file {path} holds no keys (one per line)")
    return tokens


def load_api_keys(settings: ServerSettings, environ: Mapping[str, str] | None = None) -> ApiKeys:
    """Keys from ``api_keys_file`` and ``api_keys_env``; a configured but empty source is an
    error (a typo must not silently open the service)."""
    environ = os.environ if environ is None else environ
    tokens: list[tuple[str, Scope]] = []
    if settings.api_keys_file:
        tokens += _tokens_from_file(settings.api_keys_file)
    if settings.api_keys_env:
        raw = environ.get(settings.api_keys_env, "")
        found = [parse_entry(t, f"server.api_keys_env {settings.api_keys_env}")
                 for t in raw.split(",") if t.strip()]
        if not found:
            raise ServiceConfigError(f"server.api_keys_env names {settings.api_keys_env}, which "
                                     "is unset or empty; export the keys (comma-separated)")
        tokens += found
    return ApiKeys(tokens)
