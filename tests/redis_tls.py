"""A TLS-only ``redis-server`` for tests, with certificates made here by ``openssl``.

``make_certs(dir)`` writes a throwaway CA and a server and a client certificate signed by it
(EC P-256, valid two days, the server's for IP 127.0.0.1). ``TLSRedisServer`` listens for TLS
only (``--port 0 --tls-port``) and requires client certificates (``--tls-auth-clients yes``):
mutual TLS, the strictest setting docs/redis.md describes.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis

from tests.redis_servers import RedisServer

OPENSSL = shutil.which("openssl")


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def query(self) -> str:
        """The URL query that makes redis-py verify the server and present the client cert."""
        return (
            f"ssl_cert_reqs=required&ssl_ca_certs={quote(str(self.ca))}"
            f"&ssl_certfile={quote(str(self.client_cert))}"
            f"&ssl_keyfile={quote(str(self.client_key))}"
        )

    def options(self) -> dict[str, Any]:
        """The same as keyword arguments of ``redis.Redis``."""
        return {
            "ssl": True,
            "ssl_cert_reqs": "required",
            "ssl_ca_certs": str(self.ca),
            "ssl_certfile": str(self.client_cert),
            "ssl_keyfile": str(self.client_key),
        }


def _openssl(*args: str, cwd: Path) -> None:
    assert OPENSSL is not None, "openssl is not installed"
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certs(where: Path) -> Certs:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, in ``where``."""
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=ratekeeper test CA", cwd=where)  # fmt: skip
    for name, extra in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "")):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN=ratekeeper test {name}", cwd=where)  # fmt: skip
        ext = where / f"{name}.ext"
        ext.write_text(extra + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", "2",
                 *(("-extfile", str(ext)) if extra else ()), cwd=where)  # fmt: skip
    return Certs(
        where / "ca.crt",
        where / "server.crt",
        where / "server.key",
        where / "client.crt",
        where / "client.key",
    )


class TLSRedisServer(RedisServer):
    """A redis-server that speaks TLS only, on ``port``, and wants a client certificate."""

    def __init__(self, certs: Certs, *extra: str) -> None:
        self.certs = certs
        tls = (
            "--tls-port", "{port}", "--port", "0",
            "--tls-cert-file", str(certs.server_cert), "--tls-key-file", str(certs.server_key),
            "--tls-ca-cert-file", str(certs.ca), "--tls-auth-clients", "yes",
        )  # fmt: skip
        self._template = (*tls, *extra)
        super().__init__(None)

    def start(self) -> None:
        # the TLS port replaces the plain one: the base class passes ``--port`` first
        self.extra = [a.replace("{port}", str(self.port)) for a in self._template]
        super().start()

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0?{self.certs.query()}"

    def client(self, **kwargs: Any) -> redis.Redis:
        options = {**self.certs.options(), **kwargs}
        return redis.Redis(host="127.0.0.1", port=self.port, **options)
