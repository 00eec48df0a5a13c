"""What a replay enforces: middleware checks or the service's policies, run by their own code.

- ``ChecksTarget``: ``RateCheck``s (from ``module:attribute`` or built on the command line) run
  by ``WSGIRateLimitMiddleware``'s gate and executor over a ``MemoryStore``, each log line as
  one request (a ``RequestInfo`` of its fields), finished with its logged status (so a 304 is
  refunded as in production). Concurrency and shedding checks depend on live load and on how
  long requests take, which a log does not hold: they are left out and named in the report.
- ``CandidatesTarget``: limits given on the command line (``--limit name=rate``), each keyed by
  one field and decided by ``Limiter.hit`` on every request — the call the middleware and the
  service make for one rate check — side by side, so candidates can be compared. Its fast
  path, ``decide_runs``, takes a list of runs (the lines of one time) at once; a one-rate
  candidate is decided there by ``onerate.OneRate``, the steps ``MemoryStore.hit_one``
  takes for that call with the same policy, in a dict of its own and with no ``Decision``
  built; a stack of rates goes through ``Limiter.hit``.
- ``ServiceTarget``: the service's ``Engine`` and its Envoy front (policies, Envoy domains
  with upstream's semantics, shadow and over-limit cache included) over an ``AsyncLimiter``
  on a ``MemoryStore``; policy keys and descriptor entries come from log fields. Its
  coroutines never wait on a memory store, so each is run to completion with one ``send``
  instead of an event loop.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

from ..clock import ManualClock
from ..decision import Decision
from ..errors import ConfigError
from ..middleware.checks import Check, Controls, RateCheck
from ..middleware.gate import Admission, Op, run
from ..middleware.request import RequestInfo
from ..middleware.wsgi import WSGIRateLimitMiddleware
from ..stores.memory import MemoryStore
from .onerate import OneRate
from .reading.logs import Entry, Run
from .stats import LimitStats, Recorder

UNBOUNDED = sys.maxsize


def request_of(fields: Mapping[str, str]) -> RequestInfo:
    """A log line as a request: headers are looked up as fields (``X-Api-Key`` reads the
    field ``x-api-key`` or ``x_api_key``); ``raw`` is the fields."""

    def header(name: str) -> str | None:
        low = name.lower()
        return fields.get(low) or fields.get(low.replace("-", "_"))

    return RequestInfo(
        fields.get("method", "GET"),
        fields.get("path", "/"),
        fields.get("ip"),
        fields.get("user"),
        header,
        fields,
    )


def load_checks(spec: str) -> list[Check]:
    """``module:attribute``: a list of checks, or a function returning one. The module is
    found from the current directory too, as ``uvicorn app:app`` finds an app."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"checks {spec!r} are invalid; expected module:attribute")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r} for --checks: {exc}") from None
    value = getattr(module, attr, None)
    if value is None:
        raise ConfigError(f"{module_name!r} has no attribute {attr!r} (--checks {spec})")
    if callable(value) and not isinstance(value, RateCheck):
        value = value()
    return list(value)


class ChecksTarget:
    """Middleware checks through the WSGI middleware's own gate (see the module docstring)."""

    fast_field = None

    def __init__(self, checks: Sequence[Check], clock: ManualClock, mode: str) -> None:
        self._given = (list(checks), mode)
        self.rate_checks = [c for c in checks if isinstance(c, RateCheck)]
        self.left_out = [c.name for c in checks if not isinstance(c, RateCheck)]
        if not self.rate_checks:
            raise ConfigError("no RateCheck to simulate among the checks given")
        self.limits = {
            c.name: LimitStats(c.name, _rates(c.rate), c.algorithm, c.buckets)
            for c in self.rate_checks
        }
        self.clock = clock
        self.recorder = Recorder(self.limits, clock)
        self.middleware = WSGIRateLimitMiddleware(
            _no_app, self.rate_checks, store=MemoryStore(max_keys=UNBOUNDED), clock=clock,
            controls=Controls(default=mode), metrics=self.recorder,
        )  # fmt: skip
        self._demand = [(i, c, self.limits[c.name]) for i, c in enumerate(self.rate_checks)]
        self._windows: list[tuple[int, str, str]] = []
        """(check position, store key, rate) of the hits rejected in this request."""

    def fresh(self) -> ChecksTarget:
        """The same checks with nothing decided yet (a replay that starts over)."""
        checks, mode = self._given
        return ChecksTarget(checks, ManualClock(0.0), mode)

    def decide(self, entry: Entry, now_ms: int) -> None:
        request = request_of(entry.fields)
        mw = self.middleware
        gate = mw.gate
        adm = Admission()
        run(gate.admit(request, adm), self._execute)
        status_text = entry.fields.get("status")
        status = int(status_text) if status_text and status_text.isdigit() else 200
        for op in gate.finish(adm, status):
            mw.execute(op)
        if self._windows:
            for position, stored, window in self._windows:
                name = self.rate_checks[position].name
                self.limits[name].windowed(stored[len(name) + 1 :], window)
            self._windows.clear()
        for position, check, stats in self._demand:
            if check.where.applies(request):
                key = check.key(request)
                if key is not None:
                    refunded = not gate.keeps(position, status)
                    stats.wanted(key, now_ms, check.cost_of(request), refunded)

    def _execute(self, op: Op) -> Any:
        """The middleware's executor, noting which rate of a stack rejected a hit."""
        result = self.middleware.execute(op)
        if op.kind == "hit" and isinstance(result, Decision) and not result.allowed:
            self._windows.append((op.position, op.key, result.rate.code))
        return result


