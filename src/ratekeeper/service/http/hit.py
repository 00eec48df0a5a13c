"""``POST /v1/hit``'s admitted fast hit (``engine.fast``) rendered from the store's ``Outcome``
directly: the same status, body and headers as the general path (``Decision.header_lines``,
``render._result_body``), in fewer steps.

Per policy, what does not change between responses is worked out once (``HitView``, kept on
the engine's ``HitPlan``, so it lives and dies with it): the ``RateLimit`` names and the body
and header lines around the numbers.
"""

from __future__ import annotations

import json
import math

from ...decision import HEADER_NAMES, policy_names
from ..engine.fast import Admitted, HitPlan

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


class HitView:
    """What a policy's admitted hits' responses share (see the module docstring)."""

    __slots__ = ("block", "body", "capacity", "deciding", "limit_header", "policy_header")

    def __init__(self, plan: HitPlan) -> None:
        spec = plan.spec
        policy = plan.policy
        limit = plan.limit
        self.capacity = limit.capacity
        self.limit_header = (_LIMIT, b"%d" % limit.capacity)
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
        """The header lines of ``rendered(..., block=True)``, the numbers left as ``%`` fields;
        what ``rendered`` lists, in the same order, as HTTP sends them."""


def rendered(made: Admitted, block: bool = False) -> tuple[bytes, HeaderList | bytes]:
    """An admitted fast hit's body and headers, ``content-type`` and ``content-length``
    included. ``block``: the headers as the lines HTTP sends (``name: value\\r\\n`` each),
    for the protocol's own answers (``http.connection``), instead of a list."""
    plan, o, now = made
    view = plan.view
    if view is None:
        view = plan.view = HitView(plan)
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
    body = view.body % (left, reset_json)
    if block:
        return body, view.block % (
            left, math.ceil(reset_at - 1e-9), view.capacity - remaining, left,
            reset_in if reset_in > 0 else 0, len(body),
        )  # fmt: skip
    headers = [
        view.limit_header,
        (_REMAINING, left),
        (_RESET, b"%d" % math.ceil(reset_at - 1e-9)),
        (_USED, b"%d" % (view.capacity - remaining)),
        view.policy_header,
        (_RATELIMIT, b"%s;r=%s;t=%d" % (view.deciding, left, reset_in if reset_in > 0 else 0)),
        _JSON,
    ]
    size = len(body)
    headers.append(_LENGTHS[size] if size < 1024 else (b"content-length", b"%d" % size))
    return body, headers


def ms_json(ms: int) -> bytes:
    """``repr(ms / 1000)`` for a whole number of ms in ``[0, 10**15)``, as bytes: that float is
    the double nearest to the decimal ``ms / 1000``, whose at most 15 significant digits make it
    the shortest text that reads back as the same double, which is what ``repr`` writes."""
    text = b"%d.%03d" % divmod(ms, 1000)
    if text[-1] != 48:  # 48: "0"
        return text
    text = text.rstrip(b"0")
    return text + b"0" if text[-1] == 46 else text  # 46: "."
