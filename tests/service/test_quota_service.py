"""Plans in the service: ``rate: plan:<limit>`` policies, ``GET /v1/status``, the admin API
and ``ratekeeper admin``, through a real ``ratekeeper serve`` on memory and on Redis."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ratekeeper.errors import ConfigError
from ratekeeper.service import config as config_mod
from tests.service.proc import ServiceProcess

ADMIN = "admin-token-quotas-0123456789"
CLIENT = "client-token-quotas-0123456789"
PLANS = """\
default: free
plans:
  free:
    api: 5/hour
    exports: {rate: 2/calendar-month, status: 403}
  pro:
    api: 1000/hour
    exports: {rate: 100/calendar-month}
customers:
  acme: pro
"""
REDIS_PLANS = "\n".join(PLANS.splitlines()[:-2]) + "\n"  # customers live in Redis


def _config(store: str, source: str = "file") -> str:
    return f"""\
{store}auth:
  token: {CLIENT}
  admin_token: {ADMIN}
quotas:
  plans: plans.yaml
  source: {source}
  tenant_separator: ":"
  ttl: 30
policies:
  api: {{rate: "plan:api"}}
  exports: {{rate: "plan:exports"}}
  search: {{rate: 3/minute}}
"""


def _serve(tmp_path: Path, store: str = "", source: str = "file") -> ServiceProcess:
    (tmp_path / "plans.yaml").write_text(REDIS_PLANS if source == "redis" else PLANS)
    path = tmp_path / "ratekeeper.yaml"
    path.write_text(_config(store, source))
    return ServiceProcess(path, grpc=False)


@pytest.fixture(params=["memory", "redis"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[ServiceProcess, str]]:
    store, source = "", "file"
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        store, source = f"store:\n  url: {url}\n  socket_timeout: 5\n", "redis"
    proc = _serve(tmp_path, store, source)
    yield proc, request.param
    proc.stop()


def _client(proc: ServiceProcess, token: str = ADMIN) -> httpx.Client:
    return httpx.Client(base_url=proc.url, timeout=10, headers={"Authorization": f"Bearer {token}"})


def _hit(c: httpx.Client, policy: str, key: str, cost: int = 1) -> bool:
    r = c.post("/v1/hit", json={"policy": policy, "key": key, "cost": cost})
    assert r.status_code == 200, r.text
    return bool(r.json()["allowed"])


def _rows(c: httpx.Client, key: str) -> dict[str, dict]:
    r = c.get("/v1/status", params={"key": key})
    assert r.status_code == 200, r.text
    return {row["name"]: row for row in r.json()["limits"]}


def test_plan_policies_status_and_admin(served: tuple[ServiceProcess, str]) -> None:
    proc, kind = served
    with _client(proc, CLIENT) as client, _client(proc) as admin:
        # the tenant is the key up to ":": each user of "bob" is counted on bob's plan
        assert [_hit(client, "api", "bob:u1") for _ in range(6)] == [True] * 5 + [False]
        assert _rows(client, "bob:u2")["api"]["used"] == 0
        # a plan's limit is no nested level (its policy's rates describe the default plan)
        levels = [{"policy": "search", "key": "k"}, {"policy": "api", "key": "bob:u1"}]
        r = client.post("/v1/hit", json={"levels": levels})
        assert r.status_code == 400 and "levels[1].policy" in r.text, r.text
        before = _rows(client, "bob:u1")
        again = _rows(client, "bob:u1")
        used = {n: (r["used"], r["remaining"]) for n, r in before.items()}
        assert used == {n: (r["used"], r["remaining"]) for n, r in again.items()}  # no charge
        assert before["api"]["used"] == 5 and before["api"]["plan"] == "free"
        assert before["exports"]["used"] == 0 and before["exports"]["rate"].endswith("month")
        assert before["search"]["kind"] == "policy" and before["search"]["used"] == 0
        # credit 2: two more go through, then rejected again
        r = admin.post(
            "/v1/admin/quotas/credit",
            json={"key": "bob:u1", "limit": "api", "units": 2, "by": "alice", "reason": "t1"},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["before"][0]["used"] == 5 and body["after"][0]["used"] == 3
        assert body["audit"]["by"].startswith("alice (admin token from 127.0.0.1")
        assert [_hit(client, "api", "bob:u1") for _ in range(3)] == [True, True, False]
        # debit and reset on a plain policy's counters
        r = admin.post("/v1/admin/quotas/debit", json={"key": "k", "limit": "search", "units": 3})
        assert r.status_code == 200 and r.json()["after"][0]["remaining"] == 0, r.text
        assert not _hit(client, "search", "k")
        r = admin.post("/v1/admin/quotas/reset", json={"key": "k", "limit": "search"})
        assert r.status_code == 200, r.text
        assert _hit(client, "search", "k")
        # the audit log has them all, newest first
        r = admin.get("/v1/admin/quotas/audit", params={"count": 3})
        assert [e["action"] for e in r.json()["entries"]] == ["reset", "debit", "credit"]
        if kind == "memory":  # a plans file: tenants change in the file
            r = admin.post("/v1/admin/quotas/plan", json={"tenant": "bob", "plan": "pro"})
            assert r.status_code == 409 and "plans file" in r.json()["error"], r.text
            return
        # source redis: move bob to pro, then override acme's exports until later
        r = admin.post("/v1/admin/quotas/plan", json={"tenant": "bob", "plan": "pro", "by": "a"})
        assert r.status_code == 200, r.text
        assert r.json()["audit"]["before"] == {"plan": "free"}
        rows = _rows(client, "bob:u1")
        assert rows["api"]["plan"] == "pro" and rows["api"]["used"] == 5  # counts kept
        assert _hit(client, "api", "bob:u1")
        r = admin.post(
            "/v1/admin/quotas/override",
            json={
                "tenant": "bob",
                "limit": "plan:exports",
                "rate": "7/calendar-month",
                "until": "2999-01-01T00:00:00Z",
            },
        )
        assert r.status_code == 200, r.text
        rows = _rows(client, "bob:x")
        assert rows["exports"]["limit"] == 7 and rows["exports"]["source"] == "override"
        r = admin.post(
            "/v1/admin/quotas/clear-override", json={"tenant": "bob", "limit": "exports"}
        )
        assert r.status_code == 200, r.text
        assert _rows(client, "bob:x")["exports"]["limit"] == 100


@pytest.mark.parametrize(
    ("path", "body", "status", "field", "named"),
    [
        ("credit", {"key": "k", "limit": "api", "units": -5}, 400, "units", "-5"),
        ("credit", {"key": "k", "limit": "api", "units": 10**15}, 400, "units", "1000000000000000"),
        ("credit", {"key": "k", "limit": "api", "units": "3"}, 400, "units", "'3'"),
        ("credit", {"key": "k", "limit": "api", "units": 1.5}, 400, "units", "1.5"),
        ("debit", {"key": "", "limit": "api", "units": 1}, 400, "key", "''"),
        ("debit", {"key": "k" * 600, "limit": "api", "units": 1}, 400, "key", "600"),
        ("reset", {"key": "k", "limit": "nope"}, 404, "limit", "'nope'"),
        ("reset", {"key": "k", "limit": "plan:nope"}, 404, "limit", "'plan:nope'"),
        ("reset", {"key": "k", "limit": "api", "extra": 1}, 400, "body", "extra"),
        ("plan", {"tenant": "bob", "plan": 5}, 400, "plan", "5"),
    ],
)
def test_hostile_admin_input_is_a_clear_4xx(
    tmp_path: Path, path: str, body: dict, status: int, field: str, named: str
) -> None:
    proc = _serve(tmp_path)
    try:
        with _client(proc) as admin:
            r = admin.post(f"/v1/admin/quotas/{path}", json=body)
            assert r.status_code == status, r.text
            assert r.json()["field"] == field and named in r.json()["error"], r.json()
            assert not _rows(admin, "k")["api"]["used"]  # nothing changed
            r = admin.get("/v1/status")
            assert r.status_code == 400 and r.json()["field"] == "key"
            r = admin.get("/v1/status?key=k&key=j")
            assert r.status_code == 400 and "twice" in r.json()["error"]
            r = admin.get("/v1/status?key=k&other=1")
            assert r.status_code == 400 and "'other'" in r.json()["error"]
            no = httpx.post(f"{proc.url}/v1/admin/quotas/reset", json={"key": "k", "limit": "api"})
            assert no.status_code == 401 and no.json()["field"] == "authorization"
            r = _client(proc, CLIENT).post("/v1/admin/quotas/reset", json=body)
            assert r.status_code == 403
    finally:
        assert "Traceback" not in proc.stop()


def test_override_and_plan_refusals_name_the_value(tmp_path: Path, redis_url: str) -> None:
    proc = _serve(tmp_path, f"store:\n  url: {redis_url}\n", "redis")
    try:
        with _client(proc) as admin:
            cases = [
                ({"tenant": "t", "plan": "gold"}, "plan", "'gold'"),
                ({"tenant": "", "plan": "pro"}, "tenant", "''"),
            ]
            for body, field, named in cases:
                r = admin.post("/v1/admin/quotas/plan", json=body)
                assert r.status_code == 400 and r.json()["field"] == field, r.text
                assert named in r.json()["error"]
            over = [
                ({"tenant": "t", "limit": "api", "rate": "lots"}, "rate", "lots"),
                ({"tenant": "t", "limit": "nope", "rate": "5/hour"}, "limit", "'nope'"),
                ({"tenant": "t", "limit": "api", "rate": "5/hour", "until": 1}, "until", "1"),
                (
                    {"tenant": "t", "limit": "api", "rate": "5/hour", "until": "soon"},
                    "until",
                    "soon",
                ),
            ]
            for body, field, named in over:
                r = admin.post("/v1/admin/quotas/override", json=body)
                assert r.status_code == 400 and r.json()["field"] == field, (body, r.text)
                assert named in r.json()["error"], r.text
    finally:
        assert "Traceback" not in proc.stop()


def test_credits_and_resets_with_traffic_in_flight_stay_exact(
    tmp_path: Path, redis_url: str
) -> None:
    """8 threads hit a 10000/hour limit while credits and debits land: the final count is
    exactly hits - credits + debits, as the admitted hits say."""
    plans = "default: big\nplans:\n  big:\n    api: 10000/hour\n"
    (tmp_path / "plans.yaml").write_text(plans)
    path = tmp_path / "ratekeeper.yaml"
    path.write_text(
        f"store:\n  url: {redis_url}\n  socket_timeout: 5\n"
        "quotas: {plans: plans.yaml}\npolicies:\n  api: {rate: 'plan:api'}\n"
    )
    proc = ServiceProcess(path, grpc=False)
    hits = [0] * 8

    def traffic(i: int) -> None:
        with httpx.Client(base_url=proc.url, timeout=10) as c:
            for _ in range(100):
                hits[i] += _hit(c, "api", "t")

    try:
        threads = [threading.Thread(target=traffic, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        with httpx.Client(base_url=proc.url, timeout=10) as admin:
            for n in range(20):
                action = "credit" if n % 2 else "debit"
                r = admin.post(
                    f"/v1/admin/quotas/{action}", json={"key": "t", "limit": "api", "units": 3}
                )
                assert r.status_code == 200, r.text
                one = r.json()
                delta = -3 if action == "credit" else 3
                assert one["after"][0]["used"] == one["before"][0]["used"] + delta
        for t in threads:
            t.join()
        with httpx.Client(base_url=proc.url, timeout=10) as c:
            assert sum(hits) == 800
            assert _rows(c, "t")["api"]["used"] == 800  # 10 credits and 10 debits of 3 cancel
    finally:
        proc.stop()


def test_config_refuses_plan_mistakes_with_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "plans.yaml").write_text("default: free\nplans:\n  free:\n    api: lots\n")
    path = tmp_path / "c.yaml"
    path.write_text(
        "quotas:\n  plans: plans.yaml\n  ttl: -1\n  colour: red\n"
        "policies:\n  a: {rate: 'plan:api', algorithm: gcra}\n"
    )
    with pytest.raises(ConfigError) as info:
        config_mod.load([str(path)])
    text = str(info.value)
    assert f"{path}:3: quotas.ttl -1" in text
    assert f"{path}:4: unknown key 'colour'" in text or f"{path}:4:" in text
    assert "plans.yaml:4" in text  # the plans file's own line
    (tmp_path / "plans.yaml").write_text("default: free\nplans:\n  free:\n    api: 5/hour\n")
    path.write_text("policies:\n  a: {rate: 'plan:api'}\n  b: {rate: 'plan:nope'}\n")
    with pytest.raises(ConfigError, match=r"c.yaml:2: rate 'plan:api' names a plan's limit; add"):
        config_mod.load([str(path)])
    path.write_text("quotas: {plans: plans.yaml}\npolicies:\n  b: {rate: 'plan:nope', burst: 2}\n")
    with pytest.raises(ConfigError, match=r"c.yaml:3: policy 'b' counts a plan's limit"):
        config_mod.load([str(path)])
    path.write_text("quotas: {plans: plans.yaml}\npolicies:\n  b: {rate: 'plan:nope'}\n")
    with pytest.raises(ConfigError, match=r"c.yaml:3: rate 'plan:nope' names no limit"):
        config_mod.load([str(path)])
    path.write_text("quotas: {plans: gone.yaml}\n")
    with pytest.raises(ConfigError, match=r"c.yaml:1: quotas.plans 'gone.yaml': cannot read"):
        config_mod.load([str(path)])


def test_a_reload_picks_up_a_changed_plans_file(tmp_path: Path) -> None:
    proc = _serve(tmp_path)
    try:
        with _client(proc) as admin:
            assert _rows(admin, "zed")["api"]["limit"] == 5
            (tmp_path / "plans.yaml").write_text(PLANS.replace("api: 5/hour", "api: 9/hour"))
            assert admin.post("/v1/admin/reload").json()["reloaded"] is True
            assert _rows(admin, "zed")["api"]["limit"] == 9
            (tmp_path / "plans.yaml").write_text(PLANS.replace("api: 5/hour", "api: x"))
            r = admin.post("/v1/admin/reload").json()
            assert r["reloaded"] is False and "plans.yaml:4" in r["error"]
            assert _rows(admin, "zed")["api"]["limit"] == 9  # the running plans stay
    finally:
        proc.stop()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ratekeeper.cli", "admin", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_admin_command_over_http_and_on_the_store(tmp_path: Path, redis_url: str) -> None:
    proc = _serve(tmp_path, f"store:\n  url: {redis_url}\n  socket_timeout: 5\n", "redis")
    try:
        with _client(proc, CLIENT) as client:
            for _ in range(5):
                _hit(client, "api", "carol")
        url = ["--url", proc.url, "--token", ADMIN]
        out = _cli(*url, "status", "carol")
        assert out.returncode == 0, out.stderr
        rows = {r["name"]: r for r in json.loads(out.stdout)["limits"]}
        assert rows["api"]["used"] == 5
        out = _cli(*url, "--by", "dave", "credit", "carol", "plan:api", "2")
        assert out.returncode == 0 and json.loads(out.stdout)["after"][0]["used"] == 3, out.stderr
        out = _cli(*url, "credit", "carol", "plan:api", "-2")
        assert out.returncode == 1 and "units -2 is invalid" in out.stderr
        out = _cli("--url", proc.url, "--token", "wrong" * 5, "status", "carol")
        assert out.returncode == 1 and "token" in out.stderr
        # directly on the store, through the service's config: the same counters
        config = str(tmp_path / "ratekeeper.yaml")
        out = _cli("--config", config, "--by", "erin", "reset", "carol", "api")
        assert out.returncode == 0, out.stderr
        assert '"by": "erin (ratekeeper admin on the store' in out.stdout
        assert "ratekeeper.audit" in out.stderr  # the audit line, logged
        with _client(proc, CLIENT) as client:
            assert _rows(client, "carol")["api"]["used"] == 0
        out = _cli(
            "--store", redis_url, "--plans", str(tmp_path / "plans.yaml"), "plan", "carol", "pro"
        )
        assert out.returncode == 1 and "plans file" in out.stderr  # --store: a file source
        out = _cli("--config", config, "plan", "carol", "gold")
        assert out.returncode == 1 and "'gold'" in out.stderr
    finally:
        proc.stop()
