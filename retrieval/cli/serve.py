"""``retrieval serve INDEX_ROOT``: the HTTP service on uvicorn, N worker processes.

Every worker memory-maps the same build files (the page cache holds one copy) and runs its
own reloader when ``retriever.reload_interval_seconds`` is set.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import socket
import ssl
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from indexes.errors import ArtifactError
from indexes.history import rollback_target
from indexes.manifest import read_manifest, resolve_build_dir
from retrieval.errors import ConfigError
from retrieval.quiet import quiet_third_party
from retrieval.service.auth import load_api_keys
from retrieval.service.settings import SPEC_ENV, ServeConfig, ServerSettings, load_serve_config

METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"
APP = "retrieval.service.app:app_from_env"


log = logging.getLogger(__name__)


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to an ``add_subparsers()`` object; returns the parser."""
    serve = subparsers.add_parser(
        "serve", help="serve an index over HTTP (search, readiness, Prometheus metrics)")
    serve.add_argument("index", help="index root (builds/ and CURRENT) or a build directory")
    serve.add_argument("--config", default=None,
                       help="TOML or JSON file with [server] and [retriever] tables")
    serve.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default 8080)")
    serve.add_argument("--workers", type=int, default=None, help="worker processes (default 1)")
    serve.add_argument("--log-level", default="info",
                       choices=["critical", "error", "warning", "info", "debug"])
    serve.set_defaults(func=run_serve, own_signals=True)  # draining, workers
    return serve


@contextmanager
def metrics_directory() -> Iterator[str]:
    """The shared directory of multiprocess metrics: the operator's (emptied) or a temp one."""
    given = os.environ.get(METRICS_ENV)
    if given:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob("*.db"):  # samples of an earlier run would be merged in
            stale.unlink()
        yield str(path)
        return
    created = tempfile.mkdtemp(prefix="retrieval-metrics-")
    os.environ[METRICS_ENV] = created
    try:
        yield created
    finally:
        shutil.rmtree(created, ignore_errors=True)


def uvicorn_options(config: ServeConfig, log_level: str) -> dict[str, Any]:
    from retrieval.service.protocol import guarded_protocol  # imports uvicorn: serve only

    server = config.server
    options: dict[str, Any] = {
        "host": server.host, "port": server.port, "workers": server.workers,
        "log_level": log_level, "access_log": server.access_log,
        "timeout_graceful_shutdown": max(server.grace_period_seconds - server.drain_seconds,
                                         0.1),
        "server_header": False,
        "limit_concurrency": server.max_connections,
        "timeout_keep_alive": server.keep_alive_seconds,
        "http": guarded_protocol(server),  # head size, count and read-time limits
    }
    if server.ssl_certfile:
        options.update(ssl_certfile=server.ssl_certfile, ssl_keyfile=server.ssl_keyfile,
                       ssl_keyfile_password=server.ssl_keyfile_password)
    if server.ssl_ca_certs:  # a CA bundle means: require client certificates (mutual TLS)
        options.update(ssl_ca_certs=server.ssl_ca_certs, ssl_cert_reqs=ssl.CERT_REQUIRED)
    return options


LOOPBACK = ("127.0.0.1", "::1", "localhost")


def check_before_start(index: Path, config: ServeConfig) -> None:
    """Fail before forking workers: the index root has a readable build, keys are readable;
    warn when a service without API keys listens beyond this machine."""
    check_some_build_serves(index)
    check_tls_files(config.server)
    check_address_free(config.server)
    keys = load_api_keys(config.server)
    if not keys.enabled and config.server.host not in LOOPBACK:
        log.warning("serving %s on %s without API keys: anyone who can reach it can search "
                    "it; set server.api_keys_file or server.api_keys_env", index,
                    config.server.host)


def check_some_build_serves(index: Path) -> None:
    """The live build's manifest reads, or the build live before it (which the workers
    serve while the live one fails to load: ``ServiceState``); else the live one's error."""
    try:
        read_manifest(resolve_build_dir(index))
    except ArtifactError as exc:
        previous = rollback_target(index) if index.is_dir() else None
        if previous is None:
            raise
        try:
            read_manifest(index / "builds" / previous)
        except ArtifactError:
            raise exc from None
        log.warning("the live build of %s does not load (%s): serving the last good build %s "
                    "until it does", index, exc, previous)


def check_tls_files(server: ServerSettings) -> None:
    """Load the TLS files as the workers will: a missing or bad one is a ``ConfigError``
    naming its setting here, not a failure in every worker as it starts."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    key = "server.ssl_certfile"
    try:
        if server.ssl_certfile:
            context.load_cert_chain(server.ssl_certfile, server.ssl_keyfile,
                                    server.ssl_keyfile_password)
        key = "server.ssl_ca_certs"
        if server.ssl_ca_certs:
            context.load_verify_locations(server.ssl_ca_certs)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{key} (or its key file) cannot be loaded: {exc}; give readable "
                          "PEM files", key) from exc


def check_address_free(server: ServerSettings) -> None:
    """Bind the address as uvicorn will (``SO_REUSEADDR``), then let it go: a port in use is
    a ``ConfigError`` naming it (one line, exit 2) here, not uvicorn's startup failure (exit
    3) once every worker has loaded the build."""
    try:
        family = socket.getaddrinfo(server.host, server.port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((server.host, server.port))
    except OSError as exc:
        raise ConfigError(f"cannot listen on {server.host}:{server.port} ({exc.strerror or exc});"
                          " stop what listens there or set server.port (--port) to a free "
                          "one", "server.port") from exc


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    quiet_third_party()
    config = load_serve_config(args.config, host=args.host, port=args.port,
                               workers=args.workers)
    index = Path(args.index).resolve()
    check_before_start(index, config)
    os.environ[SPEC_ENV] = json.dumps({"index_root": str(index),
                                       "config": config.model_dump(mode="json")})
    # uvicorn re-raises SIGTERM after a graceful shutdown; with this handler in place that
    # returns here (and the metrics directory is cleaned up) instead of killing the process.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    options = uvicorn_options(config, args.log_level)
    with metrics_directory():
        if config.server.workers == 1:
            uvicorn.run(APP, factory=True, **options)
        else:
            from retrieval.service.workers import run_forked_workers

            return run_forked_workers(uvicorn.Config(APP, factory=True, **options),
                                      config.server.workers, index)
    return 0