@dataclass(frozen=True, slots=True)
class Candidate:
    """A limit given on the command line: its rate, the field keying it, its algorithm."""

    rate: str
    key: str = "ip"
    algorithm: str = "fixed_window"
    burst: int | None = None
    buckets: int | None = None


class CandidatesTarget:
    """Candidate limits side by side, each decided on every request by ``Limiter.hit``
    (``decide``) or, for one rate, by the steps of the memory store call that
    ``Limiter.hit`` makes (``decide_runs``, the fast path, when every candidate is keyed by
    the same field: ``fast_field``; see ``onerate``)."""

    def __init__(
        self,
        limits: Mapping[str, str | Candidate],
        field: str,
        algorithm: str,
        clock: ManualClock,
    ) -> None:
        from ..limiter import Limiter
        from ..plan import make_policy

        self._given = (dict(limits), field, algorithm)
        self.left_out: list[str] = []
        self.clock = clock
        self.limits: dict[str, LimitStats] = {}
        self._runs = []
        self._fast: list[OneRate | None] = []
        fields = set()
        for name, spec in limits.items():
            c = Candidate(spec, field, algorithm) if isinstance(spec, str) else spec
            policy = make_policy(c.rate, c.algorithm, c.burst, c.buckets)  # names what is bad
            stats = self.limits[name] = LimitStats(
                name, policy.rates, c.algorithm, c.buckets, key=c.key
            )
            store = MemoryStore(max_keys=UNBOUNDED)
            hit = partial(
                Limiter(store, clock=clock).hit,
                rate=policy.rates, algorithm=c.algorithm, burst=c.burst, buckets=c.buckets,
            )  # fmt: skip
            self._runs.append((hit, c.key, stats))
            fields.add(c.key)
            if len(policy.limits) == 1:  # what Limiter.hit's fast path decides
                self._fast.append(OneRate(policy.algorithm, policy.limits[0]))
            else:
                self._fast.append(None)
        self.fast_field = fields.pop() if len(fields) == 1 else None
        """The one field every candidate is keyed by (None: they differ, no fast path)."""

    def fresh(self) -> CandidatesTarget:
        """The same candidates with nothing decided yet (a replay that starts over)."""
        limits, field, algorithm = self._given
        return CandidatesTarget(limits, field, algorithm, ManualClock(0.0))

    def decide(self, entry: Entry, now_ms: int) -> None:
        fields = entry.fields
        now = entry.time
        for hit, name, stats in self._runs:
            key = fields.get(name)
            if not key:
                stats.key_missing += 1
                continue
            d = hit(key)
            stats.decided("allowed" if d.allowed else "rejected", key, now)
            if not d.allowed:
                stats.windowed(key, d.rate.code)
            stats.wanted(key, now_ms, 1)

    def decide_runs(self, batch: list[Run]) -> None:
        """``decide`` for a list of runs in time order (consecutive lines of one time,
        given the key field of each)."""
        runs: list[tuple[float, int, list[str]]] = []
        missing = 0
        for t, fields in batch:
            if None in fields or "" in fields:
                keys = [k for k in fields if k]
                missing += len(fields) - len(keys)
                if not keys:
                    continue
            else:
                keys = cast(list[str], fields)
            runs.append((t, int(t * 1000 + 0.5), keys))
        clock = self.clock
        for (hit, _, stats), fast in zip(self._runs, self._fast, strict=True):
            stats.key_missing += missing
            if fast is not None:
                stats.decided_runs(runs, fast.hit_runs(runs))
            else:  # several rates: Limiter.hit's general path, on the clock of each run
                rejected: list[list[str]] = []
                windows = []
                for t, _, keys in runs:
                    clock._now = t  # ManualClock.set without its lock: one thread replays
                    out = []
                    for key in keys:
                        d = hit(key)
                        if not d.allowed:
                            out.append(key)
                            windows.append((key, d.rate.code))
                    rejected.append(out)
                stats.decided_runs(runs, rejected)
                for key, window in windows:
                    stats.windowed(key, window)
            stats.wanted_runs(runs)
        if batch:
            clock._now = batch[-1][0]


