"""The sans-I/O half of the Redis stores: plans become script calls, replies become outcomes.

Nothing here does I/O, so ``RedisStore``'s sync and async paths (and the sharded and cluster
stores built on it) share it and differ only in how they send a command.

- ``Script``: one algorithm's Lua twin (``algorithms/lua/<name>.lua``) for one key layout
  (``stack.lua`` + ``integer.lua`` + ``layout_<layout>.lua`` + ``value_<name>.lua`` for the
  algorithms in ``VALUES`` + the twin), read with ``importlib.resources`` and SHA1-hashed
  once per process.
- ``Codec``: per store prefix and key layout (``layout``), turns a ``Plan`` into the full
  ``EVALSHA`` command (``EVALSHA_RO`` for ``peek``, so a replica can serve it) or into the
  command of a ``reset``. Each policy's script and per-rate ARGV are computed once and
  remembered.
- ``Codec.packed``: the same command as RESP request bytes, assembled from pieces encoded once
  per policy (a pipeline of many plans sends these); ``pack`` encodes any command.
- ``fallback``: the same command as ``EVAL``/``EVAL_RO`` with the source, for after ``NOSCRIPT``
  (``EVAL`` also puts the script back in the server's cache, so no extra round trip).
- ``outcomes``: the script's flat integer reply -> one ``Outcome`` per rate.
- ``Codec.admin``: an admin's ``reset``/``credit``/``debit`` as one call of the algorithm's
  admin script (``admin_script``: the twin wrapped in a function and run three times — a
  peek of nothing, the change, a peek again — by ``lua/admin.lua``), so the change and the
  state before and after it are one atomic step; ``admin_outcomes`` splits its reply.
- Calendar rates (``Policy.calendar``) get their window end per call: the rate's ``period_ms``
  argument is the end of the calendar period holding the plan's ``now_ms``
  (``calendar_args``), computed here from the limiter's clock, never by Redis.

The wire contract shared by every script (each script's header repeats it):
``KEYS[i]`` is rate i's key (``stores.keys.redis_key``; all share the caller's hash tag) or,
in the compact layout, rate i's hash of the caller key's bucket (``stores.redis.layout``);
``ARGV`` is ``op`` (``hit``/``peek``/``refund``), ``now_ms``, ``cost``, then three integers per
rate: ``count``, ``period_ms`` and ``extra`` (``burst`` for token_bucket and gcra, ``buckets``
for sliding_window, the option bits ``Limit.flags`` otherwise), then, in the compact layout
only, the caller key's field. ``hit``/``peek`` reply four integers per rate: allowed (1/0),
remaining, reset_ms and retry_ms (-1 for never); ``refund`` replies an empty array.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from ...algorithms import ALGORITHMS, Outcome
from ...algorithms.base import INF
from ...errors import ConfigError
from ...plan import Plan, Policy
from .keys import check_prefix, encode_tag, redis_key
from .layout import CompactLayout, bucket_tag, check_layout, compact_field

Command = tuple[Any, ...]
_Packed = tuple[Policy, bytes, tuple[bytes, ...], bytes, bytes, bool]
"""A policy's pre-encoded pieces for one op: policy, head, slots, op, tail, and whether its
states are packed into hash fields (``Codec.packed``)."""
_Entry = tuple[Policy, str, tuple[str, ...], tuple[int, ...], bool]
"""A policy's script SHA, slots, per-rate ARGV and packing (``Codec.command``)."""

VALUES = ("fixed_window", "token_bucket", "gcra")
"""The algorithms whose stored value other scripts read too (``slices.lua``): each is encoded
once, in ``value_<name>.lua``, prepended to its twin wherever the twin is loaded and to
``slices.lua``. One file per algorithm, so a script creates only the functions it uses (a
script's local functions are made anew at every call)."""

COMPACT_RESET = "for i = 1, #KEYS do redis.call('HDEL', KEYS[i], ARGV[1]) end"
"""A compact layout's reset: the caller key's field out of each rate's hash (sent as EVAL)."""


@dataclass(frozen=True, slots=True)
class Script:
    """One Lua script: its algorithm's name, source text and SHA1 (the ``EVALSHA`` name)."""

    name: str
    source: str
    sha: str


