"""The quota service's logic, without the wire: Envoy streams, the buckets they report, and
the assignments they are sent (``Quotas``). ``wire.py`` turns gRPC messages into ``Usage``s
and ``Action``s into messages.

- A stream subscribes a bucket on its first report of it. Each report of a bucket is one
  ``allocator.step`` on the shared state (``state.py``) and is answered at once with the
  bucket's action: a token bucket of the stream's share, refreshed (same numbers, new TTL)
  on every report; ``ALLOW_ALL`` while the policy is shadowed or switched off; ``DENY_ALL``
  while it is blocked (the kill switch) or while the share is zero.
- Demand is what the stream reported (allowed + denied) over the time since its previous
  report, measured here: Envoy rounds its ``time_elapsed`` down to whole seconds and sends
  0 on a bucket's first report (then the demand is unknown and the step assumes an equal
  share). A first report with a ``time_elapsed`` is a reconnecting Envoy (the service or its
  connection restarted): its first assignment is capped by what it was just allowed, and for
  ``ADOPT_REPORTS`` reports it may take over an orphan's reservation. A bucket reported
  again by the same stream within ``MIN_STEP_MS`` is answered with its last action, its
  counts carried to the next step.
- A stream short of its fair share has this process's other streams of the bucket
  re-stepped at once (those over their share give back, pushed without waiting for their
  reports), then its own step runs again. A stream that ends frees its share and the
  process's other streams of its buckets are re-stepped; when the service stops, its
  streams' records are kept as orphans for reconnecting Envoys to take over.
- ``refresh`` (a reload or a toggle: ``Engine.generation`` moved) resolves every bucket
  again: the blanket rules of shadowed, switched-off and blocked policies are pushed to
  every stream at once, before any store call; a bucket whose rule is gone gets an
  ``abandon_action`` (Envoy forgets it; its next request reports it afresh); a changed rate
  is re-stepped.
- Envoy's 1.40 filter reads a token bucket's ``fill_interval`` in whole seconds (under a
  second: no limit at all) and ignores a change of the interval alone: ``token_bucket``
  picks a whole-second interval per global rate and, if only the interval would change,
  changes ``max_tokens`` too.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ....clock import Clock
from ....errors import BadRequest, StoreUnavailable
from ...config.policies import PolicySpec
from ...config.rlqs import BucketRule, RlqsSettings, limit_mrps
from ...engine import Engine
from ...rlqs_stats import RlqsStats, Row
from .allocator import MRPS, Grant, Step
from .state import QuotaState

log = logging.getLogger("ratekeeper.service")

REPORT_SECONDS = 5
"""Envoy 1.40 reports every bucket every 5 s, whatever ``reporting_interval`` says."""
ADOPT_REPORTS = 3
"""Reports in which a reconnecting stream may take over a reservation (about 10 s)."""
MIN_STEP_MS = 1_000
"""A bucket reported again sooner by the same stream is answered with its last action and
its counts carried to the next step (Envoy's periodic report can follow a bucket's first
one closely; a client reporting in a loop costs the store at most one step a second)."""
HOLD_MARGIN_MS = 1_000
"""A record is reserved this long after its assignment's TTL."""
NICE_SECONDS = (1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1800, 3600)
UINT32 = 2**32 - 1
LOG_EVERY = 10.0

Entries = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Usage:
    """One bucket of a usage report, as Envoy sent it."""

    domain: str
    entries: Entries
    """The bucket id, sorted by key."""
    elapsed_s: int
    allowed: int
    denied: int


@dataclass(frozen=True, slots=True)
class Action:
    """What a bucket is told: ``token_bucket`` (the numbers), ``allow_all``, ``deny_all`` or
    ``abandon``."""

    entries: Entries
    kind: str
    max_tokens: int = 0
    tokens_per_fill: int = 0
    fill_seconds: int = 0
    ttl: int = 0


@dataclass(slots=True)
class Sub:
    """One stream's subscription to one bucket."""

    bucket: str
    domain: str
    entries: Entries
    rule: BucketRule | None
    label: str
    last_ms: int = 0
    demand: int = -1
    allowed: int = 0
    denied: int = 0
    carried: tuple[int, int] = (0, 0)
    """Allowed and denied requests of reports answered without a step, for the next one."""
    adopting: int = 0
    cap: int = -1
    assigned: int = 0
    envoys: int = 0
    limit: int = 0
    mode: str = "unmatched"
    sent: Action | None = None


@dataclass(eq=False, slots=True)
class Stream:
    """One Envoy's stream: ``send`` queues actions for it (``wire`` writes them)."""

    send: Callable[[list[Action]], None]
    peer: str = ""
    id: str = field(default_factory=lambda: secrets.token_hex(8))
    subs: dict[str, Sub] = field(default_factory=dict)


