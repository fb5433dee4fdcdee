"""Service configuration: one TOML or JSON file, ``RETRIEVAL_*`` overrides, strict keys.

The file holds two tables, ``[server]`` (these settings) and ``[retriever]`` (the library's
``RetrieverConfig``). An environment variable ``RETRIEVAL_<SECTION>__<KEY>[__<SUBKEY>...]``
overrides one value (JSON-parsed when it parses, else taken as a string), e.g.
``RETRIEVAL_SERVER__PORT=9000`` or ``RETRIEVAL_RETRIEVER__CACHE__BACKEND=none``. An unknown key,
in the file or in an override, stops start-up with a message naming it.
"""

from __future__ import annotations

import ipaddress
import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from retrieval.config import RetrieverConfig
from retrieval.errors import ConfigError, RetrievalError, closest
from retrieval.filters.parse import check_syntax
from retrieval.service.errors import ServiceConfigError
from retrieval.strict import fields_at

ENV_PREFIX = "RETRIEVAL_"
ENV_SEPARATOR = "__"
SPEC_ENV = "RETRIEVAL_SERVE_SPEC"  # the resolved config, handed to the worker processes


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: not known to be loopback
        return False


class ServerSettings(BaseModel):
    """How the HTTP server listens, authenticates, limits and shuts down."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field("127.0.0.1", description="bind address; loopback unless told otherwise")
    port: int = Field(8080, ge=0, le=65535)
    workers: int = Field(1, ge=1, le=64, description="processes sharing the mmapped build")
    api_keys_file: str | None = Field(None, description="file with one bearer token per line, "
                                      "'TOKEN' (read scope) or 'TOKEN read|write|admin'")
    api_keys_env: str | None = Field(
        None, description="environment variable holding comma-separated bearer tokens, each "
        "'TOKEN' or 'TOKEN SCOPE' as in api_keys_file")
    open_writes: bool = Field(False, description="without API keys, accept writes from anyone "
                              "who can reach the port (a trusted network only); with keys, "
                              "writes need a key of write scope either way")
    metrics_auth: bool = Field(True, description="/metrics needs an API key when keys are set")
    max_body_bytes: int = Field(1_048_576, ge=64, description="larger bodies get 413")
    body_timeout_seconds: float = Field(10.0, gt=0, description="a request body not received "
                                        "within this gets 408 (a Content-Length longer than "
                                        "the body waited forever)")
    max_connections: int = Field(2048, ge=1, description="open connections and requests a "
                                 "worker holds at once (uvicorn's limit_concurrency); more "
                                 "get 503, so idle or half-sent connections cannot exhaust "
                                 "the descriptor limit")
    keep_alive_seconds: float = Field(5.0, gt=0, description="an idle keep-alive connection "
                                      "is closed after this")
    header_timeout_seconds: float = Field(10.0, gt=0, description="a request head (request "
                                          "line and headers) not complete this long after the "
                                          "connection or the request began gets 408")
    max_headers: int = Field(100, ge=8, description="headers per request; more get 431")
    max_header_bytes: int = Field(16_384, ge=1024, description="bytes of the request line "
                                  "and headers; more get 431")
    max_batch_queries: int = Field(256, ge=1, description="queries per /v1/search/batch")
    max_write_documents: int = Field(1000, ge=1, description="documents (or ids) per write "
                                     "request; more get 413")
    max_write_body_bytes: int = Field(16_777_216, ge=64, description="larger write bodies "
                                      "(/v1/documents) get 413: a batch of documents with "
                                      "vectors is larger than any search")
    max_in_flight: int | None = Field(
        None, ge=1, description="requests a worker admits at once (searches, document reads "
        "and writes, console searches and gates); more are shed with 503 and Retry-After "
        "before reaching a thread (None: 16 per usable core)")
    max_batch_hits: int = Field(10_000, ge=1, description="queries x k per batch: bounds its "
                                "hydration and response (256 x k=1000 returned 111 MB per 64 "
                                "queries before this bound); more gets 413")
    max_batch_candidates: int = Field(100_000, ge=1, description="queries x candidates per "
                                      "batch: bounds its CPU (256 x 1000 ran 44 s); more: 413")
    drain_seconds: float = Field(
        2.0, ge=0, description="after SIGTERM: keep serving with /readyz 503 this long, so load "
        "balancers stop sending, then stop accepting and finish what was accepted")
    grace_period_seconds: float = Field(30.0, gt=0, description="SIGTERM to exit, at most")
    load_retry_seconds: float = Field(
        30.0, gt=0, description="a build that fails to load is tried again, backing off to "
        "this interval (the build live before it serves meanwhile, when there is one)")
    log_query_text: bool = Field(False, description="query text in logs (off: it may be "
                                 "personal data)")
    access_log: bool = Field(False, description="uvicorn's per-request access log")
    ssl_certfile: str | None = Field(None, description="PEM certificate chain: serve HTTPS")
    ssl_keyfile: str | None = None
    ssl_keyfile_password: str | None = None
    ssl_ca_certs: str | None = Field(None, description="CA bundle to verify client certs")
    console: Literal["auto", "on", "off"] = Field(
        "auto", description="the search console at /console: auto = on for a loopback host, "
        "off otherwise; on a non-loopback host it needs API keys, and its API an admin key")

    @property
    def console_enabled(self) -> bool:
        return self.console == "on" or (self.console == "auto" and is_loopback(self.host))

    @model_validator(mode="after")
    def _consistent(self) -> ServerSettings:
        if (self.console == "on" and not is_loopback(self.host)
                and self.api_keys_file is None and self.api_keys_env is None):
            raise ValueError(f"console=on with host={self.host} would let anyone who reaches "
                             "the port compare builds: set api_keys_file or api_keys_env (the "
                             "console's API needs an admin key) or bind a loopback host")
        if self.drain_seconds >= self.grace_period_seconds:
            raise ValueError(f"drain_seconds={self.drain_seconds} must be less than "
                             f"grace_period_seconds={self.grace_period_seconds}")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("set both ssl_certfile and ssl_keyfile (or neither)")
        return self


class RaySettings(BaseModel):
    """Serve a sharded build whose shards run on Ray Serve (``serve_shards``), through
    ``Retriever.connect``, instead of loading it in the worker."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str = Field("auto", description="the Ray cluster (ray.init's address)")
    app_name: str = Field("retrieval-shards", description="the Serve application of shards")
    allow_partial: bool = Field(False, description="leave out a shard with no live replica")


class ServeConfig(BaseModel):
    """Everything ``retrieval serve`` needs besides the index root."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    server: ServerSettings = Field(default_factory=ServerSettings)  # type: ignore[arg-type]
    ray: RaySettings | None = Field(None, description="set: the build's shards are served by "
                                    "Ray Serve deployments (the ray extra)")
    retriever: RetrieverConfig = Field(default_factory=RetrieverConfig)  # type: ignore[arg-type]
    named_filters: dict[str, dict[str, Any] | str] = Field(
        default_factory=dict, description="filters registered by name when the index loads "
        "(``Retriever.register_filter``); requests refer to them as {\"$named\": name}")

    @field_validator("named_filters")
    @classmethod
    def _check_named_filters(cls, named: dict[str, dict[str, Any] | str], info: ValidationInfo
                             ) -> dict[str, dict[str, Any] | str]:
        """A named filter no build can serve stops start-up here (one whose fields a build
        lacks is refused when that build loads, and retried with the next)."""
        retriever = info.data.get("retriever")
        limits = (retriever or RetrieverConfig()).limits
        for name, spec in named.items():
            try:
                check_syntax(spec, max_clauses=limits.max_filter_clauses,
                             max_in_values=limits.max_in_values)
            except RetrievalError as exc:
                raise ValueError(f"named filter {name!r}: {exc}") from exc
        return named


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The raw tables of a ``.toml`` or ``.json`` file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ServiceConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        elif path.suffix.lower() == ".toml":
            data = tomllib.loads(text)
        else:
            raise ServiceConfigError(f"config file {path} must end in .toml or .json")
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ServiceConfigError(f"config file {path} is not valid: {exc}") from exc
    if not isinstance(data, dict):
        raise ServiceConfigError(f"config file {path} must hold a table/object at the top")
    return data


def env_overrides(environ: Mapping[str, str]) -> dict[str, tuple[list[str], Any]]:
    """``{variable: (key path, value)}`` for every ``RETRIEVAL_<SECTION>__<KEY>`` variable.

    Variables without the ``__`` separator (``RETRIEVAL_DATA``) are not config overrides.
    """
    found = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or ENV_SEPARATOR not in name:
            continue
        path = [part.lower() for part in name[len(ENV_PREFIX):].split(ENV_SEPARATOR)]
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        found[name] = (path, value)
    return found


def _set_path(data: dict[str, Any], path: list[str], value: Any, source: str) -> None:
    node = data
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ServiceConfigError(f"{source}: {'.'.join(path)} goes through {part!r}, "
                                     "which is not a table")
        node = child
    node[path[-1]] = value


def _describe(error: ValidationError, sources: Mapping[str, str]) -> str:
    lines = []
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"])
        where = next((source for name, source in sources.items()
                      if name == key.lower() or name.startswith(key.lower() + ".")),
                     "the config file")
        nested = item.get("ctx", {}).get("error")
        if isinstance(nested, ConfigError) and nested.key:
            # The library's config raised its own error: name the key from the file's top.
            key = f"{key}.{nested.key}"
            kind = "unknown key" if "unknown key" in str(nested) else "invalid key"
            lines.append(f"{kind} {key!r} in {where}: {nested}")
        elif item["type"] == "extra_forbidden":
            known = fields_at(ServeConfig, item["loc"][:-1])
            lines.append(f"unknown key {key!r} in {where}"
                         f"{closest(str(item['loc'][-1]), known)}")
        else:
            lines.append(f"{key} ({where}): {item['msg'].removeprefix('Value error, ')}")
    return "invalid service config: " + "; ".join(lines)


def load_serve_config(path: str | Path | None = None,
                      environ: Mapping[str, str] | None = None,
                      **cli: Any) -> ServeConfig:
    """File (optional) < ``RETRIEVAL_*`` variables < command-line values (``host=...``)."""
    data = read_config_file(path) if path is not None else {}
    sources: dict[str, str] = {}
    for name, (keys, value) in env_overrides(os.environ if environ is None else environ).items():
        _set_path(data, keys, value, name)
        sources[".".join(keys)] = f"environment variable {name}"
    for key, value in cli.items():
        if value is not None:
            _set_path(data, ["server", key], value, f"--{key}")
            sources[f"server.{key}"] = f"--{key}"
    try:
        return ServeConfig.model_validate(data)
    except ValidationError as exc:
        raise ServiceConfigError(_describe(exc, sources)) from exc
