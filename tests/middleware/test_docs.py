"""The examples in docs/middleware.md run as pasted (Redis URL pointed at a test server)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

DOC = Path(__file__).resolve().parents[2] / "docs" / "middleware.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_fastapi_example(redis_url: str) -> None:
    # the test server, with room for a loaded machine: a 50 ms timeout would fail open and
    # answer without headers, which is not what this example is about
    source = BLOCKS[0].replace(
        'RedisStore("redis://127.0.0.1:6379/0")', f'RedisStore("{redis_url}", socket_timeout=5)'
    )
    assert redis_url in source
    namespace: dict[str, Any] = {}
    exec(compile(source, "fastapi-example", "exec"), namespace)
    with TestClient(namespace["app"], client=("10.1.1.1", 1)) as client:
        response = client.get("/items", headers={"X-Forwarded-For": "198.51.100.1"})
        assert response.status_code == 200
        assert response.headers["X-RateLimit-Resource"] == "per-ip"
        assert client.post("/charges").status_code == 200
    assert namespace["controls"].stats()["per-ip"]["allowed"] == 2


def test_flask_example() -> None:
    namespace: dict[str, Any] = {"__name__": __name__}  # Flask(__name__) finds this package
    exec(compile(BLOCKS[1], "flask-example", "exec"), namespace)
    client = namespace["app"].test_client()
    response = client.get("/items", buffered=True, environ_base={"REMOTE_ADDR": "127.0.0.1"})
    assert response.status_code == 200
    assert response.headers["X-RateLimit-Resource"] == "per-ip"
    assert response.headers["RateLimit-Policy"].startswith('"per-ip.10/1s";q=10;w=1')


def test_overload_example() -> None:
    namespace: dict[str, Any] = {}
    exec(compile(BLOCKS[2], "overload-example", "exec"), namespace)
    with TestClient(namespace["app"]) as client:
        assert client.get("/reports").status_code == 200
        assert client.post("/charges").status_code == 200


def test_signals_example() -> None:
    from ratekeeper.middleware import WorkerCheck
    from ratekeeper.signals import Worst

    namespace: dict[str, Any] = {}
    exec(compile(BLOCKS[3], "signals-example", "exec"), namespace)
    check = namespace["check"]
    assert isinstance(check, WorkerCheck) and check.queue_delay is namespace["delay"]
    assert isinstance(check.shedder.utilization, Worst)
    assert 0 <= check.shedder.utilization() <= 1
