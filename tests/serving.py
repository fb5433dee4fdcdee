"""``retrieval serve`` as a real process on a free 127.0.0.1 port, for tests over TCP."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]


def dies_with_this_process() -> None:
    """A child's ``preexec_fn``: SIGTERM it when the test process dies, so a run killed
    before its teardowns (a CI timeout, Ctrl-C twice) leaves no server behind."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def in_thread(server: Any) -> Iterator[None]:
    """A ``uvicorn.Server`` run in a thread of this process until the block ends."""
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.05)
        yield
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@dataclass
class Serving:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def client(self, key: str | None) -> httpx.Client:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def failure(self, message: str) -> str:
        return f"{message}; server log:\n{self.log.read_text()[-4000:]}"

    def wait_until(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if check():
                    return
            except httpx.HTTPError:
                pass
            assert self.process.poll() is None, self.failure("server exited")
            time.sleep(0.1)
        raise AssertionError(self.failure(f"timed out waiting for {what}"))

    def kill(self) -> None:
        """SIGKILL the server and every worker it forked (its own process group)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def serve(root: Path, config: Path, log: Path, env: dict[str, str]) -> Serving:
    """Start serving ``root`` with ``config`` (in a process group of its own)."""
    port = free_port()
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", **env}
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "retrieval", "serve", str(root), "--config", str(config),
             "--port", str(port), "--log-level", "warning"],
            cwd=REPO, env=full_env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=dies_with_this_process)
    return Serving(f"http://127.0.0.1:{port}", process, log)
