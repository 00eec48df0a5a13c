"""Adaptive concurrency: a limit on requests in progress, found from their latency.

``GradientLimit`` follows the gradient idea of Netflix's concurrency-limits and Envoy's adaptive
concurrency filter: latency at low concurrency (the *baseline*) is what a request costs; when
more requests run at once than the server can serve, they queue and latency grows past it.
Every ``update_every`` seconds (and at least ``min_samples`` requests), with ``sample`` the
median latency of the requests that finished in that time::

    gradient = clamp(baseline * (1 + tolerance) / sample, 0.5, 2)
    target   = limit * gradient + sqrt(limit)           # sqrt: room for a short queue
    limit   += smoothing * (target - limit)             # the ramp: part of the way per update
    limit    = clamp(limit, floor, ceiling)

The limit does not grow while fewer than half its slots were used (nothing to learn). The
baseline is the lowest median seen since the last *probe*: every ``probe_every`` seconds
(randomly spread by ``jitter`` so that processes do not probe together) the limit drops to the
``floor`` for one update, and that update's median becomes the baseline — so the baseline
follows the server when it gets slower instead of drifting up with the queue it measures.

Worked example, a handler taking 3 ms of CPU on one core: at ``limit`` L the requests admitted
together finish at 3, 6, … 3L ms (median ~1.5(L+1) ms). With the baseline measured at the floor
(2: 4.5 ms) and tolerance 0.5 the limit settles where ``L = 4.5·1.5·L/(1.5(L+1)) + sqrt(L)``,
about 6 to 7: enough to keep the core busy, few enough that a critical request waits ~20 ms.

Time and randomness are injected; ``sample(latency, in_flight)`` is all a driver calls.
"""

from __future__ import annotations

import math
import random as _random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..clock import Clock
from ..errors import ConfigError


@dataclass(frozen=True, slots=True)
class GradientSettings:
    """The gradient controller's constants (see the module docstring)."""

    initial: int = 4
    floor: int = 1
    ceiling: int = 1000
    tolerance: float = 0.5
    smoothing: float = 0.25
    update_every: float = 0.1
    min_samples: int = 10
    probe_every: float = 30.0
    jitter: float = 0.25

    def __post_init__(self) -> None:
        for name in ("initial", "floor", "ceiling", "min_samples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}={value!r} is invalid; expected a whole number >= 1")
        if not self.floor <= self.initial <= self.ceiling:
            raise ConfigError(
                f"floor={self.floor}, initial={self.initial}, ceiling={self.ceiling} are "
                "invalid; expected floor <= initial <= ceiling"
            )
        for name in ("tolerance", "update_every", "probe_every"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} is invalid; expected > 0")
        for name in ("smoothing", "jitter"):
            if not 0 <= getattr(self, name) <= 1 or (name == "smoothing" and self.smoothing == 0):
                raise ConfigError(
                    f"{name}={getattr(self, name)!r} is invalid; expected "
                    + ("0 < smoothing <= 1" if name == "smoothing" else "0 <= jitter <= 1")
                )


class GradientLimit:
    """A concurrency limit that follows latency (not thread-safe: its driver holds a lock)."""

    def __init__(
        self,
        settings: GradientSettings | None = None,
        *,
        clock: Clock = time.monotonic,
        random: Callable[[], float] = _random.random,
    ) -> None:
        self.settings = GradientSettings() if settings is None else settings
        self.clock = clock
        self.random = random
        s = self.settings
        self.value = float(s.initial)
        self.baseline: float | None = None
        self._samples: list[float] = []
        self._busiest = 0
        now = clock()
        self._update_at = now + s.update_every
        self._probing: float | None = None  # the limit to go back to after a probe
        self._probe_at = now  # probe first: the baseline is measured at the floor

    @property
    def limit(self) -> int:
        """Requests allowed in progress now."""
        return int(self.value)

    @property
    def probing(self) -> bool:
        """Whether the limit is at the floor to measure the baseline."""
        return self._probing is not None

    def sample(self, latency: float, in_flight: int) -> None:
        """One request finished after ``latency`` seconds with ``in_flight`` in progress."""
        self._samples.append(latency)
        if in_flight > self._busiest:
            self._busiest = in_flight
        now = self.clock()
        if now >= self._update_at:
            if len(self._samples) >= self.settings.min_samples:
                self._update(now)
            elif now >= self._probe_at and self._probing is None:
                self._start_probe()  # idle: still take the first probe when traffic comes

    def _start_probe(self) -> None:
        self._probing = self.value
        self.value = float(self.settings.floor)
        self._samples.clear()
        self._busiest = 0

    def _next_probe(self, now: float) -> float:
        s = self.settings
        return now + s.probe_every * (1 + s.jitter * (2 * self.random() - 1))

    def _update(self, now: float) -> None:
        s = self.settings
        median = statistics.median(self._samples)
        busiest = self._busiest
        self._samples.clear()
        self._busiest = 0
        self._update_at = now + s.update_every
        if self._probing is not None:
            self.baseline = median
            self.value, self._probing = self._probing, None
            self._probe_at = self._next_probe(now)
            return
        if now >= self._probe_at:
            self._start_probe()
            return
        if self.baseline is None or median < self.baseline:
            self.baseline = median
        gradient = min(2.0, max(0.5, self.baseline * (1 + s.tolerance) / max(median, 1e-9)))
        if busiest < self.value / 2:
            gradient = min(gradient, 1.0)
            if gradient == 1.0:
                return  # app-limited: nothing to learn
        target = self.value * gradient + math.sqrt(self.value) - 1
        value = self.value + s.smoothing * (target - self.value)
        self.value = min(float(s.ceiling), max(float(s.floor), value))
