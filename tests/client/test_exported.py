"""``ratekeeper.client``'s public names, and the imports it makes (none of the clients)."""

from __future__ import annotations

import subprocess
import sys

import ratekeeper.client

EXPECTED = {
    "Answer", "AsyncPacer", "LearnedPolicy", "Observation", "Outgoing", "Pacer", "Quota",
    "Retries", "RetryBudget", "WaitTooLong", "by_header", "by_path_segments", "outgoing",
    "read_headers",
}  # fmt: skip


def test_all_is_the_public_surface() -> None:
    assert set(ratekeeper.client.__all__) == EXPECTED
    for name in EXPECTED:
        assert hasattr(ratekeeper.client, name), name


def test_the_client_package_imports_no_http_client() -> None:
    code = (
        "import sys; import ratekeeper.client; "
        "print([m for m in ('httpx', 'requests', 'aiohttp', 'urllib3') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_each_drop_in_imports_only_its_own_client() -> None:
    for module, own in (("httpx", "httpx"), ("requests", "requests"), ("aiohttp", "aiohttp")):
        others = [m for m in ("httpx", "requests", "aiohttp") if m != own]
        code = (
            f"import sys; import ratekeeper.client.{module}; "
            f"print([m for m in {others!r} if m in sys.modules])"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "[]", (module, out.stdout)
