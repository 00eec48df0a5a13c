"""Real ``redis-server`` processes for tests: standalone, primary+replica, 3-primary cluster.

Each server runs on a free loopback port with persistence off, in its own temp directory, and
is stopped by PID. Helpers can SIGKILL, SIGSTOP/SIGCONT and restart (empty) a server, which is
how the fault tests break Redis for real. No fakes anywhere.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")


def available() -> bool:
    """True when both redis-server and redis-cli are on PATH."""
    return REDIS_SERVER is not None and REDIS_CLI is not None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on, with port+10000 free too.

    Ports stay in 20000-45000 so a cluster node's bus port (port + 10000) is valid as well.
    """
    for _ in range(200):
        port = random.randint(20000, 45000)
        if _free(port) and _free(port + 10000):
            return port
    raise RuntimeError("no free loopback port found")


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class RedisServer:
    """One redis-server process on 127.0.0.1:port."""

    def __init__(self, port: int | None = None, *extra: str) -> None:
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None
        for attempt in range(3):  # a free port can be taken by another process before we bind
            self.port = port or free_port()
            self.dir = Path(tempfile.mkdtemp(prefix=f"rk-redis-{self.port}-"))
            try:
                self.start()
                return
            except RuntimeError:
                self.stop()
                if port is not None or attempt == 2:
                    raise

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)  # type: ignore[arg-type]

    def start(self) -> None:
        assert REDIS_SERVER is not None, "redis-server is not installed"
        args = [
            REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--dir", str(self.dir),
            "--protected-mode", "no", "--loglevel", "warning",
            "--repl-diskless-sync-delay", "0", *self.extra,
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.wait_ready()

    def wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"redis-server on port {self.port} exited at start")
            try:
                if self.client(socket_timeout=0.5).ping():
                    return
            except redis.RedisError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not become ready")

    def kill(self) -> None:
        """SIGKILL the process (a crash) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def pause(self) -> None:
        """SIGSTOP: the process holds its port but answers nothing."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after ``pause``."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def restart(self) -> None:
        """Kill and start again on the same port: data and script cache are gone."""
        self.kill()
        self.start()

    def stop(self) -> None:
        """Stop by PID (SIGTERM, then SIGKILL) and remove the temp directory."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
                self.proc.terminate()
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def start_replica(primary: RedisServer, timeout: float = 10.0) -> RedisServer:
    """A replica of ``primary`` (``--replicaof``), returned once its link is up and synced."""
    replica = RedisServer(None, "--replicaof", "127.0.0.1", str(primary.port))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = replica.client().info("replication")
        if info.get("master_link_status") == "up" and not info.get("master_sync_in_progress"):
            return replica
        time.sleep(0.05)
    replica.stop()
    raise RuntimeError("replica did not sync")


def wait_replicated(primary: RedisServer, timeout: float = 5.0) -> None:
    """Block until every replica has acknowledged the primary's writes so far."""
    primary.client().execute_command("WAIT", 1, int(timeout * 1000))  # type: ignore[no-untyped-call]  # untyped in redis-py