@cache
def admin_script(name: str, layout: str = "keys") -> Script:
    """The admin script of algorithm ``name`` for a key layout: the twin as a function
    ``run(ARGV)`` and ``admin.lua`` calling it (see the module docstring)."""
    base = script(name, layout)
    lua = resources.files("ratekeeper.algorithms").joinpath("lua")
    twin = lua.joinpath(f"{name}.lua").read_text()
    prologue = base.source[: len(base.source) - len(twin)]
    if name == "sliding_log":  # its lists are not in a layout: a reset deletes them
        prologue += (
            "local function drop(i)\n  redis.call('DEL', KEYS[i])\n"
            "  if LEGACY then\n    redis.call('DEL', KEYS[N + i])\n  end\nend\n"
        )
    source = (
        prologue
        + "local function run(ARGV)\n"
        + twin
        + "\nend\n"
        + lua.joinpath("admin.lua").read_text()
    )
    sha = hashlib.sha1(source.encode("utf-8")).hexdigest()
    _BY_SHA[sha] = source
    return Script(f"{name}:admin", source, sha)


@cache
def script(name: str, layout: str = "keys") -> Script:
    """The Lua twin of algorithm ``name`` for key layout ``keys`` or ``compact``, read and
    hashed once."""
    if name not in ALGORITHMS:
        raise ConfigError(
            f"no Lua script for algorithm {name!r}; expected one of {sorted(ALGORITHMS)}"
        )
    lua = resources.files("ratekeeper.algorithms").joinpath("lua")
    # integer.lua (exact integer division), the layout's load/save and value_<name>.lua
    # (the stored value's encoding, shared with slices.lua) are one copy each, prepended
    # here (sliding_log keeps its lists in either layout)
    parts = ["stack.lua", "integer.lua", f"layout_{layout}.lua", f"{name}.lua"]
    if name == "sliding_log":
        parts.remove(f"layout_{layout}.lua")
    if name in VALUES:
        parts.insert(-1, f"value_{name}.lua")
    source = "".join(lua.joinpath(part).read_text() for part in parts)
    sha = hashlib.sha1(source.encode("utf-8")).hexdigest()
    _BY_SHA[sha] = source
    return Script(name, source, sha)


_BY_SHA: dict[str, str] = {}


def calendar_args(policy: Policy, now_ms: int) -> tuple[int, ...]:
    """``policy_args`` with each calendar rate's ``period_ms`` replaced by the end of its
    period holding ``now_ms`` (the window a hit would open now)."""
    out = list(policy_args(policy))
    for i, limit in enumerate(policy.limits):
        calendar = limit.rate.calendar
        if calendar is not None:
            out[3 * i + 1] = calendar.end_ms(now_ms)
    return tuple(out)


def policy_args(policy: Policy) -> tuple[int, ...]:
    """The per-rate ARGV tail: count, period_ms, extra for every rate of the stack."""
    name = policy.algorithm.NAME
    out: list[int] = []
    for limit in policy.limits:
        if name == "sliding_window":
            extra = limit.buckets
        elif name in ("token_bucket", "gcra"):
            extra = limit.capacity
        else:
            extra = limit.flags  # fixed_window's option bits; 0 for the others
        out += (limit.count, limit.period_ms, extra)
    return tuple(out)


