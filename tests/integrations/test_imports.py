"""Optional dependencies stay optional: each integration and each compat module imports its own
framework, and only it (never the peer it stands in for)."""

from __future__ import annotations

import subprocess
import sys

import pytest

FRAMEWORKS = (
    "starlette", "fastapi", "flask", "werkzeug", "django", "rest_framework", "uvicorn",
    "slowapi", "flask_limiter", "django_ratelimit", "limits",
)  # fmt: skip


def imported_after(module: str) -> list[str]:
    code = f"import sys, {module}; print(','.join(m for m in {FRAMEWORKS!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [m for m in out.stdout.strip().split(",") if m]


@pytest.mark.parametrize(
    "module",
    [
        "ratekeeper",
        "ratekeeper.middleware",
        "ratekeeper.integrations",
        "ratekeeper.integrations.routes",
        "ratekeeper.integrations.settings",
        "ratekeeper.compat",
        "ratekeeper.compat.limits_syntax",
    ],
)
def test_the_core_imports_no_framework(module: str) -> None:
    assert imported_after(module) == []


@pytest.mark.parametrize(
    ("module", "allowed"),
    [
        ("ratekeeper.integrations.fastapi", {"fastapi", "starlette"}),
        ("ratekeeper.integrations.flask", {"flask", "werkzeug"}),
        ("ratekeeper.integrations.django", {"django"}),
        ("ratekeeper.integrations.drf", {"django", "rest_framework"}),
        ("ratekeeper.compat.slowapi", {"fastapi", "starlette"}),
        ("ratekeeper.compat.flask_limiter", {"flask", "werkzeug"}),
        ("ratekeeper.compat.django_ratelimit", {"django"}),
        ("ratekeeper.compat.drf", {"django", "rest_framework"}),
    ],
)
def test_an_integration_imports_only_its_framework(module: str, allowed: set[str]) -> None:
    assert set(imported_after(module)) <= allowed
