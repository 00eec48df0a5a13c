"""Rendezvous (highest-random-weight) placement of caller keys on named shards.

Every shard scores every key with a hash seeded by the shard's name; the key lives on the shard
with the highest score. Scores of a (key, shard) pair never depend on the other shards, so:

- adding a shard moves only the keys it now wins (about 1/N of them for N shards after the
  addition) and never moves a key between two shards that were already there;
- removing a shard moves only its own keys, each to the shard that scored second for it.

The score is BLAKE2b (8-byte digest, keyed with the shard name): stable across processes,
machines and Python versions — unlike ``hash()``, which is salted per process — and quick
enough for a per-request lookup; ``Rendezvous.owner`` also caches recent answers.

Keys are placed by their hash-tag text (``keys.encode_tag``), the same text that puts all of a
stack's state in one Redis Cluster slot, so one caller key always lives wholly on one shard.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import lru_cache

from ...errors import ConfigError


def score(tag: str, seed: bytes) -> bytes:
    """The weight of ``tag`` on the shard seeded ``seed`` (compare as bytes: big-endian)."""
    return hashlib.blake2b(tag.encode("utf-8", "surrogatepass"), digest_size=8, key=seed).digest()


def seed(name: str) -> bytes:
    """A shard's hash key: its name, digested to BLAKE2b's 64-byte key limit if longer."""
    raw = name.encode("utf-8", "surrogatepass")
    return raw if len(raw) <= 64 else hashlib.blake2b(raw, digest_size=64).digest()


def owner(tag: str, seeds: Sequence[bytes]) -> int:
    """The index of the shard that wins ``tag`` (ties, practically impossible, go to the first)."""
    best = -1
    best_score = b""
    for index, s in enumerate(seeds):
        weight = score(tag, s)
        if weight > best_score:
            best, best_score = index, weight
    return best


class Rendezvous:
    """Placement over a fixed list of shard names, with a cache of recent lookups."""

    __slots__ = ("_cached", "_seeds", "names")

    def __init__(self, names: Sequence[str], cache_size: int = 65536) -> None:
        names = tuple(names)
        if not names:
            raise ConfigError("shards=[] is invalid; expected at least one shard")
        for name in names:
            if not isinstance(name, str) or not name:
                raise ConfigError(f"shard name {name!r} is invalid; expected a non-empty string")
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(
                f"shard names {duplicates!r} appear more than once; expected distinct shards "
                "(give each Shard a distinct url or name=)"
            )
        self.names = names
        self._seeds = tuple(seed(n) for n in names)
        seeds = self._seeds

        def place(tag: str) -> int:
            return owner(tag, seeds)

        self._cached = lru_cache(maxsize=cache_size)(place)

    def owner(self, tag: str) -> int:
        """The index in ``names`` of the shard that holds ``tag``."""
        return self._cached(tag)
