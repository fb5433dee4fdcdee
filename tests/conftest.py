"""Shared pytest fixtures: Redis servers here, real data and the model in data_fixtures."""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from collections.abc import Iterator

import pytest
from redis_servers import (
    RedisClusterProcesses,
    RedisNotInstalledError,
    RedisProcess,
    require_binaries,
    start_cluster,
    start_standalone,
)

pytest_plugins = ["data_fixtures", "passage_fixtures"]


def _import_anyio_now() -> None:
    """anyio imports its modules on first use (parsing their source with ``ast`` to do so),
    and pytest rewrites their asserts on import (anyio is a pytest plugin). A first use in a
    server's thread (a snapshot download opening its file) parsed Python in two threads at
    once, which CPython 3.11.7 does not survive: "SystemError: AST constructor recursion depth
    mismatch" failed a whole run once. Every module is imported here, before any test starts
    a thread; those needing what is not installed (the trio backend) are left out."""
    import anyio

    for module in pkgutil.walk_packages(anyio.__path__, "anyio."):
        try:
            importlib.import_module(module.name)
        except ImportError:  # an optional backend's dependency (trio) not installed
            continue


_import_anyio_now()


def _require_redis() -> None:
    """Missing Redis binaries fail the test with install instructions; they never skip it."""
    try:
        require_binaries()
    except RedisNotInstalledError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisProcess]:
    """A private standalone ``redis-server`` on a free port (never the shared :6379)."""
    _require_redis()
    server = start_standalone()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterProcesses]:
    """A private 3-master Redis Cluster on free ports (bus ports = port + 10000)."""
    _require_redis()
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        cluster.cleanup()


# Under CI (``CI`` set, as ``.ci/run`` is run) a skipped test fails the run: a fresh clone
# runs every test on the data the repository ships, so a skip means something is missing.
_SKIPPED: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPPED.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _SKIPPED and os.environ.get("CI"):
        print(f"\n{len(_SKIPPED)} tests skipped under CI (every test must run): "
              + ", ".join(_SKIPPED[:10]))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if "ray_local" in sys.modules and (left := sys.modules["ray_local"].ray_threads()):
        print(f"\nRay threads left running after the tests stopped their clusters: {left}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
