"""``ratekeeper serve --workers N``: one supervisor process and N worker processes that share
the HTTP and gRPC ports (SO_REUSEPORT: the kernel spreads new connections over the workers).

The supervisor

- refuses a memory store (its counters live in one process: every worker would enforce its
  own limits) with a message saying to use Redis;
- reserves both ports (bound with SO_REUSEPORT, never listening), so ``--port 0`` gives every
  worker the same free port and another program cannot take it between restarts;
- starts each worker as ``ratekeeper serve ... --worker-index I`` on the reserved ports and
  prints one banner once all of them listen;
- restarts a worker that dies, after 0.1 s, doubling up to 5 s while it keeps dying within
  5 s of its start;
- replaces a worker that has served but fell silent: each writes a heartbeat to a pipe from
  its event loop every second (``lifecycle``), and one silent for ``worker_timeout`` seconds
  (stopped by SIGSTOP, its loop stuck) is killed (SIGKILL) and restarted, so its share of
  new connections goes to the others meanwhile and to its successor after;
- ignores SIGHUP until its workers serve; then forwards it to every worker that serves
  (each reloads its config, and each watches config directories itself). SIGHUPs that come
  together are forwarded once; a worker still starting gets it once it serves;
- on SIGTERM or SIGINT (also while starting) sends SIGTERM (and SIGCONT, for a stopped one)
  to every worker, waits up to ``GRACE`` seconds, kills what is left, and exits 0. Each
  worker is in a process group of its own, so a terminal's Ctrl-C or hangup reaches the
  supervisor only, which passes it on as above.

A worker stops by itself when its supervisor is gone. Each worker labels its metrics with
``worker="<i>"`` and publishes them to a directory the supervisor owns, so ``/metrics`` on
any worker reports every worker (``metrics.Metrics``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from ..errors import ConfigError
from .config import loader as config_mod
from .lifecycle import hangups_blocked
from .server import ServeOptions

log = logging.getLogger("ratekeeper.service")
GRACE = 10.0
"""Seconds a worker gets to stop after SIGTERM before it is killed."""
START_TIMEOUT = 60.0
"""Seconds the workers get to start listening at startup."""


def check_shared_store(options: ServeOptions, workers: int) -> config_mod.ServiceConfig:
    """The config, if its store can be shared by ``workers`` processes (``ConfigError``)."""
    config = config_mod.load(options.config_files, dotfiles=options.dotfiles)
    if workers > 1 and config.store.kind == "memory":
        raise ConfigError(
            f"--workers {workers} needs a store the processes share, and store: memory keeps "
            "its counters inside one process (each worker would enforce its own limits): use "
            "Redis (store: {url: redis://host:6379/0}) or --workers 1"
        )
    return config


@dataclass
class _Worker:
    """One worker slot: its process, when it started, and its next restart delay."""

    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    delay: float = 0.1
    restart_at: float | None = None
    ready: bool = False
    beat: float = 0.0
    """When its last heartbeat came (monotonic)."""
    heart: int | None = None
    """The supervisor's end of its heartbeat pipe."""
    reload: bool = False
    """A SIGHUP came while it was starting: forward it once it serves."""


