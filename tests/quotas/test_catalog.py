"""Plans as data: read from YAML or a dict, every problem refused at load and named."""

from __future__ import annotations

from pathlib import Path

import pytest

from ratekeeper import ConfigError, Rate
from ratekeeper.calendar import Calendar
from ratekeeper.quotas import Override, PlanLimit, Plans, TenantPlan

GOOD = """\
default: free
plans:
  free:
    api: 100/hour
    exports: {rate: 10/calendar-month, status: 403}
  pro:
    api: {rate: 20/second; 5000/hour, algorithm: token_bucket}
    exports: {rate: 1000/calendar-month, timezone: Europe/Berlin, anchor: "15", unit: requests}
customers:
  acme: pro
  initech:
    plan: pro
    overrides: {api: {rate: 20000/hour, until: "2031-07-01T00:00:00Z", by: sales}}
"""


def test_a_plans_file_reads_plans_limits_and_customers(tmp_path: Path) -> None:
    path = tmp_path / "plans.yaml"
    path.write_text(GOOD)
    plans = Plans.load(path)
    assert plans.default == "free"
    assert plans.limit_names == ("api", "exports")
    exports = plans.limit("pro", "exports")
    assert exports.rates == (
        Rate.per_calendar(1000, "month", timezone="Europe/Berlin", anchor="15").with_unit(
            "requests"
        ),
    )
    assert exports.rates[0].calendar == Calendar("month", "Europe/Berlin", "15 00:00")
    assert plans.limit("free", "exports").status == 403
    api = plans.limit("pro", "api")
    assert api.algorithm == "token_bucket" and len(api.rates) == 2
    assert api.policy.slots == ("api|t:1s", "api|t:1h")  # named after the limit, not the rate
    assert plans.customers["acme"] == TenantPlan("pro")
    override = plans.customers["initech"].overrides["api"]
    assert override.spec == "20000/hour" and override.by == "sales"
    assert override.until == 1940630400.0  # 2031-07-01T00:00:00Z


def test_limits_of_every_plan_share_their_counters() -> None:
    plans = Plans.from_yaml(GOOD)
    assert plans.limit("free", "api").policy.slots == ("api|f:1h",)
    # a tenant moving from free to pro keeps the hour's count of the same algorithm and window
    assert plans.limit("free", "api").policy.slots[0] in ("api|f:1h",)


@pytest.mark.parametrize(
    ("text", "problems"),
    [
        (
            "default: free\nplans:\n  free:\n    api: 100/huor\n",
            ["<plans>:4: rate unit 'huor'"],
        ),
        (
            "default: free\nplans:\n  free:\n    api: {rate: 100/hour, algoritm: gcra}\n",
            ["<plans>:4: unknown key 'algoritm' in limit 'api'"],
        ),
        (
            "default: fre\nplans:\n  free:\n    api: 100/hour\n",
            ["<plans>:1: default plan 'fre' is not one of the plans"],
        ),
        (
            "default: free\nplns:\n  free:\n    api: 100/hour\n",
            ["<plans>:2: unknown key 'plns'", "'plans' must map plan names"],
        ),
        (
            "default: free\nplans:\n  free:\n    api: 100/hour\n  pro:\n    ap: 200/hour\n",
            ["<plans>:2: plan", "does not define"],
        ),
        (
            "default: free\nplans:\n  free:\n    api: -5/hour\n",
            ["<plans>:4: rate count '-5'"],
        ),
        (
            "default: free\nplans:\n  free:\n    api: {rate: 10/calendar-month, algorithm: gcra}\n",
            ["<plans>:4: rate 10/calendar-month counts calendar periods"],
        ),
        (
            "default: free\nplans:\n  free:\n    api: {rate: 10/hour, timezone: Europe/Berlin}\n",
            ["<plans>:4: timezone and anchor apply to calendar rates"],
        ),
        (
            "default: free\nplans:\n  free:\n"
            "    api: {rate: 10/calendar-month, timezone: Mars/Base}\n",
            ["<plans>:4: time zone 'Mars/Base' is unknown"],
        ),
        (
            "default: free\nplans:\n  free:\n"
            "    api: {rate: 10/calendar-month, anchor: '31 25:00'}\n",
            ["<plans>:4: calendar anchor '31 25:00' is invalid"],
        ),
        (
            "default: free\nplans:\n  free:\n    api: {rate: 10/hour, status: 500}\n",
            ["<plans>:4: status 500 of limit 'api' is invalid"],
        ),
        (
            "default: free\nplans:\n  free:\n    api: 10/hour\ncustomers:\n  acme: enterprise\n",
            ["<plans>:6: plan 'enterprise' of tenant 'acme' is not one of the plans"],
        ),
        (
            "default: free\nplans:\n  free:\n    api: 10/hour\n"
            "customers:\n  acme: {plan: free, overrides: {api: {rate: 5/hour, until: tomorrow}}}\n",
            ["<plans>:6: until 'tomorrow' is invalid"],
        ),
        (
            "default: free\nplans:\n  free:\n    api: 10/hour\n    api: 20/hour\n",
            ["<plans>:5: key 'api' appears twice"],
        ),
        ("default: [free\n", ["<plans>:"]),
        ("- a list\n", ["a plans file is a mapping"]),
    ],
)
def test_a_plans_file_with_a_typo_is_refused_naming_the_line(
    text: str, problems: list[str]
) -> None:
    with pytest.raises(ConfigError) as caught:
        Plans.from_yaml(text)
    for problem in problems:
        assert problem in str(caught.value)


def test_every_problem_of_a_file_is_reported_at_once() -> None:
    text = "default: free\nplans:\n  free:\n    api: 100/huor\n    exports: {rate: 5/day, x: 1}\n"
    with pytest.raises(ConfigError) as caught:
        Plans.from_yaml(text, "plans.yaml")
    lines = str(caught.value).splitlines()
    assert [line.split(":")[1] for line in lines] == ["4", "5"]
    assert all(line.startswith("plans.yaml:") for line in lines)


def test_a_dict_is_read_the_same_with_paths_instead_of_lines() -> None:
    with pytest.raises(ConfigError, match=r"plans: plans.free.api: rate unit 'huor'"):
        Plans.from_dict({"default": "free", "plans": {"free": {"api": "1/huor"}}})
    plans = Plans.from_dict({"default": "free", "plans": {"free": {"api": Rate(5, 60.0)}}})
    assert plans.limit("free", "api").rates[0].count == 5


def test_value_objects_refuse_garbage() -> None:
    with pytest.raises(ConfigError, match="status"):
        PlanLimit("api", Rate.parse("1/s"), status=500)
    with pytest.raises(ConfigError, match="limit name"):
        PlanLimit("a|b", Rate.parse("1/s"))
    with pytest.raises(ConfigError, match="must be epoch seconds"):
        Override("5/hour", until=float("inf"))
    with pytest.raises(ValueError, match="'-1'"):
        Override("-1/hour")
    with pytest.raises(ConfigError, match="must map limit names"):
        TenantPlan("pro", {"api": "5/hour"})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match="every plan must define every limit"):
        Plans({"a": {}, "b": {"x": PlanLimit("x", Rate.parse("1/s"))}}, "a")
    with pytest.raises(ConfigError, match="default plan"):
        Plans({"a": {"x": PlanLimit("x", Rate.parse("1/s"))}}, "b")
    long = "x" * 10_000
    assert len(Override("5/hour", by=long, reason=long).by) == 500
