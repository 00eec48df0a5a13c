"""Real processes for the gateway's load tests: the fake upstream and gateways under uvicorn,
each on a port it picked itself (port 0, read from its start line), stopped by PID."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
_RUNNING = re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)")


class Served:
    """``uvicorn <target>`` in a process of its own; ``url`` once it listens."""

    def __init__(
        self, target: str, env: dict[str, str] | None = None, factory: bool = False
    ) -> None:
        args = [
            sys.executable,
            "-m",
            "uvicorn",
            target,
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--log-level",
            "info",
            "--no-access-log",
            "--lifespan",
            "on",
        ]
        if factory:
            args.append("--factory")
        environ = {**os.environ, **(env or {}), "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(args, env=environ, stderr=subprocess.PIPE, cwd=ROOT)
        self.url = self._wait()

    def _wait(self, timeout: float = 30.0) -> str:
        assert self.proc.stderr is not None
        deadline = time.monotonic() + timeout
        seen = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stderr], [], [], 0.2)
            if ready:
                line = self.proc.stderr.readline()
                seen += line
                m = _RUNNING.search(line.decode(errors="replace"))
                if m:
                    return f"http://127.0.0.1:{m.group(1)}"
            if self.proc.poll() is not None:
                break
        self.stop()
        raise RuntimeError(f"uvicorn did not start: {seen.decode(errors='replace')[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(20)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


def gateway_env(config: dict[str, Any]) -> dict[str, str]:
    return {"RK_LLM_CONFIG": json.dumps(config)}