class Codec:
    """Plans -> commands for one key prefix and layout; remembers each policy's script and
    ARGV tail."""

    __slots__ = (
        "_buckets",
        "_packed",
        "_policies",
        "_prefix_bytes",
        "layout",
        "legacy",
        "prefix",
    )

    def __init__(
        self, prefix: str = "rk", layout: CompactLayout | None = None, legacy: bool = False
    ) -> None:
        self.prefix = check_prefix(prefix)
        self.layout = check_layout(layout)
        if not isinstance(legacy, bool):
            raise ConfigError(f"legacy_keys={legacy!r} is invalid; expected True or False")
        self.legacy = legacy
        """Send each rate's 0.1 key name too (``Policy.legacy``), to read state from it."""
        self._buckets = 0 if layout is None else layout.buckets
        self._prefix_bytes = prefix.encode()
        # id(policy) -> (policy, sha, slots, args, packed); the policy keeps its id unique.
        self._policies: dict[int, _Entry] = {}
        # (id(policy), op) -> the pieces ``packed`` joins (the policy keeps its id unique)
        self._packed: dict[tuple[int, str], _Packed] = {}

    def _compact(self, policy: Policy) -> bool:
        return self.layout is not None and self.layout.packs(policy.algorithm.NAME)

    def slots(self, policy: Policy) -> tuple[str, ...]:
        """The slots a call names: the policy's, then (``legacy``) their 0.1 names."""
        return policy.slots + policy.legacy if self.legacy else policy.slots

    def tag(self, plan: Plan) -> str:
        """The hash tag of the plan's keys (a Cluster routes by it): the caller key's, or its
        bucket's in the compact layout."""
        if self.layout is not None and self.layout.packs(plan.policy.algorithm.NAME):
            return bucket_tag(compact_field(plan.key), self.layout.buckets)
        return encode_tag(plan.key)

    def keys(self, plan: Plan) -> list[str]:
        """The Redis keys of the plan's rates, in stack order (compact: the hashes)."""
        prefix, slots = self.prefix, self.slots(plan.policy)
        if self.layout is not None and self.layout.packs(plan.policy.algorithm.NAME):
            tag = bucket_tag(compact_field(plan.key), self.layout.buckets)
            return [f"{prefix}{{{tag}}}{slot}" for slot in slots]
        return [redis_key(prefix, plan.key, slot) for slot in slots]

    def reset(self, plan: Plan) -> Command:
        """The command that forgets the plan's state: ``DEL`` of its keys, or in the compact
        layout the caller key's field out of each hash."""
        keys = self.keys(plan)
        if self._compact(plan.policy):
            return ("EVAL", COMPACT_RESET, len(keys), *keys, compact_field(plan.key))
        return ("DEL", *keys)

    def command(self, plan: Plan) -> Command:
        """The full command for ``hit``/``peek``/``refund`` (``reset``: see ``reset``)."""
        policy = plan.policy
        entry = self._policies.get(id(policy))
        if entry is None or entry[0] is not policy:
            entry = self._remember(policy)
        _, sha, slots, args, compact = entry
        op = plan.op
        if policy.calendar:
            args = calendar_args(policy, plan.now_ms)
        name = "EVALSHA_RO" if op == "peek" else "EVALSHA"
        if compact:
            keys = self.keys(plan)
            field = compact_field(plan.key)
            return (name, sha, len(keys), *keys, op, plan.now_ms, plan.cost, *args, field)
        if len(slots) == 1:
            key = redis_key(self.prefix, plan.key, slots[0])
            return (name, sha, 1, key, op, plan.now_ms, plan.cost, *args)
        prefix, caller = self.prefix, plan.key
        keys = [redis_key(prefix, caller, slot) for slot in slots]
        return (name, sha, len(keys), *keys, op, plan.now_ms, plan.cost, *args)

    def packed(self, plan: Plan) -> bytes:
        """``pack(self.command(plan))`` for ``hit``/``peek``/``refund``, built faster.

        Everything but the caller's key, ``now_ms`` and ``cost`` is encoded once per policy
        and op: the head (array length, command name, SHA, key count), each slot's name, the
        op, and the tail (the per-rate ARGV).
        """
        policy = plan.policy
        entry = self._packed.get((id(policy), plan.op))
        if entry is None or entry[0] is not policy:
            entry = self._remember_packed(policy, plan.op)
        _, head, slots, op, tail, compact = entry
        if policy.calendar:
            tail = _bulks(*calendar_args(policy, plan.now_ms))
        prefix = self._prefix_bytes
        if compact:
            field = compact_field(plan.key)
            tag = bucket_tag(field, self._buckets).encode()
            data = field.encode()
            tail = b"%s$%d\r\n%s\r\n" % (tail, len(data), data)
        else:
            tag = encode_tag(plan.key).encode()  # never a surrogate: encode_tag escapes them
        size = len(prefix) + len(tag) + 2
        if len(slots) == 1:
            keys = b"$%d\r\n%s{%s}%s\r\n" % (size + len(slots[0]), prefix, tag, slots[0])
        else:
            keys = b"".join(
                b"$%d\r\n%s{%s}%s\r\n" % (size + len(slot), prefix, tag, slot) for slot in slots
            )
        now = b"%d" % plan.now_ms
        cost = b"%d" % plan.cost
        return b"%s%s%s$%d\r\n%s\r\n$%d\r\n%s\r\n%s" % (
            head, keys, op, len(now), now, len(cost), cost, tail,
        )  # fmt: skip

    def admin(self, plan: Plan) -> Command:
        """The one call of an admin's ``reset``, ``credit`` or ``debit`` (``plan.op``): the
        algorithm's admin script, which replies the peek before and the peek after."""
        policy = plan.policy
        compact = self._compact(policy)
        sha = admin_script(policy.algorithm.NAME, "compact" if compact else "keys").sha
        keys = self.keys(plan)
        args = calendar_args(policy, plan.now_ms) if policy.calendar else policy_args(policy)
        tail = (compact_field(plan.key),) if compact else ()
        return ("EVALSHA", sha, len(keys), *keys, plan.op, plan.now_ms, plan.cost, *args, *tail)

    def _remember_packed(self, policy: Policy, op: str) -> _Packed:
        if len(self._packed) >= 4096:
            self._packed.clear()
        name = "EVALSHA_RO" if op == "peek" else "EVALSHA"
        args = policy_args(policy)
        n = len(self.slots(policy))
        compact = self._compact(policy)
        sha = script(policy.algorithm.NAME, "compact" if compact else "keys").sha
        # name, sha, numkeys, the keys, op, now_ms, cost, the per-rate ARGV (, the field)
        head = b"*%d\r\n" % (3 + n + 3 + len(args) + compact) + _bulks(name, sha, n)
        slots = tuple(s.encode() for s in self.slots(policy))
        entry = (policy, head, slots, _bulks(op), _bulks(*args), compact)
        self._packed[(id(policy), op)] = entry
        return entry

    def _remember(self, policy: Policy) -> _Entry:
        if len(self._policies) >= 4096:
            self._policies.clear()
        compact = self._compact(policy)
        sha = script(policy.algorithm.NAME, "compact" if compact else "keys").sha
        entry = (policy, sha, self.slots(policy), policy_args(policy), compact)
        self._policies[id(policy)] = entry
        return entry