class ServiceTarget:
    """The service's engine over a memory store (see the module docstring)."""

    fast_field = None

    def __init__(
        self,
        config: Any,
        keys: Mapping[str, str],
        descriptors: Mapping[str, Sequence[tuple[str, str]]],
        clock: ManualClock,
    ) -> None:
        from ..limiter import AsyncLimiter
        from ..service.engine import Engine, envoy_key
        from ..service.envoy.rls import Descriptor, Envoy
        from ..service.metrics import Metrics as ServiceMetrics

        self._given = (config, dict(keys), dict(descriptors))
        self._envoy_key = envoy_key
        self._descriptor = Descriptor
        for name in keys:
            if name not in config.policies:
                raise ConfigError(f"--key {name}=...: no rate policy {name!r} in the config")
        for domain in descriptors:
            if domain not in config.domains:
                raise ConfigError(f"--descriptor {domain}=...: no domain {domain!r} in the config")
        if not keys and not descriptors:
            raise ConfigError(
                "say which log field keys which policy: --key POLICY=FIELD or "
                "--descriptor DOMAIN=KEY:FIELD,..."
            )
        self.keys = dict(keys)
        self.descriptors = {d: list(e) for d, e in descriptors.items()}
        self.left_out = sorted(config.concurrency)
        self.limits: dict[str, LimitStats] = {}
        for name, spec in config.policies.items():
            self.limits[name] = LimitStats(
                name,
                spec.policy.rates,
                spec.algorithm,
                spec.buckets,
                key=keys.get(name, "descriptor"),
            )
        self.clock = clock
        limits = self.limits

        class _Recording(ServiceMetrics):
            def decision(self, policy: str, outcome: str, key: str | None = None) -> None:
                super().decision(policy, outcome, key)
                stats = limits.get(policy)
                if stats is not None:
                    stats.decided(outcome, key, clock())

        limiter = AsyncLimiter(MemoryStore(max_keys=UNBOUNDED), clock=clock)
        metrics = _Recording()
        self.engine = Engine(config, limiter, metrics, clock)
        self.envoy = Envoy(self.engine, metrics.envoy)

    def fresh(self) -> ServiceTarget:
        """The same policies with nothing decided yet (a replay that starts over)."""
        config, keys, descriptors = self._given
        return ServiceTarget(config, keys, descriptors, ManualClock(0.0))

    def decide(self, entry: Entry, now_ms: int) -> None:
        fields = entry.fields
        engine = self.engine
        for name, field_name in self.keys.items():
            key = fields.get(field_name)
            stats = self.limits[name]
            if key:
                result = _complete(engine.hit(engine.spec(name), key, 1))
                if result.shadow or not result.decision.allowed:
                    stats.windowed(key, result.decision.rate.code)
                stats.wanted(key, now_ms, 1)
            else:
                stats.key_missing += 1
        for domain, mapping in self.descriptors.items():
            entries = tuple((k, fields[f]) for k, f in mapping if fields.get(f))
            if not entries:
                continue
            answer = _complete(self.envoy.should_rate_limit(domain, [self._descriptor(entries)], 1))
            for status in answer.statuses:
                result = status.result
                if result is not None and result.policy in self.limits:
                    key = self._envoy_key(domain, entries)
                    stats = self.limits[result.policy]
                    if result.shadow or not result.decision.allowed:
                        stats.windowed(key, result.decision.rate.code)
                    stats.wanted(key, now_ms, 1)


def _complete(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never waits (the engine on a memory store) to its result."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("a simulated decision waited on I/O; only the memory store is simulated")


def _rates(rate: Any) -> tuple[Any, ...]:
    """A check's fixed rates; none for a rate computed per request (its decisions are
    replayed, but there is no one rate to measure usage against or to suggest)."""
    from ..rates import to_rates

    return () if callable(rate) else to_rates(rate)


def _no_app(environ: Any, start_response: Callable[..., Any]) -> list[bytes]:
    return []
