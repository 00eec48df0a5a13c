"""``Decision``: the answer to one request, and the response headers it implies.

A decision is built from one store reply only, so its headers always agree with its verdict
(GitHub's "rejected with Remaining: 5000" cannot happen). Header syntax:

- GitHub-style ``X-RateLimit-Limit / -Remaining / -Reset`` (integer epoch seconds) ``/ -Used``;
- the IETF draft "RateLimit header fields for HTTP" (draft-ietf-httpapi-ratelimit-headers-11,
  structured fields): ``RateLimit-Policy`` lists every rate of the stack as
  ``"name";q=<quota>;w=<window s>`` (and ``;qu="<unit>"`` when the rate says what it counts,
  ``Rate.unit``; a calendar rate's ``w`` is its unit's nominal length, a month 30 days, while
  its reset is the period's true end), and ``RateLimit`` gives the deciding rate as
  ``"name";r=<remaining>;t=<seconds>``;
- ``Retry-After`` (integer seconds, rounded up) on a rejection that can ever succeed.

``t`` is the seconds until more quota is available *for this client*: on a rejection that can
succeed, exactly the ``Retry-After`` value (the draft: Retry-After should not point earlier
than ``t``); otherwise the seconds until the deciding rate is fully reset or refilled, which
for ``fixed_window`` is also when its quota comes back, and for the refilling algorithms the
moment by which all of it has.

A rate's quota unit is ``Rate.unit``; ``headers(policy, unit)`` gives one for the rates that
state none (a middleware check's ``unit=``), so ``qu`` names what each rate counts.

Names are structured-field Strings, which hold printable ASCII only (RFC 8941 3.3.3): every
byte of a name's UTF-8 outside ``0x20-0x7E``, and ``%`` itself, is written ``%XX`` (upper-case
hex, as RFC 9651 Display Strings escape), so ``café`` goes out as ``"caf%C3%A9"``; ``"`` and
``\\`` are backslash-escaped. Every header value is ASCII.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .rates import Rate


@dataclass(frozen=True, slots=True)
class Decision:
    """Whether a request may proceed, and the state of the rate that decided.

    ``rate`` is the rate that rejected (for a stack, the one that frees up last), or when
    allowed the one with the least ``remaining``. ``reset_at`` is epoch seconds when that rate
    fully resets or refills; ``retry_after`` is 0 when allowed, else seconds until the same
    request would be admitted (``math.inf`` if never, e.g. cost above capacity).
    ``degraded`` marks a fail-open answer given without the store. ``quotas`` holds each
    stack rate's capacity (``burst`` when set), shown as ``q`` in ``RateLimit-Policy``; when
    empty, the deciding rate's quota is ``limit`` and every other rate's is its count.
    """

    allowed: bool
    limit: int
    remaining: int
    reset_at: float
    retry_after: float
    rate: Rate
    stack: tuple[Rate, ...]
    now: float
    degraded: bool = False
    quotas: tuple[int, ...] = ()

    @property
    def used(self) -> int:
        """Units of the deciding rate already used (``limit - remaining``)."""
        return self.limit - self.remaining

    def headers(self, policy: str | None = None, unit: str | None = None) -> dict[str, str]:
        """The response headers a server should send with this decision.

        ``policy`` names the quota in the IETF fields (default: the rate, e.g. ``100/1m``);
        ``unit`` is the quota unit (``qu``, e.g. ``content-bytes``) of the rates that state
        none (``Rate.unit`` wins).
        """
        return dict(zip(HEADER_NAMES, self.header_values(policy, unit), strict=False))

    def header_values(self, policy: str | None = None, unit: str | None = None) -> list[str]:
        """The values of ``headers()`` in ``HEADER_NAMES`` order, ``Retry-After`` last and only
        on a rejection that can succeed."""
        names, retry, reset_in = self._header_parts(policy, unit)
        remaining = str(self.remaining)
        out = [
            str(self.limit),
            remaining,
            str(math.ceil(self.reset_at - 1e-9)),
            str(self.limit - self.remaining),
            names[1],
            f"{names[0]};r={remaining};t={reset_in}",
        ]
        if retry is not None:
            out.append(str(retry))
        return out

    def header_lines(
        self, policy: str | None = None, unit: str | None = None
    ) -> list[tuple[bytes, bytes]]:
        """``headers()`` as an ASGI server sends them: names in lower case, names and values
        as bytes, in ``HEADER_NAMES`` order (the HTTP service's hot path builds no ``str``)."""
        names, retry, reset_in = self._header_parts(policy, unit)
        remaining = b"%d" % self.remaining
        out = [
            (_LIMIT, b"%d" % self.limit),
            (_REMAINING, remaining),
            (_RESET, b"%d" % math.ceil(self.reset_at - 1e-9)),
            (_USED, b"%d" % (self.limit - self.remaining)),
            (_POLICY, names[5]),
            (_RATELIMIT, b"%s;r=%s;t=%d" % (names[4], remaining, reset_in)),
        ]
        if retry is not None:
            out.append((_RETRY_AFTER, b"%d" % retry))
        return out

    def _header_parts(
        self, policy: str | None, unit: str | None = None
    ) -> tuple[_Names, int | None, int]:
        """The policy's names (``_names_kept``), ``Retry-After`` (None when not sent) and the
        ``t`` of the ``RateLimit`` field."""
        if unit is not None:
            policy = (policy, unit)  # type: ignore[assignment]  # the cache key: see _names_kept
        names = _NAMES_SEEN.get((policy, id(self.stack), id(self.rate), self.limit, self.quotas))
        if names is None or names[2] is not self.stack or names[3] is not self.rate:
            names = _names_kept(policy, self.stack, self.rate, self.limit, self.quotas)
        if not self.allowed and math.isfinite(self.retry_after):
            retry = max(1, math.ceil(self.retry_after - 1e-9))
            return names, retry, retry  # Retry-After never points earlier than t (module doc)
        return names, None, max(0, math.ceil(self.reset_at - self.now - 1e-9))


HEADER_NAMES = (
    "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "X-RateLimit-Used",
    "RateLimit-Policy", "RateLimit", "Retry-After",
)  # fmt: skip
"""The headers of a decision, in the order of ``Decision.header_values``."""

_LIMIT, _REMAINING, _RESET, _USED, _POLICY, _RATELIMIT, _RETRY_AFTER = (
    name.lower().encode() for name in HEADER_NAMES
)
_Names = tuple[str, str, object, object, bytes, bytes]
"""The deciding rate's item name and the ``RateLimit-Policy`` value, the stack and rate they
were made for, and the two names again as bytes."""
_NAMES_SEEN: dict[tuple[Any, int, int, int, tuple[int, ...]], _Names] = {}
"""``_names`` by the identity of the stack and rate (a ``Rate``'s hash is a Python call, and a
policy's decisions share its objects); each entry keeps its stack and rate alive, so an id
is never reused while it is here."""


def _names_kept(
    policy: str | tuple[str | None, str] | None,
    stack: tuple[Rate, ...],
    rate: Rate,
    limit: int,
    quotas: tuple[int, ...],
) -> _Names:
    """``_names``, remembered in ``_NAMES_SEEN`` (cleared when it reaches 4096 entries);
    ``policy`` is the name, or (name, quota unit) for a unit other than requests."""
    name, unit = policy if isinstance(policy, tuple) else (policy, None)
    deciding, quota_policy = _names(name, stack, rate, limit, quotas, unit)
    if len(_NAMES_SEEN) >= 4096:
        _NAMES_SEEN.clear()
    entry = (deciding, quota_policy, stack, rate, deciding.encode(), quota_policy.encode())
    _NAMES_SEEN[(policy, id(stack), id(rate), limit, quotas)] = entry
    return entry


def policy_names(
    policy: str | None, stack: tuple[Rate, ...], rate: Rate, limit: int, quotas: tuple[int, ...]
) -> tuple[str, str]:
    """The ``RateLimit`` item name of ``rate`` and the ``RateLimit-Policy`` value of a decision
    with these fields (for servers that make a policy's headers ahead)."""
    return _names(policy, stack, rate, limit, quotas)


@lru_cache(maxsize=4096)
def _names(
    policy: str | None,
    stack: tuple[Rate, ...],
    rate: Rate,
    limit: int,
    quotas: tuple[int, ...],
    unit: str | None = None,
) -> tuple[str, str]:
    """The deciding rate's item name and the ``RateLimit-Policy`` value: they depend only on
    the policy name, the stack, the deciding rate, the quotas and the unit, so they are built
    once."""
    names = [_item_name(policy, r, len(stack)) for r in stack]
    deciding = names[stack.index(rate)] if rate in stack else names[0]
    fields = []
    for n, r in zip(names, stack, strict=True):
        quota = quotas[stack.index(r)] if quotas else limit if r == rate else r.count
        qu = r.unit if r.unit is not None else unit
        said = "" if qu is None else f';qu="{qu}"'
        fields.append(f"{n};q={quota};w={max(1, math.ceil(r.period))}{said}")
    return deciding, ", ".join(fields)


class _DecisionFields:
    """``Decision``'s slots, writable: the hot path fills one and turns it into a ``Decision``.

    A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``; for nine
    fields that is most of the cost of a whole in-memory decision (measured ~2 us against
    ~0.4 us this way on CPython 3.11). The layouts are identical, so ``__class__`` may be
    reassigned; the result is an ordinary frozen ``Decision``.
    """

    __slots__ = Decision.__slots__
    allowed: bool
    limit: int
    remaining: int
    reset_at: float
    retry_after: float
    rate: Rate
    stack: tuple[Rate, ...]
    now: float
    degraded: bool
    quotas: tuple[int, ...]


def make_decision(
    allowed: bool,
    limit: int,
    remaining: int,
    reset_at: float,
    retry_after: float,
    rate: Rate,
    stack: tuple[Rate, ...],
    now: float,
    degraded: bool = False,
    quotas: tuple[int, ...] = (),
) -> Decision:
    """``Decision(...)`` with the same arguments, built without the frozen ``__init__``."""
    d = _DecisionFields()
    d.allowed = allowed
    d.limit = limit
    d.remaining = remaining
    d.reset_at = reset_at
    d.retry_after = retry_after
    d.rate = rate
    d.stack = stack
    d.now = now
    d.degraded = degraded
    d.quotas = quotas
    d.__class__ = Decision  # type: ignore[assignment]  # same slots: see _DecisionFields
    return d  # type: ignore[return-value]  # a Decision now; cast() would cost a call


def _item_name(policy: str | None, rate: Rate, size: int) -> str:
    name = rate.code if policy is None else (policy if size == 1 else f"{policy}.{rate.code}")
    return '"' + ascii_name(name).replace("\\", "\\\\").replace('"', '\\"') + '"'


def ascii_name(name: str) -> str:
    """``name`` in printable ASCII: each UTF-8 byte outside ``0x20-0x7E``, and ``%``, as ``%XX``
    (injective, and the identity for the usual names). Used for every name put in a header."""
    if name.isascii() and name.isprintable() and "%" not in name:
        return name
    out = []
    for char in name:
        if " " <= char <= "~" and char != "%":
            out.append(char)
        else:
            out.extend(f"%{b:02X}" for b in char.encode("utf-8", "surrogatepass"))
    return "".join(out)
