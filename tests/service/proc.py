"""A real ``ratekeeper serve`` process on free ports, stopped by PID."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

_LISTEN = re.compile(r"http://[^:]+:(\d+)(?: and gRPC \(Envoy RLS\) on [^ ]+:(\d+))?")


class ServiceProcess:
    """Starts ``ratekeeper serve`` and learns its ports from the line it prints."""

    def __init__(
        self,
        *configs: Path,
        env: dict[str, str] | None = None,
        grpc: bool = True,
        extra: tuple[str, ...] = (),
        preexec_fn: Callable[[], None] | None = None,
        argv: list[str] | None = None,
        cwd: Path | None = None,
    ):
        """``argv``: the whole command instead of one built from the other arguments."""
        args = [sys.executable, "-m", "ratekeeper.cli", "serve", "--port", "0", *extra]
        args += ["--grpc-port", "0"] if grpc else ["--no-grpc"]
        for c in configs:
            args += ["--config", str(c)]
        self.proc = subprocess.Popen(
            argv or args,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
            preexec_fn=preexec_fn,
            cwd=cwd,
        )
        self.banner = self._read_banner()
        m = _LISTEN.search(self.banner)
        assert m is not None, self.banner
        self.port = int(m.group(1))
        self.grpc_port = int(m.group(2)) if m.group(2) else None
        self.url = f"http://127.0.0.1:{self.port}"

    def _read_banner(self, timeout: float = 20.0) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                line = self.proc.stdout.readline()
                if "serving HTTP" in line:
                    return line
            if self.proc.poll() is not None:
                break
        self.stop()
        err = self.proc.stderr.read() if self.proc.stderr else ""
        raise RuntimeError(f"ratekeeper serve did not start: {err}")

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 10.0) -> str:
        """Stop the process (by PID) and return what it wrote to stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.stderr.read() if self.proc.stderr else ""


def run_serve(*args: str, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
    """Run ``ratekeeper serve`` expecting it to exit (e.g. on a bad config)."""
    return subprocess.run(
        [sys.executable, "-m", "ratekeeper.cli", "serve", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
