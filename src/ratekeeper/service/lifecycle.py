"""Signals and heartbeats of a serving process (``serve`` and the supervisor).

- SIGHUP's default action kills a process. ``ignore_hangups`` sets it to nothing from the
  start of ``serve`` (and of the supervisor) until a reload handler replaces it once the
  service serves. A supervisor starts each worker with SIGHUP blocked (``hangups_blocked``:
  a signal mask survives ``fork`` and ``exec``, a handler does not), and the worker unblocks
  it once it ignores it, so a SIGHUP in between is dropped, not fatal.
- ``on_signal`` runs a callback on the event loop when a signal comes (SIGTERM, SIGINT:
  drain and exit 0; SIGHUP: reload).
- ``heartbeat``: a worker writes a byte to its supervisor every ``HEARTBEAT`` seconds from
  its event loop; a worker stopped (SIGSTOP) or whose loop is stuck falls silent, and the
  supervisor replaces it (``supervisor``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Iterator

HEARTBEAT = 1.0
"""Seconds between a worker's heartbeats to its supervisor."""


def ignore_hangups() -> None:
    """SIGHUP does nothing until a handler replaces this (see the module docstring); one
    blocked meanwhile (by a supervisor) is dropped."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})


@contextlib.contextmanager
def hangups_blocked() -> Iterator[None]:
    """SIGHUP held back while a worker is started: it starts with SIGHUP blocked until it
    ignores it (``ignore_hangups``); the supervisor gets one that came meanwhile after."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def on_signal(loop: asyncio.AbstractEventLoop, sig: int, callback: Callable[[], None]) -> bool:
    """Call ``callback`` on ``loop`` when ``sig`` comes; False where that cannot be (not the
    main thread, or no signals on this platform)."""
    try:
        loop.add_signal_handler(sig, callback)
    except (NotImplementedError, RuntimeError, ValueError):
        return False
    return True


async def heartbeat(fd: int) -> None:
    """Write a byte to ``fd`` every ``HEARTBEAT`` seconds until cancelled (never blocking:
    a supervisor that does not read must not stop the event loop)."""
    os.set_blocking(fd, False)
    while True:
        with contextlib.suppress(BlockingIOError, BrokenPipeError):
            os.write(fd, b".")
        await asyncio.sleep(HEARTBEAT)
