"""Browser rules of a real ``ratekeeper serve`` without tokens (local use): a page of another
origin cannot change its state (a real headless Chromium tries: form posts and ``no-cors``
fetches with ``text/plain`` bodies), a foreign ``Host`` (DNS rebinding) reads nothing, the
service's own dashboard and plain JSON clients go on working; and listening beyond loopback
without tokens is said at startup and in ``/healthz``."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from tests.browser import Browser
from tests.service.proc import ServiceProcess

CONFIG = "policies:\n  p:\n    rate: 2/hour\n"
TOKEN = "client-token-0123456789"


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServiceProcess]:
    path = tmp_path / "ratekeeper.yaml"
    path.write_text(CONFIG)
    proc = ServiceProcess(
        path,
        grpc=False,
        extra=("--allowed-host", "rk.internal", "--allowed-origin", "https://ops.example"),
    )
    yield proc
    proc.stop()


def enabled(http: httpx.Client) -> bool:
    policies = http.get("/v1/policies").json()["policies"]
    return bool(next(p for p in policies if p["name"] == "p")["enabled"])


def refused(http: httpx.Client, reason: str) -> float:
    text = http.get("/metrics").text
    m = re.search(rf'^ratekeeper_requests_refused_total\{{reason="{reason}"\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def test_state_changes_need_json_or_a_token_and_the_same_origin(service: ServiceProcess) -> None:
    url = "/v1/admin/policies/p"
    off = '{"enabled": false}'
    with httpx.Client(base_url=service.url, timeout=10) as http:
        own = f"http://127.0.0.1:{service.port}"
        for headers, status in [
            ({"content-type": "text/plain"}, 415),  # a form's or no-cors fetch's body
            ({}, 415),
            ({"content-type": "application/x-www-form-urlencoded"}, 415),
            ({"content-type": "application/json", "sec-fetch-site": "cross-site"}, 403),
            ({"content-type": "application/json", "origin": "http://evil.example"}, 403),
            ({"content-type": "application/json", "origin": "null"}, 403),
            ({"content-type": "application/json", "origin": "http://127.0.0.1:1"}, 403),
        ]:
            answer = http.post(url, content=off, headers=headers)
            assert answer.status_code == status, (headers, answer.text)
            assert enabled(http)
        for path in ("/v1/reset", "/v1/admin/reload", "/v1/hit", "/dashboard/modes"):
            answer = http.post(path, content="{}", headers={"content-type": "text/plain"})
            assert answer.status_code == 415, (path, answer.text)
        for origin in (own, "https://ops.example"):  # its own page; an allowed origin
            answer = http.post(url, json={"shadow": True}, headers={"origin": origin})
            assert answer.status_code == 200, answer.text
        json_client = http.post(url, json={"enabled": False})  # curl, a script: no Origin
        assert json_client.status_code == 200 and not enabled(http)


def test_a_foreign_host_reads_nothing(service: ServiceProcess) -> None:
    """A DNS name rebound to 127.0.0.1 makes a page same-origin: its Host gives it away."""
    with httpx.Client(base_url=service.url, timeout=10) as http:
        for host in ("attacker.example", "attacker.example:8080", "127.0.0.2"):
            for path in ("/dashboard/data", "/v1/policies", "/healthz", "/metrics"):
                answer = http.get(path, headers={"host": host})
                assert answer.status_code == 400 and answer.json()["field"] == "host", answer
        for host in ("localhost", f"127.0.0.1:{service.port}", "[::1]", "RK.internal:80"):
            assert http.get("/dashboard/data", headers={"host": host}).status_code == 200


class Attacker(BaseHTTPRequestHandler):
    """A page of another origin trying every request a browser sends without a preflight."""

    target = ""

    def do_GET(self) -> None:  # http.server's name
        page = ATTACK.replace("TARGET", self.target).encode()
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, *args: object) -> None:
        return


ATTACK = """<!doctype html>
<iframe name="sink"></iframe>
<form id="f" method="POST" enctype="text/plain" target="sink" action="TARGET/v1/reset">
<input name='{"policy": "p", "key": "vic' value='tim"}'></form>
<script>
const off = '{"enabled": false}';
const hits = [
  fetch("TARGET/v1/admin/policies/p", {method: "POST", mode: "no-cors", body: off}),
  fetch("TARGET/v1/admin/policies/p", {method: "POST", mode: "no-cors", body: off,
        headers: {"Content-Type": "text/plain"}}),
  fetch("TARGET/v1/reset", {method: "POST", mode: "no-cors",
        body: '{"policy": "p", "key": "victim"}'}),
];
document.getElementById("f").submit();  // {"policy": "p", "key": "vic=tim"}
Promise.allSettled(hits).then(() => { document.title = "sent"; });
</script>"""


def test_a_page_of_another_origin_cannot_flip_the_kill_switch(tmp_path: Path) -> None:
    path = tmp_path / "ratekeeper.yaml"
    path.write_text(CONFIG)
    service = ServiceProcess(path, grpc=False)  # as documented for local use
    browser = Browser()
    Attacker.target = service.url
    server = ThreadingHTTPServer(("127.0.0.1", 0), Attacker)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with httpx.Client(base_url=service.url, timeout=10) as http:
            for _ in range(2):  # the victim's key: at its limit
                http.post("/v1/hit", json={"policy": "p", "key": "victim"})
            before = sum(refused(http, r) for r in ("origin", "content-type"))
            browser.open(f"http://127.0.0.1:{server.server_address[1]}/")
            browser.wait_for("document.title === 'sent'")

            deadline = time.monotonic() + 20  # the form's post may come after the fetches
            while sum(refused(http, r) for r in ("origin", "content-type")) - before < 4:
                assert enabled(http), "a page of another origin flipped the kill switch"
                assert time.monotonic() < deadline, "the page's requests never reached it"
                time.sleep(0.1)
            assert enabled(http)
            hit = http.post("/v1/hit", json={"policy": "p", "key": "victim"}).json()
            assert hit["allowed"] is False  # the counter was not reset
    finally:
        server.shutdown()
        browser.close()
        service.stop()


def test_listening_beyond_loopback_without_tokens_is_said(tmp_path: Path) -> None:
    path = tmp_path / "ratekeeper.yaml"
    path.write_text(CONFIG)
    for extra, env, warned, open_ in [
        (("--host", "0.0.0.0"), {}, True, True),
        (("--host", "0.0.0.0", "--no-auth-warning"), {}, False, True),
        (("--host", "0.0.0.0"), {"RATEKEEPER_ADMIN_TOKEN": TOKEN}, False, False),
        ((), {}, False, False),  # loopback
    ]:
        proc = ServiceProcess(path, grpc=False, extra=extra, env=env)
        try:
            health = httpx.get(f"http://127.0.0.1:{proc.port}/healthz", timeout=10).json()
        finally:
            logs = proc.stop()
        assert ("without tokens" in logs) is warned, (extra, logs)
        assert health["open_to_network"] is open_, (extra, health)
