"""A real ``ratekeeper serve`` process on free ports, stopped by PID."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

_LISTEN = re.compile(r"http://[^:]+:(\d+)(?: and gRPC \([^)]*\) on [^ ]+:(\d+))?")


IMAGE_ROOT = os.environ.get("RATEKEEPER_TEST_IMAGE_ROOT", "")
"""Set by scripts/test-image: the image's filesystem; services then run in it under chroot."""
IMAGE = json.loads(os.environ.get("RATEKEEPER_TEST_IMAGE_COMMAND", "{}"))
"""The image's user, environment, entrypoint and healthcheck (scripts/test-image)."""


def in_image(serve_args: list[str], env: dict[str, str], entrypoint: bool = True) -> list[str]:
    """The command running the image's entrypoint with ``serve_args`` as the image would:
    chrooted into its filesystem, as its user, with only its environment and ``env``. Paths
    below the image's root are given as the image sees them."""
    for value in [*serve_args, *env.values()]:
        readable(value)
    inside = [
        a.removeprefix(IMAGE_ROOT) if a.startswith(IMAGE_ROOT + "/") else a for a in serve_args
    ]
    env = {"HOST": "127.0.0.1", **env}  # tests listen on loopback only
    if "REDIS_URL" not in env:  # the image's environment means upstream's Redis socket
        env["RATEKEEPER_STORE"] = "memory"  # the memory store, as outside the image
    variables = [*IMAGE["env"], *(f"{k}={v}" for k, v in env.items())]
    head = IMAGE["entrypoint"] if entrypoint else []
    return ["chroot", f"--userspec={IMAGE['user']}", IMAGE_ROOT, "/usr/bin/env", "-i",
            *variables, *head, *inside]  # fmt: skip


def readable(path: str) -> None:
    """Let the image's user read ``path`` (pytest makes its directories 0700, for root)."""
    if not path.startswith(IMAGE_ROOT + "/") or not os.path.exists(path):
        return
    for parent in Path(path).parents:
        if len(str(parent)) <= len(IMAGE_ROOT):
            break
        parent.chmod(parent.stat().st_mode | 0o755)
    if os.path.isdir(path):
        os.chmod(path, os.stat(path).st_mode | 0o755)
        for root, dirs, files in os.walk(path):
            for name in dirs + files:
                full = os.path.join(root, name)
                os.chmod(full, os.stat(full).st_mode | (0o755 if name in dirs else 0o644))


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
        command = argv or args
        environ = {**os.environ, **(env or {})}
        if IMAGE_ROOT and argv is None:  # scripts/test-image: the same serve, in the image
            command = in_image(args[4:], env or {})
            environ = dict(os.environ)
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environ,
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
        err = self.stop()  # what it wrote to stderr (read once: stop reads it)
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