class RedisCluster:
    """Three primaries (no replicas) joined with ``redis-cli --cluster create``."""

    def __init__(self, size: int = 3) -> None:
        self.nodes: list[RedisServer] = []
        try:
            self._create(size)
        except BaseException:
            self.stop()  # never leave nodes running when the cluster could not be built
            raise

    def _create(self, size: int) -> None:
        for _ in range(size):
            self.nodes.append(
                RedisServer(None, "--cluster-enabled", "yes", "--cluster-node-timeout", "2000",
                            "--cluster-config-file", "nodes.conf")
            )  # fmt: skip
        assert REDIS_CLI is not None
        addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run(
            [REDIS_CLI, "--cluster", "create", *addrs, "--cluster-replicas", "0", "--cluster-yes"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if all(n.client().cluster("info").get("cluster_state") == "ok" for n in self.nodes):
                return
            time.sleep(0.1)
        raise RuntimeError("cluster did not reach state ok")

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


REDIS_SENTINEL = shutil.which("redis-sentinel")


def sentinel_available() -> bool:
    """True when redis-sentinel is on PATH as well."""
    return available() and REDIS_SENTINEL is not None


class SentinelProcess:
    """One redis-sentinel on 127.0.0.1:port monitoring ``primary`` as ``service`` (quorum 2)."""

    def __init__(self, service: str, primary: RedisServer, down_after_ms: int) -> None:
        assert REDIS_SENTINEL is not None, "redis-sentinel is not installed"
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=f"rk-sentinel-{self.port}-"))
        conf = self.dir / "sentinel.conf"  # Sentinel rewrites its config: a file of its own
        conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\nprotected-mode no\ndir {self.dir}\n"
            f"loglevel warning\nsentinel monitor {service} 127.0.0.1 {primary.port} 2\n"
            f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
            f"sentinel failover-timeout {service} {4 * down_after_ms}\n"
            f"sentinel parallel-syncs {service} 1\n"
        )
        self.proc = subprocess.Popen(
            [REDIS_SENTINEL, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)


class SentinelGroup:
    """A primary, ``replicas`` replicas of it and three Sentinels that monitor it as
    ``service``, returned once every Sentinel knows the others and the replicas.

    ``down_after_ms`` is how long the primary must not answer before a Sentinel calls it down
    (the failover starts about then); Redis' default is 30 s, tests use 1 s.
    """

    def __init__(
        self, service: str = "rk-primary", replicas: int = 1, down_after_ms: int = 1000
    ) -> None:
        self.service = service
        self.servers: list[RedisServer] = []
        self.sentinels: list[SentinelProcess] = []
        try:
            primary = RedisServer()
            self.servers.append(primary)
            for _ in range(replicas):
                self.servers.append(start_replica(primary))
            self.sentinels = [SentinelProcess(service, primary, down_after_ms) for _ in range(3)]
            self._wait_known(replicas)
        except BaseException:
            self.stop()
            raise

    def _wait_known(self, replicas: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                states: list[dict[str, Any]] = [
                    s.client().sentinel_master(self.service)  # type: ignore[misc]  # a dict here
                    for s in self.sentinels
                ]
                if all(
                    int(st["num-other-sentinels"]) == 2 and int(st["num-slaves"]) == replicas
                    for st in states
                ):
                    return
            except redis.RedisError:
                pass
            time.sleep(0.1)
        raise RuntimeError("the Sentinels did not find each other and the replicas")

    @property
    def urls(self) -> list[str]:
        """The Sentinels' URLs."""
        return [s.url for s in self.sentinels]

    def primary_port(self) -> int:
        """The primary's port as the first Sentinel that answers names it."""
        for sentinel in self.sentinels:
            try:
                addr: Any = sentinel.client().sentinel_get_master_addr_by_name(self.service)
                _host, port = addr
                return int(port)
            except (redis.RedisError, TypeError):
                continue
        raise RuntimeError("no Sentinel answered")

    def primary(self) -> RedisServer:
        """The server Sentinel names as the primary."""
        port = self.primary_port()
        return next(s for s in self.servers if s.port == port)

    def wait_promoted(self, old_port: int, timeout: float = 60.0) -> RedisServer:
        """Block until every Sentinel names a primary other than ``old_port`` and it answers
        as a primary; returns it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                addrs: list[Any] = [
                    s.client().sentinel_get_master_addr_by_name(self.service)
                    for s in self.sentinels
                ]
                ports = {int(addr[1]) for addr in addrs}
            except (redis.RedisError, TypeError):
                ports = set()
            if len(ports) == 1 and old_port not in ports:
                new = next(s for s in self.servers if s.port in ports)
                if new.client().info("replication")["role"] == "master":
                    return new
            time.sleep(0.05)
        raise RuntimeError("no replica was promoted")

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in self.servers:
            server.stop()
