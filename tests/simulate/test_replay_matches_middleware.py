"""simulate reports exactly the rejections the middleware produces on the same traffic.

The same generated log is (1) replayed by ``ratekeeper simulate --checks`` and (2) sent, one
WSGI request per line, through ``WSGIRateLimitMiddleware`` with a ManualClock set to each
line's time and an app answering the logged status (so 304s are refunded in both), in the
order simulate decides lines of one second in (``order.order_key``).
"""

from __future__ import annotations

import io
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ratekeeper import ManualClock
from ratekeeper.cli import main
from ratekeeper.middleware import WSGIRateLimitMiddleware
from ratekeeper.simulate.reading.logs import LogReader
from ratekeeper.simulate.reading.order import order_key
from tests.simulate.traffic import Line, generate

CHECKS = """
from ratekeeper.middleware import RateCheck, keys

checks = [
    RateCheck("per-ip", "30/minute", key=keys.client_ip()),
    RateCheck("login", "3/minute", key=keys.client_ip(), routes=["/login"], methods=["POST"]),
    RateCheck("user-burst", "4/second", algorithm="token_bucket", burst=6, key=keys.user()),
    RateCheck("writes", "10/minute", algorithm="sliding_window", key=keys.user(),
              methods=["POST"]),
    # a rate computed per request: POSTs get a tighter one, other requests none
    RateCheck("per-method", lambda r: "6/minute" if r.method == "POST" else None,
              key=keys.client_ip()),
]
"""


def enforce(lines: list[Line], checks: list[Any], mode: str) -> tuple[Counter[str], Counter[str]]:
    """Rejections per check, and per (check, key), from the real WSGI middleware."""
    from ratekeeper.middleware import Controls

    clock = ManualClock(0.0)
    status = {"code": 200}

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response(f"{status['code']} X", [])
        return [b""]

    mw = WSGIRateLimitMiddleware(app, checks, clock=clock, controls=Controls(default=mode))
    per_check: Counter[str] = Counter()
    per_key: Counter[str] = Counter()
    for line in lines:
        clock.set(line.time)
        status["code"] = line.status
        environ = {
            "REQUEST_METHOD": line.method,
            "PATH_INFO": line.path,
            "REMOTE_ADDR": line.ip,
            "wsgi.input": io.BytesIO(),
        }
        if line.user:
            environ["REMOTE_USER"] = line.user
        got: dict[str, Any] = {}

        def start_response(s: str, headers: list[tuple[str, str]], *exc: Any) -> None:
            got["status"], got["headers"] = s, dict(headers)  # noqa: B023

        result = mw(environ, start_response)
        if hasattr(result, "close"):
            result.close()
        if got["status"].startswith("429"):
            name = got["headers"]["X-RateLimit-Resource"]
            per_check[name] += 1
            key = line.user if name in ("user-burst", "writes") else line.ip
            per_key[f"{name} {key}"] += 1
    shadow = mw.controls.stats()
    if mode == "shadow":
        per_check = Counter({n: c["shadow_rejected"] for n, c in shadow.items()})
    return per_check, per_key


@pytest.mark.parametrize("mode", ["enforce", "shadow"])
def test_simulate_reports_the_rejections_the_middleware_makes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str
) -> None:
    lines = generate()
    log = tmp_path / "access.log"
    log.write_text("".join(line.combined() for line in lines))
    keys = [order_key(e) for e in LogReader().read(io.BytesIO(log.read_bytes()))]
    lines = [line for _, _, line in sorted(zip(keys, range(len(lines)), lines, strict=True))]
    (tmp_path / "simchecks.py").write_text(CHECKS)
    sys.path.insert(0, str(tmp_path))
    try:
        import simchecks  # type: ignore[import-not-found]

        code = main(
            ["simulate", str(log), "--checks", "simchecks:checks", "--mode", mode,
             "--json", str(tmp_path / "r.json"), "--no-progress", "--top", "50"]
        )  # fmt: skip
        assert code == 0
        report = json.loads((tmp_path / "r.json").read_text())
        expected, per_key = enforce(lines, simchecks.checks, mode)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("simchecks", None)
    got = {limit["name"]: limit["would_reject"] for limit in report["limits"]}
    assert got == {name: expected.get(name, 0) for name in got}
    assert sum(got.values()) > 100  # the heavy hitters were limited
    assert report["parsed"] == len(lines) and report["unparsable"] == 0
    if mode == "enforce":
        for limit in report["limits"]:
            for top in limit["top_keys"]:
                assert per_key[f"{limit['name']} {top['key']}"] == top["rejections"]
        per_ip = next(limit for limit in report["limits"] if limit["name"] == "per-ip")
        assert {t["key"] for t in per_ip["top_keys"][:3]} == {f"203.0.113.{i}" for i in range(3)}
    out = capsys.readouterr().out
    assert "per-ip" in out and "would reject" in out
