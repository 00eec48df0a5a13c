"""Check configuration, Controls and the sync/async parity of the public surfaces."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from ratekeeper import (
    AsyncConcurrencyLimiter,
    AsyncFleetUsageShedder,
    ConcurrencyLimiter,
    FleetUsageShedder,
    ManualClock,
)
from ratekeeper.errors import ConfigError
from ratekeeper.middleware import (
    ConcurrencyCheck,
    Controls,
    RateCheck,
    RateLimitMiddleware,
    WSGIRateLimitMiddleware,
)


async def _noop(scope: Any, receive: Any, send: Any) -> None:
    pass


def test_bad_checks_fail_at_startup_naming_the_value() -> None:
    with pytest.raises(ValueError, match="10/fortnight"):
        RateCheck("api", "10/fortnight")
    with pytest.raises(ConfigError, match="algorithm 'leaky'"):
        RateCheck("api", "10/second", algorithm="leaky")
    with pytest.raises(ConfigError, match="cost=0"):
        RateCheck("api", "10/second", cost=0)
    with pytest.raises(ConfigError, match="capacity=-1"):
        ConcurrencyCheck("c", -1)
    with pytest.raises(ConfigError, match="check name ''"):
        RateCheck("", "1/s")
    with pytest.raises(ConfigError, match=r"\['api'\] are used twice"):
        WSGIRateLimitMiddleware(lambda e, s: [], [RateCheck("api", "1/s"), RateCheck("api", "2/s")])
    with pytest.raises(ConfigError, match="expected RateCheck"):
        RateLimitMiddleware(_noop, ["10/second"])  # type: ignore[list-item]  # bad on purpose


def test_controls_modes_and_precedence() -> None:
    with pytest.raises(ConfigError, match="'loud'"):
        Controls({"api": "loud"})
    with pytest.raises(ConfigError, match="'dark'"):
        Controls().set("api", "dark")
    flags = {"api": "off"}
    clock = ManualClock()
    controls = Controls({"api": "shadow"}, default="enforce", source=lambda: flags, monotonic=clock)
    assert controls.mode("api") == "off"  # the flag beats the code
    assert controls.mode("other") == "enforce"
    flags.clear()
    clock.advance(5)
    assert controls.mode("api") == "shadow"
    controls.clear("api")
    assert controls.mode("api") == "enforce"


def test_a_failing_flag_source_keeps_the_last_flags() -> None:
    clock = ManualClock()
    state = {"fail": False}

    def source() -> dict[str, str]:
        if state["fail"]:
            raise ConnectionError("redis down")
        return {"api": "off"}

    controls = Controls(source=source, monotonic=clock)
    assert controls.mode("api") == "off"
    state["fail"] = True
    clock.advance(60)
    assert controls.mode("api") == "off"


def test_flags_refresh_on_the_monotonic_clock_not_the_rate_clock() -> None:
    """A middleware whose rate clock is set back an hour still polls its flags."""
    wall, mono = ManualClock(), ManualClock()
    flags = {"api": "off"}
    controls = Controls(source=lambda: dict(flags), refresh_every=5, monotonic=mono)
    gate_app = WSGIRateLimitMiddleware(
        lambda environ, start: [], [RateCheck("api", "10/second")], clock=wall, controls=controls
    )
    assert gate_app.controls.mode("api") == "off"
    flags["api"] = "shadow"
    wall.advance(-3600)
    mono.advance(5)
    assert gate_app.controls.mode("api") == "shadow"


def _public(cls: type) -> dict[str, list[str]]:
    return {
        name: list(inspect.signature(getattr(cls, name)).parameters)
        for name in dir(cls)
        if not name.startswith("_") and callable(getattr(cls, name))
    }


@pytest.mark.parametrize(
    ("sync", "aio"),
    [
        (ConcurrencyLimiter, AsyncConcurrencyLimiter),
        (FleetUsageShedder, AsyncFleetUsageShedder),
        (WSGIRateLimitMiddleware, RateLimitMiddleware),
    ],
)
def test_sync_and_async_surfaces_match(sync: type, aio: type) -> None:
    assert _public(sync) == _public(aio)
    assert list(inspect.signature(sync).parameters) == list(inspect.signature(aio).parameters)


def test_middleware_imports_no_framework() -> None:
    import subprocess
    import sys

    code = (
        "import sys, ratekeeper.middleware; "
        "print([m for m in ('starlette', 'fastapi', 'flask', 'werkzeug', 'uvicorn', 'anyio') "
        "if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
