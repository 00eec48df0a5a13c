"""simulate with the service's YAML: policies keyed by a log field, Envoy descriptors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ratekeeper.cli import main

CONFIG = """
policies:
  api.core:
    rate: 10/minute
  api.beta:
    rate: 2/minute
    shadow: true
domains:
  - domain: edge
    descriptors:
      - key: remote_address
        rate_limit: {unit: minute, requests_per_unit: 5}
"""


def test_policies_and_descriptors_from_log_fields(tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    (tmp_path / "c.yaml").write_text(CONFIG)
    lines = [
        f'{{"time": {1_700_000_000 + i}, "ip": "{ip}", "user": "u"}}\n'
        for i in range(12)
        for ip in ("1.1.1.1",)
    ]
    lines += ['{"time": 1700000020, "ip": "2.2.2.2"}\n']
    (tmp_path / "log.jsonl").write_text("".join(lines))
    code = main(
        ["simulate", str(tmp_path / "log.jsonl"), "--config", str(tmp_path / "c.yaml"),
         "--key", "api.core=ip", "--key", "api.beta=user",
         "--descriptor", "edge=remote_address:ip", "--json", str(tmp_path / "r.json"),
         "--no-progress"]
    )  # fmt: skip
    assert code == 0
    limits = {x["name"]: x for x in json.loads((tmp_path / "r.json").read_text())["limits"]}
    core = limits["api.core"]
    assert (core["requests"], core["would_reject"]) == (13, 2)
    [top] = core["top_keys"]
    assert (top["key"], top["requests"], top["rejections"]) == ("1.1.1.1", 12, 2)
    assert (top["first_rejected"], top["last_rejected"]) == (1_700_000_010, 1_700_000_011)
    assert top["windows"] == {"10/1m": 2}  # the window that rejected, from the engine's answer
    beta = limits["api.beta"]
    assert beta["outcomes"]["shadow_rejected"] == 10  # 12 from user u, 2 allowed
    edge = limits["edge/remote_address"]
    assert edge["would_reject"] == 7
    assert edge["rates"][0]["suggestions"][0]["rate"] == "12/1m"


def test_a_policy_missing_from_the_config_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("yaml")
    (tmp_path / "c.yaml").write_text(CONFIG)
    (tmp_path / "log").write_text("")
    assert main(["simulate", str(tmp_path / "log"), "--config", str(tmp_path / "c.yaml"),
                 "--key", "nope=ip"]) == 2  # fmt: skip
    assert "no rate policy 'nope'" in capsys.readouterr().err


def test_the_service_replays_a_log_newest_first_as_in_time_order(tmp_path: Path) -> None:
    """A log of two rotated halves, newest first: the engine is built afresh for the sorted
    reading, and decides what it decides on the lines in time order."""
    pytest.importorskip("yaml")
    (tmp_path / "c.yaml").write_text(CONFIG)
    lines = [
        f'{{"time": {1_700_000_000 + i * 7}, "ip": "10.0.0.{i % 3}", "user": "u{i % 2}"}}\n'
        for i in range(400)
    ]
    (tmp_path / "sorted.jsonl").write_text("".join(lines))
    (tmp_path / "rotated.jsonl").write_text("".join(lines[200:] + lines[:200]))
    reports = {}
    for name in ("sorted", "rotated"):
        out = tmp_path / f"{name}.json"
        assert main(
            ["simulate", str(tmp_path / f"{name}.jsonl"), "--config", str(tmp_path / "c.yaml"),
             "--key", "api.core=ip", "--key", "api.beta=user",
             "--descriptor", "edge=remote_address:ip", "--json", str(out), "--no-progress"]
        ) == 0  # fmt: skip
        reports[name] = json.loads(out.read_text())
    assert reports["rotated"]["order"]["sorted"] and not reports["sorted"]["order"]["sorted"]
    assert reports["rotated"]["decided"] == 400
    assert reports["rotated"]["limits"] == reports["sorted"]["limits"]
    assert sum(x["would_reject"] for x in reports["sorted"]["limits"]) > 100
