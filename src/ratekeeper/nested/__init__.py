"""Nested limits and reservations as data: the rules, pure, that every store runs.

What belongs here: ``levels`` (``Level``, ``Tier``, ``NestedPlan``, ``run_levels``,
``decide_nested``: one all-or-nothing decision over several caller keys) and ``reservations``
(``Reservation``, ``Settlement``, the checks and the plans of reserve, settle and cancel).
No I/O and no store: the stores import these types, and the limiters' ``limiter.nesting``
builds the calls and answers them.
"""

from .levels import MAX_COST as MAX_COST
from .levels import MAX_DEBT as MAX_DEBT
from .levels import MAX_LEVELS as MAX_LEVELS
from .levels import Level as Level
from .levels import NestedDecision as NestedDecision
from .levels import NestedOp as NestedOp
from .levels import NestedPlan as NestedPlan
from .levels import NestedReply as NestedReply
from .levels import PolicyOf as PolicyOf
from .levels import RateSpec as RateSpec
from .levels import Tier as Tier
from .levels import compile_levels as compile_levels
from .levels import counter as counter
from .levels import decide_nested as decide_nested
from .levels import degraded_nested as degraded_nested
from .levels import level_label as level_label
from .levels import run_levels as run_levels
from .reservations import MAX_AMOUNT as MAX_AMOUNT
from .reservations import MAX_TTL as MAX_TTL
from .reservations import STATUSES as STATUSES
from .reservations import Reservation as Reservation
from .reservations import Settlement as Settlement
from .reservations import SettleStatus as SettleStatus
from .reservations import check_amount as check_amount
from .reservations import check_ttl as check_ttl
from .reservations import hold_ms as hold_ms
from .reservations import new_id as new_id
from .reservations import reserve_plan as reserve_plan
from .reservations import restored as restored
from .reservations import settle_plan as settle_plan
