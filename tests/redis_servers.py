"""Start throwaway ``redis-server`` processes (standalone and 3-master Cluster) for tests.

Every server gets a free port, a temp directory, no persistence, and is killed at exit even
when a test fails. Controls: ``stop``/``restart`` (same port), ``pause`` (SIGSTOP: the kernel
still accepts TCP connections but nothing is ever answered) and ``resume`` (SIGCONT).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis
from serving import dies_with_this_process

_LIVE: list[RedisProcess] = []
_START_TIMEOUT = 10.0


class RedisNotInstalledError(RuntimeError):
    """``redis-server``/``redis-cli`` are missing; tests need real servers."""


def require_binaries() -> None:
    """Fail loudly (never skip) when the Redis binaries are missing."""
    missing = [name for name in ("redis-server", "redis-cli") if shutil.which(name) is None]
    if missing:
        raise RedisNotInstalledError(
            f"{', '.join(missing)} not found on PATH: the cache tests need a real Redis 7+; "
            "install it (e.g. `apt-get install redis-server` or `brew install redis`)"
        )


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(with_bus: bool = False) -> int:
    """A free loopback port; with ``with_bus`` also ``port + 10000`` (Cluster bus) is free."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if not with_bus:
            return port
        if port + 10000 < 65536 and _port_is_free(port + 10000):
            return port
    raise RuntimeError("could not find a free port (and free cluster bus port)")


class RedisProcess:
    """One ``redis-server`` on a fixed port; survives ``stop``/``restart`` cycles."""

    def __init__(self, port: int | None = None, cluster: bool = False) -> None:
        self.cluster = cluster
        self.port = port if port is not None else free_port(with_bus=cluster)
        self.dir = Path(tempfile.mkdtemp(prefix=f"redis-{self.port}-"))
        self._proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        _LIVE.append(self)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _argv(self) -> list[str]:
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        argv += ["--save", "", "--appendonly", "no", "--dir", str(self.dir)]
        argv += ["--logfile", str(self.dir / "redis.log")]
        if self.cluster:
            # Short node timeout so a paused/stopped node does not linger for the default 15 s.
            argv += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
            argv += ["--cluster-node-timeout", "3000"]
        return argv

    def start(self) -> None:
        """Start the server and wait until it answers PING."""
        require_binaries()
        self._proc = subprocess.Popen(
            self._argv(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=dies_with_this_process)
        self.paused = False
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT
        client = redis.Redis(port=self.port, socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            while time.monotonic() < deadline:
                if self._proc is not None and self._proc.poll() is not None:
                    raise RuntimeError(f"redis-server on {self.port} exited; see {self.dir}")
                try:
                    if client.ping():
                        return
                except redis.RedisError:
                    time.sleep(0.02)
            raise RuntimeError(f"redis-server on port {self.port} did not start in time")
        finally:
            client.close()

    def stop(self) -> None:
        """Terminate the server (SIGCONT first: a stopped process ignores SIGTERM)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        if self.paused:
            proc.send_signal(signal.SIGCONT)
            self.paused = False
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def restart(self) -> None:
        """Stop and start again on the same port (data is gone: no persistence)."""
        self.stop()
        self.start()

    def pause(self) -> None:
        """SIGSTOP: connections are accepted by the kernel but never answered."""
        if self._proc is not None:
            os.kill(self._proc.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self._proc is not None:
            os.kill(self._proc.pid, signal.SIGCONT)
            self.paused = False

    def client(self) -> redis.Redis:
        """A plain client for test setup (generous timeouts)."""
        return redis.Redis(port=self.port, socket_timeout=2, socket_connect_timeout=2)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisClusterProcesses:
    """A 3-master, 0-replica Redis Cluster on loopback."""

    def __init__(self, masters: int = 3) -> None:
        self.nodes = [RedisProcess(cluster=True) for _ in range(masters)]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}"

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        addrs = [f"127.0.0.1:{node.port}" for node in self.nodes]
        argv = ["redis-cli", "--cluster", "create", *addrs]
        argv += ["--cluster-replicas", "0", "--cluster-yes"]
        done = subprocess.run(argv, capture_output=True, timeout=30, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout!r}")
        self.wait_ok()

    def wait_ok(self, timeout: float = _START_TIMEOUT) -> None:
        """Wait until every node reports ``cluster_state:ok``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self._node_ok(node) for node in self.nodes):
                return
            time.sleep(0.05)
        raise RuntimeError("redis cluster did not reach cluster_state:ok in time")

    @staticmethod
    def _node_ok(node: RedisProcess) -> bool:
        client = node.client()
        try:
            info = client.execute_command("CLUSTER", "INFO")
        except redis.RedisError:
            return False
        finally:
            client.close()
        text = info.decode() if isinstance(info, bytes) else str(info)
        return "cluster_state:ok" in text

    def pause(self) -> None:
        for node in self.nodes:
            node.pause()

    def resume(self) -> None:
        for node in self.nodes:
            node.resume()

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()


def start_standalone() -> RedisProcess:
    server = RedisProcess()
    server.start()
    return server


def start_cluster() -> RedisClusterProcesses:
    cluster = RedisClusterProcesses()
    try:
        cluster.start()
    except BaseException:
        cluster.cleanup()
        raise
    return cluster


@atexit.register
def _kill_leftovers() -> None:
    """Last-resort cleanup when a fixture finalizer never ran (e.g. interrupted session)."""
    for server in _LIVE:
        server.cleanup()
