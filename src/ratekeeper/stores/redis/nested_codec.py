"""The sans-I/O half of nested calls on Redis: ``NestedPlan`` -> one ``EVALSHA`` -> reply.

- ``nested_script(layout)``: ``integer.lua``, then each algorithm's twin wrapped as
  ``ALG[name] = function(KEYS, ARGV, N, LEGACY) <layout><value><twin> end`` (the same files the
  one-key scripts are made of: one semantics; ``N`` and ``LEGACY``, which ``stack.lua``
  derives from the arguments of a one-key call, are given by the driver, as a settle's
  arguments would throw that count off), then ``nested.lua``, the driver. One script per key
  layout.
- ``nested_command(codec, plan)``: its keys and ARGV (``nested.lua``'s header has the
  contract). Every key carries the outermost level's hash tag (``nested_tag``: the caller
  key's, or its bucket's in the compact layout), so one Cluster slot, one shard, one script:

  - level 0 is the outer key's own counter: exactly the keys ``hit`` uses;
  - a level below is the counter of (outer key, the level's label, its key), named
    ``scoped``: ``{prefix}{tag}>{outer}>{label}>{key}>{slot}`` (each part escaped like a tag,
    ``>`` as ``%3E``; past 200 bytes ``#`` and the SHA-256 of the three), or in the compact
    layout the field ``#>{outer}>{label}>{key}`` (past 64 bytes ``#>#`` and the base64
    SHA-256) of the hash ``{prefix}{tag}>{slot}``. The label (``nested.level_label``: the
    level's name, or which unnamed level it is) keeps two levels apart whatever their keys.
    No name of ``hit``'s starts ``{prefix}{tag}>`` (a slot starts with an algorithm's
    letter) and no field of the compact layout starts ``#>`` (its hashed fields are base64),
    so nested counters never meet plain ones;
  - ``{prefix}{tag}>R`` and ``>Z``: the tag's reservations (a hash and a sorted set).
  - with ``legacy_keys``, level 0 also names its counters' 0.1 keys (read when a counter has
    no state under its own name yet, as ``hit`` does); scoped levels are new, with nothing
    to carry over.
- Calendar rates get the end of the period holding the call's ``now_ms`` as their
  ``period_ms`` argument (``codec.calendar_args``), as for ``hit``.
- ``nested_reply``: the script's integers -> ``NestedReply``.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Any

from ...algorithms import ALGORITHMS
from ...nested import NestedPlan, NestedReply, Tier
from ...plan import make_plan
from .codec import (
    _BY_SHA,
    VALUES,
    Codec,
    Command,
    Script,
    calendar_args,
    outcomes,
    policy_args,
)
from .keys import MAX_PLAIN_BYTES, encode_tag
from .layout import MAX_FIELD_BYTES, PACKED, compact_field


@cache
def nested_script(layout: str = "keys") -> Script:
    """The nested driver with every algorithm's twin for key layout ``keys`` or ``compact``."""
    lua = resources.files("ratekeeper.algorithms").joinpath("lua")

    def read(name: str) -> str:
        return lua.joinpath(name).read_text()

    parts = [read("integer.lua"), "local ALG = {}\n"]
    for name in ALGORITHMS:
        body = read(f"{name}.lua")
        if name in VALUES:  # its stored value's encoding, as in its one-key script
            body = read(f"value_{name}.lua") + body
        if name in PACKED:  # sliding_log keeps its lists in either layout
            body = read(f"layout_{layout}.lua") + body
        parts.append(f"ALG['{name}'] = function(KEYS, ARGV, N, LEGACY)\n{body}end\n")
    parts.append(read("nested.lua"))
    source = "".join(parts)
    sha = hashlib.sha1(source.encode("utf-8")).hexdigest()
    _BY_SHA[sha] = source  # codec.fallback finds it after NOSCRIPT
    return Script("nested", source, sha)


def _piece(key: str) -> str:
    return encode_tag(key).replace(">", "%3E")


def _triple(outer: str, label: str, key: str) -> str:
    """(outer, label, key) written injectively: three escaped tags joined by ``>``."""
    return f"{_piece(outer)}>{_piece(label)}>{_piece(key)}"


def scoped(outer: str, label: str, key: str) -> str:
    """The name part of (outer, label, key)'s counter in the default layout."""
    name = _triple(outer, label, key)
    if len(name.encode("utf-8", "surrogatepass")) > MAX_PLAIN_BYTES:
        return "#" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
    return name


def scoped_field(outer: str, label: str, key: str) -> str:
    """(outer, label, key)'s field in the compact layout's hashes."""
    name = _triple(outer, label, key)
    field = "#>" + name
    if len(field.encode("utf-8", "surrogatepass")) > MAX_FIELD_BYTES:
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).digest()
        return "#>#" + base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")
    return field


def nested_tag(codec: Codec, plan: NestedPlan) -> str:
    """The hash tag every key of ``plan`` carries: its outermost level's."""
    tier = plan.levels[0]
    return codec.tag(make_plan("hit", tier.policy, tier.key, 0, 1))


def _level(codec: Codec, tag: str, tier: Tier) -> tuple[list[str], str]:
    """A level's keys (level 0 with ``legacy_keys``: then their 0.1 names) and its compact
    field ('' when its state is not a hash field)."""
    policy = tier.policy
    packed = codec.layout is not None and codec.layout.packs(policy.algorithm.NAME)
    if tier.scope is None:
        keys = codec.keys(make_plan("hit", policy, tier.key, 0, 1))
        return keys, compact_field(tier.key) if packed else ""
    head = f"{codec.prefix}{{{tag}}}>"
    if packed:
        return [head + slot for slot in policy.slots], scoped_field(
            tier.scope, tier.label, tier.key
        )
    name = scoped(tier.scope, tier.label, tier.key)
    return [f"{head}{name}>{slot}" for slot in policy.slots], ""


def nested_command(codec: Codec, plan: NestedPlan) -> Command:
    """The ``EVALSHA`` of ``plan`` (see ``nested.lua`` for the contract)."""
    tag = nested_tag(codec, plan)
    keys: list[str] = []
    argv: list[Any] = [plan.op, plan.now_ms, plan.rid, plan.amount, plan.keep_ms, plan.hold_ms]
    argv.append(len(plan.levels))
    for tier in plan.levels:
        level_keys, field = _level(codec, tag, tier)
        keys += level_keys
        policy = tier.policy
        n = len(policy.slots)
        legacy = int(len(level_keys) > n)
        argv += (policy.algorithm.NAME, n, tier.cost, int(tier.settles), field, legacy)
        args = calendar_args(policy, plan.now_ms) if policy.calendar else policy_args(policy)
        for i, debt in enumerate(tier.debts):
            argv += (*args[3 * i : 3 * i + 3], debt)
    keys += (f"{codec.prefix}{{{tag}}}>R", f"{codec.prefix}{{{tag}}}>Z")
    sha = nested_script("keys" if codec.layout is None else "compact").sha
    return ("EVALSHA", sha, len(keys), *keys, *argv)


def nested_reply(plan: NestedPlan, reply: Sequence[Any]) -> NestedReply:
    """The script's reply -> (allowed or status, each level's outcomes)."""
    head = int(reply[0])
    if plan.op in ("refund", "settle", "cancel") or head == -1:
        return (head, ())
    out = []
    at = 1
    for tier in plan.levels:
        size = 4 * len(tier.policy.limits)
        out.append(outcomes(reply[at : at + size]))
        at += size
    return (head, tuple(out))
