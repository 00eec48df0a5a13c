"""Headless Chromium driven over the DevTools protocol (a small websocket client), for the
dashboard and HTML report tests. Debian's ``chromium``; started on a free port with a fresh
profile, stopped by PID. Missing Chromium skips the test, except in CI, where it fails."""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import ClientConnection, connect

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--remote-debugging-port=0", "--window-size=1280,900",
]  # fmt: skip
SCREENSHOTS = Path(__file__).resolve().parent.parent / "build" / "screenshots"


def chromium_path() -> str:
    """The Chromium binary, or skip (fail in CI, where scripts/test installs it)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("CI"):
        pytest.fail("chromium is required in CI (scripts/test installs it) but is missing")
    pytest.skip("chromium not installed")


class Browser:
    """One Chromium process and one page; console errors and exceptions are collected."""

    def __init__(self) -> None:
        self.profile = tempfile.mkdtemp(prefix="rk-chromium-")
        self.proc = subprocess.Popen(
            [chromium_path(), *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        port = self._port()
        deadline = time.monotonic() + 30
        page = None
        while page is None and time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                targets = json.load(r)
            page = next((t for t in targets if t.get("type") == "page"), None)
            if page is None:
                time.sleep(0.1)
        assert page is not None, "chromium opened no page"
        self._stack = contextlib.ExitStack()  # connect() is a context manager (websockets 17)
        self.ws: ClientConnection = self._stack.enter_context(
            connect(page["webSocketDebuggerUrl"], max_size=64 * 2**20)
        )
        self._ids = itertools.count(1)
        self.errors: list[str] = []
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")

    def _port(self) -> int:
        assert self.proc.stderr is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if m:
                return int(m.group(1))
            if not line and self.proc.poll() is not None:
                break
        self.close()
        raise RuntimeError("chromium did not start its DevTools endpoint")

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Call a DevTools method and return its result (events meanwhile are recorded)."""
        call_id = next(self._ids)
        self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv(timeout=30))
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result
            self._event(message)

    def _event(self, message: dict[str, Any]) -> None:
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.exceptionThrown":
            self.errors.append(json.dumps(params["exceptionDetails"])[:500])
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.errors.append(json.dumps(params.get("args"))[:500])
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            entry = params["entry"]
            if entry.get("url", "").endswith("/favicon.ico"):  # the browser's, not the page's
                return
            self.errors.append(f"{entry.get('text', '')[:400]} ({entry.get('url', '')})")

    def open(self, url: str) -> None:
        self.send("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'")

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)  # fmt: skip
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 20.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {expression}")

    def screenshot(self, name: str) -> Path:
        """Save a PNG of the page under build/screenshots/ (not committed) for a person."""
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path = SCREENSHOTS / f"{name}.png"
        path.write_bytes(base64.b64decode(data["data"]))
        return path

    def close(self) -> None:
        try:
            if hasattr(self, "_stack"):
                self._stack.close()
        finally:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
            shutil.rmtree(self.profile, ignore_errors=True)
