"""Key layouts: where a caller key's state lives in Redis.

- **Keys** (the default, ``layout=None``): one Redis key per rate and caller key,
  ``{prefix}{{tag}}{slot}`` (``keys.redis_key``), a string with its own TTL.
- **Compact** (``CompactLayout``): the states of many caller keys share small Redis hashes, as
  large Redis users pack small values, because Redis' per-key overhead (the key's name and
  entries in the keyspace and expires tables, ~90 B) is most of what a counter costs. A caller
  key belongs to one of ``buckets`` buckets (CRC-32 of its field); rate ``slot`` of that bucket
  is the hash ``{prefix}{#:<bucket>}<slot>`` and the caller key is one field of it. The bucket is
  the hash tag, so every rate of a stack (and every hash of one bucket) is in one Cluster slot
  and one script sees them all. A hash stays listpack-encoded (a few bytes per field) while it
  has at most ``hash-max-listpack-entries`` fields (512 by default) of at most
  ``hash-max-listpack-value`` bytes (64): size ``buckets`` to about live keys per rate / 50.

The field is the caller key's tag (``keys.encode_tag``, injective) when it has at most 64 bytes,
else ``#`` and the URL-safe base64 of its SHA-256 (44 bytes; a tag never starts with ``#``, so
the two forms never meet). A bucket tag starts with ``#:``, which no caller key's tag does, so
compact hashes never share a name with the default layout's keys.

Expiry stays the app's: each state holds its end, compared with the caller's ``now`` by the
script. The scripts read and write through ``lua/layout_keys.lua`` or ``lua/layout_compact.lua``
(the algorithms' steps are the same): a new field sweeps three random fields of its hash whose
state no longer matters, and every write raises the hash's TTL to cover the state it wrote.
``sliding_log`` keeps one list per caller key (a list cannot be a hash field) with either
layout; leases keep their sorted sets.
"""

from __future__ import annotations

import base64
import hashlib
import zlib
from dataclasses import dataclass
from functools import lru_cache

from ...errors import ConfigError
from .keys import encode_tag

MAX_FIELD_BYTES = 64
"""Redis' default ``hash-max-listpack-value``: a longer field would convert the whole hash."""

PACKED = frozenset({"fixed_window", "token_bucket", "gcra", "sliding_window"})
"""The algorithms whose state the compact layout packs into hash fields."""


@dataclass(frozen=True, slots=True)
class CompactLayout:
    """Pack caller keys' states into ``buckets`` small hashes per rate (see the module doc)."""

    buckets: int = 4096

    def __post_init__(self) -> None:
        n = self.buckets
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 2**24:
            raise ConfigError(
                f"CompactLayout buckets={n!r} is invalid; expected a whole number from 1 to "
                "16,777,216 (about live keys per rate / 50)"
            )

    def packs(self, algorithm: str) -> bool:
        """Whether ``algorithm``'s states go into hash fields (else: one key each)."""
        return algorithm in PACKED


@lru_cache(maxsize=65536)
def compact_field(key: str) -> str:
    """The hash field of a caller key: its tag, or ``#`` + base64 SHA-256 past 64 bytes."""
    tag = encode_tag(key)
    if len(tag.encode("utf-8")) <= MAX_FIELD_BYTES and not tag.startswith("#"):
        return tag
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
    return "#" + base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def bucket_tag(field: str, buckets: int) -> str:
    """The hash tag of a field's bucket: ``#:`` and the bucket number in hex."""
    return f"#:{zlib.crc32(field.encode('utf-8')) % buckets:x}"


def check_layout(layout: object) -> CompactLayout | None:
    """``None`` (one key per rate) or a ``CompactLayout``, naming anything else."""
    if layout is not None and not isinstance(layout, CompactLayout):
        raise ConfigError(
            f"layout={layout!r} is invalid; expected None (one key per rate) or "
            "CompactLayout(buckets=...)"
        )
    return layout
