"""Store URLs whose user name and password hold each printable ASCII character, raw and
percent-encoded, in redis, rediss, unix and Sentinel URLs: the password never shows, in any
message, ``repr``, log line, ``stats()``, ``/healthz``, ``/metrics`` or config error, whether
the URL is refused or its store is built and fails to connect; and ``check-config`` refuses
exactly the URLs ``serve`` refuses (the same check). Then the whole commands, on the
password of a real report."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import string
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote

import pytest

from ratekeeper.errors import ConfigError, StoreUnavailable
from ratekeeper.service.config import loader as config
from ratekeeper.service.server import ServeOptions, Service
from ratekeeper.stores.redis.urls import check_url, redact, scrub

PRINTABLE = string.printable[:95]  # 0x20 to 0x7e: every printable ASCII character
PIECES = ("S3cr", "tP4ss", "W0rd")
"""The password is built of these around the character under test; none may show."""


def secret(char: str) -> str:
    return char.join(PIECES)


def user(char: str) -> str:
    return f"us{char}er"


def stores(char: str, port: int, encode: bool) -> dict[str, dict[str, object]]:
    """A config's ``store:`` section of each kind, holding ``char`` in user and password."""
    name, password = user(char), secret(char)
    if encode:
        name, password = quote(name, safe=""), quote(password, safe="")
    auth = f"{name}:{password}@"
    server = f"redis://{auth}127.0.0.1:{port}/0"
    sentinel = {"service": "m", "sentinels": [f"redis://{auth}127.0.0.1:{port}"]}
    return {
        "redis": {"url": server},
        "rediss": {"url": server.replace("redis://", "rediss://")},
        "unix": {"url": f"unix://{auth}/tmp/rk-no-such-{port}.sock?db=0"},
        "sentinel": {"sentinel": {**sentinel, "url": f"redis://{auth}/0"}},
    }


def shows_no_secret(text: str) -> bool:
    return not any(piece in text for piece in PIECES)


def exercise(path: Path, caplog: pytest.LogCaptureFixture) -> tuple[bool, list[str]]:
    """Build the service from ``path`` as ``serve`` does and use its store (which answers
    nothing): whether the config was refused, and every text it produced."""
    texts: list[str] = []
    try:
        service = Service(ServeOptions((str(path),), grpc_port=None, store_wait=0))
    except ConfigError as exc:
        return True, [str(exc)]

    async def use() -> None:
        texts.append(str(await service.check_store()))
        texts.append(json.dumps(await service.health()))
        for _ in range(3):
            decision = await service.engine.limiter.hit("k", "5/second")
            assert decision.degraded
        try:
            await service.engine.limiter.check()
        except StoreUnavailable as exc:
            texts.append(f"{exc!r} {exc}")

    asyncio.run(use())
    texts += [repr(service.store), repr(service._raw_store), str(service.engine.limiter.stats())]
    texts.append(service.metrics.exposition().decode())
    texts += [r.getMessage() for r in caplog.records]
    return False, texts


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port bound and not listening for the test's length: a connection is refused, and
    no other server can take the port meanwhile."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.mark.parametrize("encode", [False, True], ids=["raw", "percent-encoded"])
def test_no_character_shows_the_password(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, encode: bool, closed_port: int
) -> None:
    caplog.set_level(logging.DEBUG)
    port = closed_port  # every store fails to connect
    seen: dict[str, list[str]] = {}
    for char in PRINTABLE:
        for kind, store in stores(char, port, encode).items():
            caplog.clear()
            path = tmp_path / "rk.yaml"
            section = json.dumps({**store, "socket_timeout": 0.2})  # JSON is YAML
            path.write_text(f"store: {section}\npolicies:\n  p:\n    rate: 5/second\n")
            refused, texts = exercise(path, caplog)
            bad = [t for t in texts if not shows_no_secret(t)]
            assert not bad, (kind, char, bad)
            seen.setdefault(kind, []).append("refused" if refused else "built")
            if encode:  # percent-encoded, every URL means what it says: none is refused
                assert not refused, (kind, char, texts)
    if not encode:  # each kind refuses '/', '?', '#' (they would cut the URL short)
        for kind, verdicts in seen.items():
            refused = {c for c, v in zip(PRINTABLE, verdicts, strict=True) if v == "refused"}
            assert {"/", "?", "#"} <= refused, (kind, refused)


@pytest.mark.parametrize("char", PRINTABLE)
def test_redact_and_scrub_hide_the_password(char: str) -> None:
    encoded = quote(user(char), safe="") + ":" + quote(secret(char), safe="")
    for raw in (f"{user(char)}:{secret(char)}", encoded):
        for url in (
            f"redis://{raw}@h:6379/0",
            f"rediss://{raw}@h/1?ssl_ca_certs=/x&password=abc",
            f"unix://{raw}@/tmp/r.sock?db=0",
            f"redis://{raw}@/0",
        ):
            assert shows_no_secret(redact(url)), url
            password = unquote(raw.split(":", 1)[1])  # a driver's (the user: up to the 1st ':')
            message = f"could not use {url}: {password} and {quote(password, safe='')}"
            assert shows_no_secret(scrub(message, url)), url
            try:
                check_url(url, host="@/0" not in url)
            except ConfigError as exc:
                assert shows_no_secret(str(exc)), (url, str(exc))


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ratekeeper.cli", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "url",
    [
        "redis://default:Zm9v/YmFy+c2VjcmV0@127.0.0.1:6399/0",  # the report's password
        "redis://default:S3cr?tP4ss#W0rd@127.0.0.1:6399/0",
        "redis://127.0.0.1:6399/x",  # a database that is not a number
        "redis://127.0.0.1:99999/0",
        "rediss://127.0.0.1:6399/0?ssl_cert_reqs=maybe",
    ],
)
def test_check_config_refuses_what_serve_refuses(tmp_path: Path, url: str) -> None:
    path = tmp_path / "rk.yaml"
    path.write_text(f"store: {json.dumps({'url': url})}\npolicies:\n  p:\n    rate: 5/second\n")
    checked = check_config(path)
    served = subprocess.run(
        [sys.executable, "-m", "ratekeeper.cli", "serve", "--config", str(path), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 1 and served.returncode == 2, (checked, served)
    for text in (checked.stdout, checked.stderr, served.stdout, served.stderr):
        assert "Zm9v" not in text and "YmFy" not in text and shows_no_secret(text), text
    assert "Traceback" not in served.stderr
    shown = next(line for line in checked.stderr.splitlines() if ":" in line)
    assert shown.split(": ", 1)[1] in served.stderr  # the same problem, said the same way


def test_the_sentinel_urls_of_the_report(tmp_path: Path) -> None:
    sentinel = {
        "service": "m",
        "sentinels": ["redis://default:Zm9v/YmFy+c2VjcmV0@127.0.0.1:26399"],
        "url": "redis://:Zm9v/YmFy+c2VjcmV0@/0",
    }
    for field in ("sentinels", "url"):
        body = dict(sentinel)
        if field == "sentinels":
            body["url"] = "redis:///0"
        else:
            body["sentinels"] = ["redis://127.0.0.1:26399"]
        path = tmp_path / "rk.yaml"
        path.write_text(
            f"store: {json.dumps({'sentinel': body})}\npolicies:\n  p:\n    rate: 5/s\n"
        )
        checked = check_config(path)
        assert checked.returncode == 1, checked
        assert "Zm9v" not in checked.stderr + checked.stdout and "percent-encode" in checked.stderr
        with pytest.raises(ConfigError) as refused:
            config.load([str(path)])
        assert "Zm9v" not in str(refused.value)
