"""A loopback TCP proxy in front of a real ``redis-server`` that can turn sick on command.

Modes: ``pass`` (forward both ways), ``slow`` (every reply chunk held ``delay`` seconds),
``garbage`` (replies replaced by bytes that are not RESP), ``down`` (listening socket closed
and live connections reset: new connections are refused, as with a dead server).
"""

from __future__ import annotations

import select
import socket
import threading
import time
from typing import Literal

Mode = Literal["pass", "slow", "garbage", "down"]
GARBAGE = b"?this is not redis\r\n"


class FaultProxy:
    def __init__(self, upstream_port: int, delay: float = 0.05) -> None:
        self.upstream_port = upstream_port
        self.delay = delay
        self.mode: Mode = "pass"
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.port = self._listen(0)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _listen(self, port: int) -> int:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return int(listener.getsockname()[1])

    def set_mode(self, mode: Mode) -> None:
        if mode == "down":
            self._close_all()
            return
        was_down, self.mode = self.mode == "down", mode
        if was_down:  # listening again only once the mode lets new connections through
            self._listen(self.port)

    def _close_all(self) -> None:
        with self._lock:
            # Down before anything closes: a connection accepted meanwhile is dropped, not
            # registered after the sweep (it would have kept serving from a "dead" server).
            self.mode = "down"
            doomed, self._sockets = self._sockets, []
            listener, self._listener = self._listener, None
        for sock in [*doomed, *([listener] if listener else [])]:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self._close_all()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # listener closed
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            with self._lock:
                dead = self.mode == "down"
                if not dead:
                    self._sockets += [client, upstream]
            if dead:
                for sock in (client, upstream):
                    sock.close()
                continue
            threading.Thread(target=self._pump, args=(client, upstream, False),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True),
                             daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, replies: bool) -> None:
        try:
            while True:
                ready, _, _ = select.select([source], [], [], 0.5)
                if not ready:
                    continue
                data = source.recv(65536)
                if not data or self.mode == "down":
                    return
                if replies and self.mode == "slow":
                    time.sleep(self.delay)  # the fault itself: a server 50 ms late
                if replies and self.mode == "garbage":
                    data = GARBAGE
                target.sendall(data)
        except (OSError, ValueError):
            return
        finally:
            for sock in (source, target):
                try:
                    sock.close()
                except OSError:
                    pass
