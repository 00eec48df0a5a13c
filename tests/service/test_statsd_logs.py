"""The statsd sink's names and packing, and the JSON log format (the whole path, a real
service sending to a UDP listener, is in test_upstream_env.py)."""

from __future__ import annotations

import json
import logging
import socket

import pytest

from ratekeeper.service import logs
from ratekeeper.service.statsd import MAX_DATAGRAM, StatsdSink, counters, datagrams, stat_name

EXPOSITION = """\
# TYPE ratekeeper_envoy_total_hits_total counter
ratekeeper_envoy_total_hits_total{domain="edge",key="user"} 4.0
ratekeeper_envoy_total_hits_total{domain="edge",key="generic_key_edge"} 2.0
# TYPE ratekeeper_envoy_over_limit_total counter
ratekeeper_envoy_over_limit_total{domain="edge",key="user"} 1.0
# TYPE ratekeeper_envoy_domain_not_found_total counter
ratekeeper_envoy_domain_not_found_total{domain="nowhere"} 3.0
# TYPE ratekeeper_config_reloads_total counter
ratekeeper_config_reloads_total{result="error"} 1.0
ratekeeper_config_reloads_total{result="ok"} 0.0
# TYPE ratekeeper_decisions_total counter
ratekeeper_decisions_total{outcome="allowed",policy="edge/user"} 3.0
"""


def test_upstreams_stat_names() -> None:
    assert counters(EXPOSITION) == {
        "ratelimit.service.rate_limit.edge.user.total_hits": 4.0,
        "ratelimit.service.rate_limit.edge.generic_key_edge.total_hits": 2.0,
        "ratelimit.service.rate_limit.edge.user.over_limit": 1.0,
        "ratelimit.service.rate_limit.nowhere.domain_not_found": 3.0,
        "ratelimit.service.config_load_error": 1.0,
        "ratelimit.service.config_load_success": 0.0,
    }
    assert stat_name("ratekeeper_store_errors_total", {}) == (
        "ratelimit.service.call.should_rate_limit.redis_error"
    )
    assert stat_name("ratekeeper_decisions_total", {"policy": "p"}) is None


def test_datagrams_stay_under_the_mtu_and_lose_nothing() -> None:
    lines = [(f"ratelimit.service.rate_limit.d.key_{i}.total_hits", i + 1) for i in range(200)]
    packed = datagrams(lines)
    assert len(packed) > 1 and all(len(d) <= MAX_DATAGRAM for d in packed)
    assert b"\n".join(packed).decode().splitlines() == [f"{n}:{v}|c" for n, v in lines]


def test_the_sink_sends_increases_only() -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    listener.settimeout(5)
    texts = [EXPOSITION, EXPOSITION.replace("} 4.0", "} 9.0")]
    sink = StatsdSink("http://unused/metrics", f"127.0.0.1:{listener.getsockname()[1]}", 10,
                      fetch=lambda url: texts.pop(0))  # fmt: skip
    try:
        assert sink.flush() == 5  # everything since the start (0.0 is not sent)
        first = listener.recv(65536).decode().splitlines()
        assert "ratelimit.service.rate_limit.edge.user.total_hits:4|c" in first
        assert sink.flush() == 1
        assert listener.recv(65536) == b"ratelimit.service.rate_limit.edge.user.total_hits:5|c"
    finally:
        listener.close()
        sink.stop()


def test_a_failed_scrape_is_logged_once_and_retried(caplog: pytest.LogCaptureFixture) -> None:
    def down(url: str) -> str:
        raise OSError("connection refused")

    sink = StatsdSink("http://127.0.0.1:9/metrics", "127.0.0.1:9", 10, fetch=down)
    with caplog.at_level(logging.WARNING, logger="ratekeeper.service"):
        assert sink.flush() == 0 and sink.flush() == 0
    assert [r.getMessage() for r in caplog.records].count(
        "statsd: cannot read http://127.0.0.1:9/metrics: connection refused; retrying every flush"
    ) == 1
    sink.stop()


def test_json_logs_are_one_object_a_line(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        logs.configure("INFO", "json", "worker 2")
        logging.getLogger("ratekeeper.service").info("config reloaded: %d files", 3)
        logging.getLogger("ratekeeper.service").debug("not shown")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        for name in logs.NAMES:
            logging.getLogger(name).setLevel(logging.NOTSET)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["level"] == "info" and record["msg"] == "config reloaded: 3 files"
    assert record["worker"] == "worker 2" and record["logger"] == "ratekeeper.service"
    assert record["time"].endswith("Z")