class Supervisor:
    """Runs N workers on shared ports until SIGTERM/SIGINT (see the module docstring)."""

    def __init__(self, options: ServeOptions, workers: int) -> None:
        self.options = options
        self.config = check_shared_store(options, workers)
        self.held = [_reserve(options.host, options.port, "HTTP", "--port")]
        self.port = self.held[0].getsockname()[1]
        self.grpc_port: int | None = None
        if options.grpc_port is not None:
            self.held.append(_reserve(options.host, options.grpc_port, "gRPC", "--grpc-port"))
            self.grpc_port = self.held[1].getsockname()[1]
        self.metrics_dir = tempfile.mkdtemp(prefix="ratekeeper-metrics-")
        self.workers = [_Worker(i) for i in range(workers)]
        self.selector = selectors.DefaultSelector()
        self.stopping = False
        self.hangup = False
        """A SIGHUP came and is not forwarded yet."""
        self.reloads = 0

    def command(self, index: int, heartbeat_fd: int) -> list[str]:
        o = self.options
        args = [sys.executable, "-m", "ratekeeper.cli", "serve", "--host", o.host]
        args += ["--port", str(self.port), "--worker-index", str(index)]
        args += ["--metrics-dir", self.metrics_dir, "--watch-interval", str(o.watch_interval)]
        args += ["--heartbeat-fd", str(heartbeat_fd), "--store-wait", str(o.store_wait)]
        args += ["--header-timeout", str(o.header_timeout), "--body-timeout", str(o.body_timeout)]
        args += ["--idle-timeout", str(o.idle_timeout), "--send-timeout", str(o.send_timeout)]
        for name in o.allowed_hosts:
            args += ["--allowed-host", name]
        for origin in o.allowed_origins:
            args += ["--allowed-origin", origin]
        if not o.auth_warning:
            args.append("--no-auth-warning")
        if o.start_degraded:
            args.append("--start-degraded")
        if o.max_connections is not None:
            args += ["--max-connections", str(o.max_connections)]
        args += ["--no-grpc"] if self.grpc_port is None else ["--grpc-port", str(self.grpc_port)]
        if o.grpc_threads:
            args += ["--grpc-threads", str(o.grpc_threads)]
        for path in o.config_files:
            args += ["--config", path]
        if o.dotfiles:
            args.append("--config-dotfiles")
        return args

    def start(self, worker: _Worker) -> None:
        heart, beats = os.pipe()
        try:
            with hangups_blocked():  # until the worker ignores SIGHUP (lifecycle)
                proc = subprocess.Popen(  # a process group of its own: a terminal's
                    self.command(worker.index, beats),  # signals (Ctrl-C, a hangup) reach
                    stdout=subprocess.PIPE,  # the supervisor, which passes them on
                    pass_fds=(beats,),
                    process_group=0,
                )
        finally:
            os.close(beats)
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        os.set_blocking(heart, False)
        self.selector.register(proc.stdout, selectors.EVENT_READ, worker)
        self.selector.register(heart, selectors.EVENT_READ, worker)
        worker.proc, worker.started, worker.heart = proc, time.monotonic(), heart
        worker.ready, worker.restart_at = False, None

    def run(self) -> int:
        """Start the workers, supervise them until told to stop; the exit code."""
        previous = {
            sig: signal.signal(sig, self._on_signal)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        }
        try:
            for worker in self.workers:
                self.start(worker)
            if not self._wait_ready():
                return 0 if self.stopping else 2
            self._banner()
            while not self.stopping:
                self._read(0.2)
                self._forward_hangup()
                self._reap()
            return 0
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for sock in self.held:
                sock.close()
            shutil.rmtree(self.metrics_dir, ignore_errors=True)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if signum == signal.SIGHUP:
            self.hangup = True  # forwarded by the main loop (``_forward_hangup``)
            return
        self.stopping = True

    def _forward_hangup(self) -> None:
        """Forward a SIGHUP (or several that came together) once, to each worker that serves;
        one still starting gets it when it serves."""
        if self.hangup:
            self.hangup = False
            self.reloads += 1
            for worker in self.workers:
                worker.reload = True
        for worker in self.workers:
            proc = worker.proc
            if worker.reload and worker.ready and proc is not None and proc.poll() is None:
                worker.reload = False
                proc.send_signal(signal.SIGHUP)

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT
        while not all(w.ready for w in self.workers):
            if self.stopping or time.monotonic() > deadline:
                return False
            self._read(0.1)
            for worker in self.workers:
                if worker.proc is not None and worker.proc.poll() is not None and not worker.ready:
                    print(
                        f"ratekeeper serve: worker {worker.index} exited with code "
                        f"{worker.proc.returncode} while starting",
                        file=sys.stderr,
                    )
                    return False
        return True

    def _banner(self) -> None:
        o = self.options
        where = f"ratekeeper serving HTTP on http://{o.host}:{self.port}"
        if self.grpc_port is not None:
            served = "Envoy RLS" if o.grpc_threads else "Envoy RLS and RLQS"  # the workers' banner
            where += f" and gRPC ({served}) on {o.host}:{self.grpc_port}"
        pids = ", ".join(str(w.proc.pid) for w in self.workers if w.proc is not None)
        print(
            where, f"[store: {self.config.store.kind}] [workers: {len(self.workers)}]", flush=True
        )
        print("config: " + ", ".join(self.config.files), flush=True)
        print(f"supervisor {os.getpid()}, workers {pids}", flush=True)

    def _read(self, timeout: float) -> None:
        """Drain the workers' output (a worker says it listens with its banner line) and
        heartbeats."""
        for key, _ in self.selector.select(timeout):
            worker: _Worker = key.data
            try:
                data = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if not data:  # closed: the worker is gone
                self.selector.unregister(key.fileobj)
                continue
            if key.fd == worker.heart:
                worker.beat = time.monotonic()
            elif b"serving HTTP" in data:
                worker.ready = True
                worker.beat = time.monotonic()

    def _reap(self) -> None:
        """Restart dead workers (with a growing delay while they die young)."""
        if self.stopping:  # the workers are being stopped: nothing to restart
            return
        now = time.monotonic()
        for worker in self.workers:
            proc = worker.proc
            silent = now - worker.beat
            timeout = self.options.worker_timeout
            if worker.ready and proc is not None and silent > timeout and proc.poll() is None:
                log.error(
                    "worker %d (pid %d) has not reported for %.1f s (stopped or stuck); "
                    "killing it", worker.index, proc.pid, silent,
                )  # fmt: skip
                proc.kill()
                proc.wait(5)
            if proc is not None and proc.poll() is not None:
                self._forget(worker)
                lived = now - worker.started
                worker.delay = 0.1 if lived >= 5.0 else min(5.0, worker.delay * 2)
                worker.restart_at = now + worker.delay
                log.error(
                    "worker %d (pid %d) exited with code %s; restarting in %.1f s",
                    worker.index, proc.pid, proc.returncode, worker.delay,
                )  # fmt: skip
                worker.proc = None
            if worker.proc is None and worker.restart_at is not None and now >= worker.restart_at:
                self.start(worker)

    def _forget(self, worker: _Worker) -> None:
        if worker.proc is not None and worker.proc.stdout is not None:
            with contextlib.suppress(KeyError, ValueError):  # unregistered at its EOF
                self.selector.unregister(worker.proc.stdout)
            worker.proc.stdout.close()
        if worker.heart is not None:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(worker.heart)
            os.close(worker.heart)
            worker.heart = None
        worker.ready = False

    def _stop_all(self) -> None:
        live = [w for w in self.workers if w.proc is not None and w.proc.poll() is None]
        for worker in live:
            assert worker.proc is not None
            worker.proc.send_signal(signal.SIGTERM)
            worker.proc.send_signal(signal.SIGCONT)  # a stopped worker can then stop
        deadline = time.monotonic() + GRACE
        for worker in live:
            assert worker.proc is not None
            try:
                worker.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("worker %d did not stop in %.0f s; killing it", worker.index, GRACE)
                worker.proc.kill()
                worker.proc.wait(5)
        for worker in self.workers:
            self._forget(worker)


def _reserve(host: str, port: int, what: str, flag: str) -> socket.socket:
    """A socket bound (not listening) to ``host:port`` with SO_REUSEPORT: the workers bind the
    same port, nothing else can. A port in use is refused as a single service refuses it."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except OSError as exc:
        raise ConfigError(f"cannot listen for {what} on {host}:{port} (--host): {exc}") from None
    try:
        if port:  # taken by another program? (with SO_REUSEPORT, a bind could share it)
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError as exc:
        raise ConfigError(
            f"cannot listen for {what} on {host}:{port} ({flag}): {exc.strerror or exc}"
        ) from None
    return sock


def supervise(options: ServeOptions, workers: int) -> int:
    """``ratekeeper serve --workers N`` (N > 1): the exit code."""
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s [supervisor] %(message)s"
    )
    try:
        return Supervisor(options, workers).run()
    except ConfigError as exc:
        print(f"ratekeeper serve: {exc}", file=sys.stderr)
        return 2
