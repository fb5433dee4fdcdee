"""A password-protected, TLS-only ``redis-server`` on certificates generated for the test.

Certificates come from the ``openssl`` CLI: a CA, a server certificate for 127.0.0.1 signed by
it, a client certificate (the server requires one: mutual TLS), and a second, unrelated CA
that a client must refuse to trust.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis
from redis_servers import RedisProcess

PASSWORD = "s3cret-pass"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(name: str, cwd: Path) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.crt", "-days", "1", "-subj", f"/CN={name}", cwd=cwd)


def _signed(name: str, cn: str, cwd: Path, extensions: str | None = None) -> None:
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
             f"{name}.csr", "-subj", f"/CN={cn}", cwd=cwd)
    argv = ["x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "1"]
    if extensions is not None:
        (cwd / f"{name}.ext").write_text(extensions)
        argv += ["-extfile", f"{name}.ext"]
    _openssl(*argv, cwd=cwd)


def make_certificates(directory: Path) -> Path:
    """CA, server (SAN 127.0.0.1), client and an unrelated ``other-ca``; returns ``directory``."""
    if shutil.which("openssl") is None:
        raise RuntimeError("the TLS tests need the openssl CLI (apt-get install openssl)")
    directory.mkdir(parents=True, exist_ok=True)
    _ca("ca", directory)
    _ca("other-ca", directory)
    _signed("server", "127.0.0.1", directory, "subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _signed("client", "retrieval-client", directory)
    return directory


class TlsRedisProcess(RedisProcess):
    """``redis-server --port 0 --tls-port N --requirepass ...``: TLS and AUTH only."""

    def __init__(self, certs: Path) -> None:
        super().__init__()
        self.certs = certs

    def url_for(self, password: str | None = PASSWORD, user: str = "") -> str:
        auth = f"{user}:{password}@" if password is not None else ""
        return f"rediss://{auth}127.0.0.1:{self.port}/0"

    def tls(self, ca: str = "ca") -> dict[str, str]:
        """Config keys for a client trusting ``ca`` and presenting the client certificate."""
        return {"tls_ca_file": str(self.certs / f"{ca}.crt"),
                "tls_cert_file": str(self.certs / "client.crt"),
                "tls_key_file": str(self.certs / "client.key")}

    def _argv(self) -> list[str]:
        argv = super()._argv()
        argv[argv.index("--port") + 1] = "0"  # no plain-text port at all
        return argv + [
            "--tls-port", str(self.port), "--requirepass", PASSWORD,
            "--tls-cert-file", str(self.certs / "server.crt"),
            "--tls-key-file", str(self.certs / "server.key"),
            "--tls-ca-cert-file", str(self.certs / "ca.crt"),
            "--tls-auth-clients", "yes",
        ]

    def client(self) -> redis.Redis:
        tls = self.tls()
        return redis.Redis.from_url(self.url_for(), socket_timeout=2, socket_connect_timeout=2,
                                    ssl_ca_certs=tls["tls_ca_file"],
                                    ssl_certfile=tls["tls_cert_file"],
                                    ssl_keyfile=tls["tls_key_file"])

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 10.0
        client = self.client()
        try:
            while time.monotonic() < deadline:
                if self._proc is not None and self._proc.poll() is not None:
                    raise RuntimeError(f"redis-server (TLS) exited; see {self.dir}/redis.log")
                try:
                    if client.ping():
                        return
                except redis.RedisError:
                    time.sleep(0.02)
            raise RuntimeError("TLS redis-server did not start in time")
        finally:
            client.close()