def pack(command: Command) -> bytes:
    """One command of strings, integers and bytes -> its RESP request bytes."""
    return b"*%d\r\n" % len(command) + _bulks(*command)


def _bulks(*args: Any) -> bytes:
    """RESP bulk strings of ``args``, concatenated (no array header)."""
    parts = []
    for arg in args:
        if isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, int):
            data = b"%d" % arg
        elif isinstance(arg, bytes):
            data = arg
        else:
            raise TypeError(f"cannot send {arg!r} to Redis: expected str, int or bytes")
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def fallback(command: Command) -> Command:
    """``command`` with ``EVALSHA``/``EVALSHA_RO`` replaced by ``EVAL``/``EVAL_RO`` and source."""
    name = "EVAL_RO" if command[0] == "EVALSHA_RO" else "EVAL"
    return (name, _BY_SHA[command[1]], *command[2:])


def admin_outcomes(
    reply: Sequence[int] | None,
) -> tuple[tuple[Outcome, ...], tuple[Outcome, ...]]:
    """An admin script's reply (a peek before, a peek after) -> the two outcome tuples."""
    values = list(reply or ())
    half = len(values) // 2
    return outcomes(values[:half]), outcomes(values[half:])


def outcomes(reply: Sequence[int] | None) -> tuple[Outcome, ...]:
    """A script reply (4 integers per rate, or empty) -> one ``Outcome`` per rate."""
    if not reply:
        return ()
    if len(reply) == 4:  # the common single-rate case, without the generator
        a, r, s, t = reply
        return (Outcome(a == 1, r, s, INF if t < 0 else float(t)),)
    it = iter(reply)
    return tuple(
        Outcome(a == 1, r, s, INF if t < 0 else float(t))
        for a, r, s, t in zip(it, it, it, it, strict=True)
    )