def bucket_key(domain: str, entries: Entries) -> str:
    """A bucket's store key, injective in (domain, entries)."""
    return f"{len(domain)}:{domain}" + "".join(f"|{len(k)}:{k}{len(v)}:{v}" for k, v in entries)


def bucket_text(domain: str, entries: Entries) -> str:
    """A bucket as people read it (logs, labels): ``edge/name=tenant,tenant=acme``."""
    return domain + "/" + ",".join(f"{k}={v}" for k, v in entries)


def fill_seconds(limit: int) -> int:
    """A whole-second fill interval in which the global rate is at least 1000 tokens, so a
    share is exact to about 0.1 % of it (Envoy computes tokens_per_fill / seconds)."""
    for seconds in NICE_SECONDS:
        if limit * seconds >= 1000 * MRPS:
            return seconds
    return NICE_SECONDS[-1]


def token_bucket(
    entries: Entries, grant: int, limit: int, spec: PolicySpec, ttl: int, before: Action | None
) -> Action:
    """The action for a share of ``grant`` mrps of a global ``limit`` (``DENY_ALL`` when it
    is under one token per interval)."""
    seconds = fill_seconds(limit)
    tokens = min(UINT32, round(grant * seconds / MRPS))
    if tokens <= 0:
        return Action(entries, "deny_all", ttl=ttl)
    burst = spec.burst if spec.burst else max(1, limit // MRPS)
    most = min(UINT32, max(1, burst * grant // limit))
    if (
        before is not None
        and before.kind == "token_bucket"
        and (before.max_tokens, before.tokens_per_fill) == (most, tokens)
        and before.fill_seconds != seconds
    ):  # Envoy would keep the old bucket: make the change visible to it
        most = most + 1 if most < UINT32 else most - 1
    return Action(entries, "token_bucket", most, tokens, seconds, ttl)


class Quotas:
    """Every stream of this process and the buckets they report (see the module docstring)."""

    def __init__(
        self, engine: Engine, state: QuotaState, stats: RlqsStats, clock: Clock = time.time
    ) -> None:
        self.engine = engine
        self.state = state
        self.stats = stats
        self.clock = clock
        self.streams: dict[str, Stream] = {}
        self.local: dict[str, set[str]] = {}
        """Bucket key -> ids of this process's streams that report it."""
        self.closing = False
        self.generation = engine.generation
        self._logged: dict[str, float] = {}
        stats.source = self.rows
        stats.streams = lambda: len(self.streams)

    @property
    def settings(self) -> RlqsSettings:
        return self.engine.config.rlqs

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # --- streams ------------------------------------------------------------------------------

    def open(self, stream: Stream) -> None:
        self.streams[stream.id] = stream

    async def end(self, stream: Stream) -> None:
        """The stream has ended: free its shares (or keep them as orphans when the service
        is stopping) and re-step this process's other streams of its buckets."""
        self.streams.pop(stream.id, None)
        now = self.now_ms()
        keep = self.closing
        touched = []
        for key, sub in stream.subs.items():
            ids = self.local.get(key)
            if ids is not None:
                ids.discard(stream.id)
                if not ids:
                    del self.local[key]
            if sub.rule is None:
                continue
            try:
                await self.state.leave(key, stream.id, now, keep)
            except StoreUnavailable as exc:
                self._store_failed(exc)
            touched.append(key)
        stream.subs.clear()
        if not keep:
            for key in touched:
                await self._restep_others(key, "")

    async def close(self) -> None:
        """The service is stopping: keep every stream's records as orphans."""
        self.closing = True
        now = self.now_ms()
        for stream in list(self.streams.values()):
            for key, sub in stream.subs.items():
                if sub.rule is not None:
                    try:
                        await self.state.leave(key, stream.id, now, True)
                    except StoreUnavailable as exc:
                        self._store_failed(exc)

    # --- reports ------------------------------------------------------------------------------

    async def report(self, stream: Stream, usages: list[Usage]) -> None:
        """Answer one usage report: one action per bucket that gets one, sent together."""
        if self.engine.generation != self.generation:
            await self.refresh()
        self.stats.reports += 1
        self.stats.usages += len(usages)
        now = self.now_ms()
        subs: list[Sub] = []
        early: list[Sub] = []
        seen: set[int] = set()
        for usage in usages:
            sub = self._subscribe(stream, usage, now)
            if sub is not None and id(sub) not in seen:  # a bucket listed twice: once
                seen.add(id(sub))
                (subs if sub.last_ms == now else early).append(sub)
        grants = await asyncio.gather(*(self._step(stream, s, now) for s in subs))
        short = [s for s, g in zip(subs, grants, strict=True) if g is not None
                 and g.assigned < g.target and len(self.local.get(s.bucket, ())) > 1]  # fmt: skip
        for sub in short:
            await self._restep_others(sub.bucket, stream.id)
            await self._step(stream, sub, now)
        actions = []
        for sub, grant in zip(subs, grants, strict=True):
            if grant is None and sub.mode == "quota":
                continue  # the store failed: Envoy keeps its assignment until the TTL
            action = self._action(sub)
            if action is not None:
                actions.append(action)
                sub.sent = action
        actions += [sub.sent for sub in early if sub.sent is not None]
        self._send(stream, actions)

    def _subscribe(self, stream: Stream, usage: Usage, now: int) -> Sub | None:
        """The stream's subscription of the usage's bucket, its demand updated (its
        ``last_ms`` is ``now`` when it is to be stepped; see ``MIN_STEP_MS``)."""
        if not usage.entries:
            self.stats.refuse("bucket_id")
            return None
        key = bucket_key(usage.domain, usage.entries)
        sub = stream.subs.get(key)
        count = usage.allowed + usage.denied
        if sub is None:
            if len(key) > self.engine.config.max_key_length:
                self.stats.refuse("bucket_id")
                self._warn(key, f"bucket {bucket_text(usage.domain, usage.entries)[:200]!r} is "
                           "longer than limits.max_key_length; not served")  # fmt: skip
                return None
            if key not in self.local and len(self.local) >= self.settings.max_buckets:
                self.stats.refuse("max_buckets")
                self._warn("max_buckets", f"{len(self.local)} buckets tracked "
                           "(rlqs.max_buckets): new buckets are not served")  # fmt: skip
                return None
            text = bucket_text(usage.domain, usage.entries)
            rule = self.settings.rule_for(usage.domain, usage.entries)
            sub = Sub(key, usage.domain, usage.entries, rule, self.stats.label(text))
            stream.subs[key] = sub
            self.local.setdefault(key, set()).add(stream.id)
            if rule is None:
                self.stats.count_unmatched(usage.domain)
                self._warn(key, f"no rlqs rule matches bucket {text[:200]!r}: "
                           f"{self.settings.unmatched}")  # fmt: skip
            self.stats.reported(sub.label, usage.allowed, usage.denied)
            elapsed = usage.elapsed_s * 1000
            if elapsed >= 1000:  # Envoy had the bucket before this stream: a reconnect
                sub.adopting = ADOPT_REPORTS
                sub.cap = usage.allowed * 1_000_000 // elapsed
                sub.demand = count * 1_000_000 // elapsed
            else:
                sub.demand = -1
            allowed, denied = usage.allowed, usage.denied
        else:
            self.stats.reported(sub.label, usage.allowed, usage.denied)
            allowed = usage.allowed + sub.carried[0]
            denied = usage.denied + sub.carried[1]
            elapsed = now - sub.last_ms
            if elapsed < MIN_STEP_MS and sub.sent is not None:
                sub.carried = (allowed, denied)
                return sub
            elapsed = max(100, elapsed)
            sub.carried = (0, 0)
            sub.demand = (allowed + denied) * 1_000_000 // elapsed
            sub.cap = -1
        sub.allowed = allowed * 1_000_000 // max(1000, elapsed)
        sub.denied = denied * 1_000_000 // max(1000, elapsed)
        sub.last_ms = now
        return sub

    def _resolve(self, sub: Sub) -> PolicySpec | None:
        """The sub's policy now (toggles applied), its mode and global rate set."""
        if sub.rule is None:
            sub.mode = "unmatched"
            return None
        try:
            spec = self.engine.spec(sub.rule.policy)
        except BadRequest:  # not reachable: rules name policies of the same config
            sub.mode = "unmatched"
            return None
        sub.limit = limit_mrps(spec)
        if spec.block:
            sub.mode = "deny_all"
        elif not spec.enabled or spec.shadow:
            sub.mode = "allow_all"
        else:
            sub.mode = "quota"
        return spec

    async def _step(self, stream: Stream, sub: Sub, now: int) -> Grant | None:
        """Step the sub's record; None when it has no rule or the store failed."""
        spec = self._resolve(sub)
        if spec is None:
            return None
        s = Step(
            stream.id, now, sub.demand, sub.limit,
            self.settings.assignment_ttl * 1000 + HOLD_MARGIN_MS,
            sub.cap, sub.adopting > 0,
        )  # fmt: skip
        sub.cap = -1
        sub.adopting = max(0, sub.adopting - 1)
        try:
            grant = await self.state.step(sub.bucket, s)
        except StoreUnavailable as exc:
            self._store_failed(exc)
            return None
        sub.assigned, sub.envoys = grant.assigned, grant.envoys
        return grant

    def _action(self, sub: Sub) -> Action | None:
        """What the sub's bucket is told now (None: nothing, Envoy's no_assignment rule)."""
        ttl = self.settings.assignment_ttl
        if sub.mode == "unmatched":
            how = self.settings.unmatched
            if how == "no_assignment":
                return None
            return Action(sub.entries, "allow_all" if how == "allow" else "deny_all", ttl=ttl)
        if sub.mode != "quota":
            return Action(sub.entries, sub.mode, ttl=ttl)
        spec = self.engine.spec(sub.rule.policy) if sub.rule else None
        assert spec is not None
        return token_bucket(sub.entries, sub.assigned, sub.limit, spec, ttl, sub.sent)

    async def _restep_others(self, key: str, but: str) -> None:
        """Re-step this process's other streams of a bucket, pushing what changed."""
        now = self.now_ms()
        for stream_id in sorted(self.local.get(key, ())):
            if stream_id == but:
                continue
            stream = self.streams.get(stream_id)
            sub = None if stream is None else stream.subs.get(key)
            if stream is None or sub is None:
                continue
            if await self._step(stream, sub, now) is not None:
                self._push(stream, sub)

    def _push(self, stream: Stream, sub: Sub) -> None:
        """Send the sub's action if it differs from the last one sent (numbers or kind)."""
        action = self._action(sub)
        if action is not None and action != sub.sent:
            sub.sent = action
            self._send(stream, [action])

    def _send(self, stream: Stream, actions: list[Action]) -> None:
        if actions:
            for action in actions:
                self.stats.sent(action.kind)
            stream.send(actions)

    # --- reloads and toggles ------------------------------------------------------------------

    async def refresh(self) -> None:
        """Apply a reload or a toggle to every bucket of every stream (see the docstring)."""
        self.generation = self.engine.generation
        now = self.now_ms()
        settings = self.settings
        gone: list[tuple[Stream, Sub]] = []
        stepped: list[tuple[Stream, Sub]] = []
        for stream in list(self.streams.values()):
            pushed = []
            for sub in list(stream.subs.values()):
                rule = settings.rule_for(sub.domain, sub.entries)
                if rule is None and sub.rule is not None:
                    gone.append((stream, sub))
                    pushed.append(Action(sub.entries, "abandon"))
                    continue
                sub.rule = rule
                self._resolve(sub)
                if sub.mode == "quota":
                    stepped.append((stream, sub))
                    continue
                action = self._action(sub)
                if action is not None and action != sub.sent:
                    sub.sent = action
                    pushed.append(action)
            self._send(stream, pushed)  # blanket rules first, before any store call
        for stream, sub in gone:
            self._forget(stream, sub)
            try:
                await self.state.leave(sub.bucket, stream.id, now, False)
            except StoreUnavailable as exc:
                self._store_failed(exc)
        for stream, sub in stepped:
            if await self._step(stream, sub, now) is not None:
                self._push(stream, sub)

    def _forget(self, stream: Stream, sub: Sub) -> None:
        stream.subs.pop(sub.bucket, None)
        ids = self.local.get(sub.bucket)
        if ids is not None:
            ids.discard(stream.id)
            if not ids:
                del self.local[sub.bucket]

    async def watch(self, interval: float = 0.1) -> None:
        """Refresh whenever the engine's generation moves (a reload, a toggle)."""
        while True:
            await asyncio.sleep(interval)
            if self.engine.generation != self.generation:
                await self.refresh()

    # --- what it looks like -------------------------------------------------------------------

    def rows(self) -> list[Row]:
        """One row per bucket of this process (see ``stats.Row``)."""
        out = []
        for key, ids in list(self.local.items()):
            subs = [s.subs[key] for i in ids if (s := self.streams.get(i)) and key in s.subs]
            if not subs:
                continue
            first = subs[0]
            out.append(Row(
                first.label, first.rule.policy if first.rule else "", first.mode,
                first.limit / MRPS, sum(s.assigned for s in subs) / MRPS,
                sum(s.allowed for s in subs) / MRPS, sum(s.denied for s in subs) / MRPS,
                max(s.envoys for s in subs), len(subs),
            ))  # fmt: skip
        return out

    def _store_failed(self, exc: StoreUnavailable) -> None:
        self.engine.metrics.store_errors.inc()
        self._warn("store", f"quota state unavailable, assignments not renewed: {exc}")

    def _warn(self, what: str, message: str) -> None:
        """Log at most once per ``LOG_EVERY`` seconds per subject (bounded)."""
        now = time.monotonic()
        if now - self._logged.get(what, -math.inf) < LOG_EVERY:
            return
        if len(self._logged) > 1000:
            self._logged.clear()
        self._logged[what] = now
        log.warning("rlqs: %s", message)
