"""``POST /v1/hit``'s common case on an in-process store, with its response made from the store's
``Outcome`` directly: the same answer, status, body, headers and metrics as the general path
(``Engine.decide_now``, ``Decision.header_lines``, ``http._result_body``), in fewer steps.

Per policy, what does not change between requests is worked out once (``HitPlan``): the rate's
store slot, algorithm and limit, the ``allowed`` counter series, the ``RateLimit`` names and the
body around the numbers. Plans are tied to the policy object they were made from and forgotten
when the engine's generation changes (a reload or a toggle), so none outlives its config.

The common case is an enabled, non-blocking policy of one rate, no over-limit cache entry, and
a hit the store admits. Anything else (a rejection too) goes the general way: a rejection is
made into a ``Decision`` and settled by the engine, exactly as ``decide_now`` does.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

from ...algorithms import Outcome
from ...decision import HEADER_NAMES, policy_names
from ...plan import decide_one
from ..config.policies import PolicySpec
from ..engine import Engine, Result

HeaderList = list[tuple[bytes, bytes]]
_LIMIT, _REMAINING, _RESET, _USED, _POLICY, _RATELIMIT = (
    name.lower().encode() for name in HEADER_NAMES[:6]
)
_JSON = (b"content-type", b"application/json")
_LENGTHS = tuple((b"content-length", b"%d" % n) for n in range(1024))
"""The ``content-length`` header of bodies under 1 kB (a decision's, unless its name is long)."""
_BIG = 10**15
"""Epoch ms below this have at most 15 significant digits, so ``repr(ms / 1000)`` is their
decimal form (see ``ms_json``)."""


class HitPlan:
    """What a policy's admitted hits share (see the module docstring)."""

    __slots__ = (
        "algorithm", "block", "body", "capacity", "cell", "clock", "deciding", "hit_one",
        "limit", "limit_header", "policy_header", "prefix", "rate", "slot", "spec",
    )  # fmt: skip

    def __init__(
        self, spec: PolicySpec, engine: Engine, hit_one: Callable[..., Outcome] | None
    ) -> None:
        policy = spec.policy
        self.hit_one = hit_one
        """The in-process store's ``hit_one``; None when the store must be asked."""
        self.rate = policy.rates[0]
        self.clock = engine.limiter.clock
        limit = policy.limits[0]
        self.spec = spec
        self.slot = policy.slots[0]
        self.prefix = f"{len(spec.name)}:{spec.name}:"  # store_key's, before the key
        self.algorithm = policy.algorithm
        self.limit = limit
        self.capacity = limit.capacity
        self.limit_header = (_LIMIT, b"%d" % limit.capacity)
        self.cell = engine.metrics.decision_cell(spec.label or spec.name, "allowed")
        deciding, quota_policy = policy_names(
            spec.name, policy.rates, policy.rates[0], limit.capacity, ()
        )
        self.deciding = deciding.encode()
        self.policy_header = (_POLICY, quota_policy.encode())
        head = b'{"allowed":true,"limit":%d,"remaining":' % limit.capacity
        tail = b',"retry_after":0.0,"policy":%s,"degraded":false,"shadow":false}' % (
            json.dumps(spec.name).encode()
        )
        self.body = head.replace(b"%", b"%%") + b'%s,"reset_at":%s' + tail.replace(b"%", b"%%")
        fixed = [
            b"%s: %s\r\n" % (name, value.replace(b"%", b"%%"))
            for name, value in (self.limit_header, self.policy_header, _JSON)
        ]
        self.block = b"".join([
            fixed[0], _REMAINING, b": %s\r\n", _RESET, b": %d\r\n", _USED, b": %d\r\n", fixed[1],
            _RATELIMIT, b": ", self.deciding.replace(b"%", b"%%"), b";r=%s;t=%d\r\n", fixed[2],
            b"content-length: %d\r\n",
        ])  # fmt: skip
        """The header lines of ``answer(..., block=True)``, the numbers left as ``%`` fields;
        what ``answer`` lists, in the same order, as HTTP sends them."""


class HttpHits:
    """The HTTP API's fast hits: ``answer`` decides one, or says to take the general path."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._generation = engine.generation
        self._plans: dict[str, HitPlan] = {}

    def answer(
        self, spec: PolicySpec, key: str, cost: int, block: bool = False
    ) -> tuple[bytes, HeaderList | bytes] | Result | None:
        """An admitted hit's body and headers, ``content-type`` and ``content-length`` included
        (counted); a ``Result`` when the store rejected it (settled: counted and cached as
        ``decide_now`` does); None when the common case does not apply (nothing done).
        ``block``: the headers as the lines HTTP sends (``name: value\\r\\n`` each), for the
        protocol's own answers (``http.connection``), instead of a list."""
        engine = self.engine
        plan = self._plan(spec)
        if plan is None:
            return None
        if plan.hit_one is None or (engine.cache._entries and engine.config.local_cache):
            return None  # a store to ask, or decide_now's cache check
        now = int(plan.clock() * 1000 + 0.5)  # as the limiter's ``plan``
        o = plan.hit_one(plan.slot, plan.prefix + key, plan.algorithm, plan.limit, now, cost)
        return self._made(plan, key, cost, o, now, block)

    def stored(
        self,
        spec: PolicySpec,
        key: str,
        cost: int,
        outcomes: tuple[Outcome, ...],
        now: int,
        block: bool = False,
    ) -> tuple[bytes, HeaderList | bytes] | Result | None:
        """``answer`` for a hit or peek the store answered (``outcomes``, of a plan made at
        ``now`` ms; the over-limit cache was asked before): None when the policy has no plan
        (nothing done), as the general path would answer it otherwise."""
        plan = self._plan(spec)
        if plan is None:
            return None
        return self._made(plan, key, cost, outcomes[0], now, block)

    def _made(
        self, plan: HitPlan, key: str, cost: int, o: Outcome, now: int, block: bool
    ) -> tuple[bytes, HeaderList | bytes] | Result:
        """The answer to the store's outcome ``o`` of a plan's one rate (``answer``)."""
        if not o[0]:
            return self.engine.settle(plan.spec, key, cost, decide_one(plan.spec.policy, o, now))
        plan.cell.inc()
        remaining = o[1]
        reset_ms = o[2]
        reset_at = reset_ms / 1000  # the Decision's fields, computed as decide_one does
        if type(reset_ms) is int and 0 <= reset_ms < _BIG:  # ms_json, inlined
            reset_json = b"%d.%03d" % divmod(reset_ms, 1000)
            if reset_json[-1] == 48:  # 48: "0"
                reset_json = ms_json(reset_ms)
        else:
            reset_json = float.__repr__(reset_at).encode()
        left = b"%d" % remaining
        reset_in = math.ceil(reset_at - now / 1000 - 1e-9)
        body = plan.body % (left, reset_json)
        if block:
            return body, plan.block % (
                left, math.ceil(reset_at - 1e-9), plan.capacity - remaining, left,
                reset_in if reset_in > 0 else 0, len(body),
            )  # fmt: skip
        headers = [
            plan.limit_header,
            (_REMAINING, left),
            (_RESET, b"%d" % math.ceil(reset_at - 1e-9)),
            (_USED, b"%d" % (plan.capacity - remaining)),
            plan.policy_header,
            (_RATELIMIT, b"%s;r=%s;t=%d" % (plan.deciding, left, reset_in if reset_in > 0 else 0)),
            _JSON,
        ]
        size = len(body)
        headers.append(_LENGTHS[size] if size < 1024 else (b"content-length", b"%d" % size))
        return body, headers

    def _plan(self, spec: PolicySpec) -> HitPlan | None:
        """The policy's plan (made now if this config has none yet); None when its hits take
        the general way."""
        engine = self.engine
        plan = self._plans.get(spec.name)
        if plan is not None and plan.spec is spec and engine.generation == self._generation:
            return plan
        if engine.generation != self._generation:
            self._generation = engine.generation
            self._plans.clear()
        if (
            not spec.enabled
            or spec.block
            or len(spec.policy.limits) != 1
            or engine.config.policies.get(spec.name) is not spec  # toggled: a copy
        ):
            return None
        plan = self._plans[spec.name] = HitPlan(spec, engine, engine.limiter.local_hit_one)
        return plan


def ms_json(ms: int) -> bytes:
    """``repr(ms / 1000)`` for a whole number of ms in ``[0, 10**15)``, as bytes: that float is
    the double nearest to the decimal ``ms / 1000``, whose at most 15 significant digits make it
    the shortest text that reads back as the same double, which is what ``repr`` writes."""
    text = b"%d.%03d" % divmod(ms, 1000)
    if text[-1] != 48:  # 48: "0"
        return text
    text = text.rstrip(b"0")
    return text + b"0" if text[-1] == 46 else text  # 46: "."
