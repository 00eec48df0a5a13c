"""Overload signals: where a Python server's overload shows, as a utilization in [0, 1].

A signal is a zero-argument callable returning a utilization (0 idle, 1 saturated) — what
``WorkerUtilizationShedder`` takes. Each maps a measurement to it by ``saturated_at``, the value
that counts as fully saturated (the shedder starts shedding at 0.8 of it by default):

- ``LoopLag`` (asyncio): how late a timer fires. In an async server overload is a queue in front
  of the event loop (sockets unread, tasks waiting to run); a timer re-armed every ``every``
  seconds fires late by about the time the loop takes to get through that queue. One callback
  per ``every`` seconds: the cost is nil.
- ``QueueDelay``: the time from a request's arrival to the app, where something stamps the
  arrival: a proxy's ``X-Request-Start`` header (nginx, Heroku, Apache) or mod_wsgi's
  ``mod_wsgi.request_start``. The stamp is another clock, so it is opt-in.
- ``Pressure`` (Linux PSI, ``/proc/pressure/{cpu,memory,io}``): the share of time tasks waited
  for the resource, the box's (or cgroup's) contention rather than this process's.
- ``ProcessCPU``: the share of one core this process used, portable.

Threaded WSGI servers have the simplest signal, busy threads / threads, which the middleware
counts itself (requests in flight / ``max_in_flight``). ``worst(a, b)`` combines signals.

Every signal takes its clock; measurements can be fed by hand (``record``), so tests script
them instead of sleeping.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from ..clock import Clock
from ..errors import ConfigError

Signal = Callable[[], float]
"""A zero-argument callable returning a utilization in [0, 1]."""


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"{name}={value!r} is invalid; expected a number > 0")
    return float(value)


class _Window:
    """Samples of the last ``window`` seconds, averaged."""

    __slots__ = ("_samples", "window")

    def __init__(self, window: float) -> None:
        self.window = _positive("window", window)
        self._samples: deque[tuple[float, float]] = deque()

    def add(self, now: float, value: float) -> None:
        self._samples.append((now, value))
        self.trim(now)

    def trim(self, now: float) -> None:
        samples = self._samples
        while samples and samples[0][0] < now - self.window:
            samples.popleft()

    def mean(self, now: float) -> float:
        self.trim(now)
        samples = self._samples
        return sum(v for _, v in samples) / len(samples) if samples else 0.0


class LoopLag:
    """Event-loop lag: the mean lateness of a timer re-armed every ``every`` s, over ``window`` s.

    Calling it from inside a running loop starts the timer on that loop (again on a new loop);
    outside a loop it reads 0. ``record(lag)`` feeds a measurement by hand.
    """

    def __init__(
        self,
        saturated_at: float = 0.025,
        *,
        every: float = 0.02,
        window: float = 0.5,
        clock: Clock = time.monotonic,
    ) -> None:
        self.saturated_at = _positive("saturated_at", saturated_at)
        self.every = _positive("every", every)
        self.clock = clock
        self._window = _Window(window)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due: float | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start timing ``loop`` (stops timing the previous one)."""
        self.detach()
        self._loop = loop
        self._arm()

    def detach(self) -> None:
        """Stop the timer."""
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._loop = self._due = None

    def _arm(self) -> None:
        assert self._loop is not None  # only armed while attached
        self._due = self.clock() + self.every
        self._handle = self._loop.call_later(self.every, self._tick)

    def _tick(self) -> None:
        if self._due is not None:
            now = self.clock()
            self._window.add(now, max(0.0, now - self._due))
        self._arm()

    def record(self, lag: float) -> None:
        """Add one lag measurement (seconds) taken now."""
        self._window.add(self.clock(), max(0.0, lag))

    def lag(self) -> float:
        """Mean lag over the window, counting a timer that is overdue now (seconds)."""
        now = self.clock()
        mean = self._window.mean(now)
        due = self._due
        return max(mean, now - due) if due is not None else mean

    def follow(self) -> None:
        """Time the running loop, if there is one and it is not timed yet."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if loop is not self._loop:
            self.attach(loop)

    def __call__(self) -> float:
        self.follow()
        return min(1.0, self.lag() / self.saturated_at)


def parse_request_start(value: object) -> float | None:
    """An arrival stamp as epoch seconds: ``t=`` optional, in s, ms, µs or ns (by magnitude),
    as nginx (``t=1700000000.123``), Heroku (ms), Apache (``t=`` µs) and mod_wsgi (µs) send it.
    None if it is not one."""
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        return None
    text = str(value).strip()
    if text.startswith("t="):
        text = text[2:]
    try:
        stamp = float(text)
    except ValueError:
        return None
    if not (stamp > 0 and math.isfinite(stamp)):
        return None
    for scale in (1e9, 1e6, 1e3):  # ns, µs, ms: epoch seconds are ~1.7e9
        if stamp > scale * 1e8:
            return stamp / scale
    return stamp


class QueueDelay:
    """Time from arrival to the app, from arrival stamps (``record``), averaged over ``window`` s.

    ``clock`` must be the clock the stamps come from (epoch seconds). A delay above
    ``max_skew`` is taken for clock skew and ignored rather than shed on.
    """

    def __init__(
        self,
        saturated_at: float = 0.05,
        *,
        window: float = 1.0,
        max_skew: float = 60.0,
        clock: Clock = time.time,
    ) -> None:
        self.saturated_at = _positive("saturated_at", saturated_at)
        self.max_skew = _positive("max_skew", max_skew)
        self.clock = clock
        self._window = _Window(window)

    def record(self, arrived_at: float) -> None:
        """One request that arrived at ``arrived_at`` (epoch seconds) reached the app now."""
        now = self.clock()
        delay = now - arrived_at
        if -self.max_skew < delay < self.max_skew:
            self._window.add(now, max(0.0, delay))

    def delay(self) -> float:
        """Mean queueing delay over the window (seconds; 0 with no stamps)."""
        return self._window.mean(self.clock())

    def __call__(self) -> float:
        return min(1.0, self.delay() / self.saturated_at)


PSI_RESOURCES = ("cpu", "memory", "io")


class Pressure:
    """Linux pressure stall information: ``some avg10`` (or ``full``) of a resource, in %.

    ``path`` defaults to ``/proc/pressure/<resource>``; in a container pass the cgroup's file
    (``/sys/fs/cgroup/cpu.pressure``). Read at most every ``every`` seconds; 0 where PSI is
    missing (``available()`` tells).
    """

    def __init__(
        self,
        resource: str = "cpu",
        *,
        saturated_at: float = 50.0,
        line: str = "some",
        path: str | Path | None = None,
        every: float = 1.0,
        clock: Clock = time.monotonic,
    ) -> None:
        if resource not in PSI_RESOURCES:
            raise ConfigError(
                f"resource {resource!r} is invalid; expected one of {', '.join(PSI_RESOURCES)}"
            )
        if line not in ("some", "full"):
            raise ConfigError(f"line {line!r} is invalid; expected 'some' or 'full'")
        self.saturated_at = _positive("saturated_at", saturated_at)
        self.every = _positive("every", every)
        self.line = line
        self.path = Path(path) if path is not None else Path("/proc/pressure") / resource
        self.clock = clock
        self._read_at: float | None = None
        self._value = 0.0

    def available(self) -> bool:
        """Whether the pressure file can be read here."""
        try:
            self.path.read_text()
        except OSError:
            return False
        return True

    def percent(self) -> float:
        """The ``avg10`` figure of the chosen line (0 to 100), re-read every ``every`` s."""
        now = self.clock()
        if self._read_at is None or now - self._read_at >= self.every:
            self._read_at = now
            self._value = self._read()
        return self._value

    def _read(self) -> float:
        try:
            text = self.path.read_text()
        except OSError:
            return 0.0
        for row in text.splitlines():
            fields = row.split()
            if fields and fields[0] == self.line:
                for field in fields[1:]:
                    if field.startswith("avg10="):
                        try:
                            return float(field[6:])
                        except ValueError:
                            return 0.0
        return 0.0

    def __call__(self) -> float:
        return min(1.0, self.percent() / self.saturated_at)


class ProcessCPU:
    """The share of ``cores`` this process used since the previous reading (at least ``every``
    seconds apart). A single-threaded Python server saturates at one core."""

    def __init__(
        self,
        cores: float = 1.0,
        *,
        every: float = 1.0,
        clock: Clock = time.monotonic,
        cpu_time: Clock = time.process_time,
    ) -> None:
        self.cores = _positive("cores", cores)
        self.every = _positive("every", every)
        self.clock = clock
        self.cpu_time = cpu_time
        self._last: tuple[float, float] | None = None
        self._value = 0.0

    def __call__(self) -> float:
        now, cpu = self.clock(), self.cpu_time()
        last = self._last
        if last is None:
            self._last = (now, cpu)
        elif now - last[0] >= self.every:
            self._value = min(1.0, max(0.0, (cpu - last[1]) / (now - last[0]) / self.cores))
            self._last = (now, cpu)
        return self._value


class Worst:
    """One signal reading the highest utilization of ``signals`` (see ``worst``)."""

    __slots__ = ("signals",)

    def __init__(self, *signals: Signal) -> None:
        if not signals or not all(callable(s) for s in signals):
            raise ConfigError(f"signals={signals!r} are invalid; expected one or more callables")
        self.signals = signals

    def __call__(self) -> float:
        return max(s() for s in self.signals)


def worst(*signals: Signal) -> Worst:
    """One signal reading the highest utilization of ``signals``: ``worst(cpu, lag)``."""
    return Worst(*signals)
