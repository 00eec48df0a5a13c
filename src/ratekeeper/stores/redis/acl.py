"""The Redis ACL rule for ratekeeper's user: the commands the stores send, and nothing else.

``acl_rule(prefix)`` is the rule's text for ``ACL SETUSER <user> reset on ><password> <rule>``
(or a line of an ACL file). It grants:

- keys: only ``{prefix}{*``: every key a store writes is ``prefix{tag}...`` (both layouts,
  leases too); no Pub/Sub channels;
- commands a store sends itself: the script calls (``EVALSHA``, ``EVALSHA_RO``; ``EVAL`` and
  ``EVAL_RO`` after ``NOSCRIPT``, and the compact layout's reset), ``DEL`` (reset) and
  ``PING`` (``store.ping()``, which the service runs at startup);
- commands the scripts run (Redis checks those against the user as well): strings (the default
  layout), hashes (the compact layout), lists (sliding_log), sorted sets (leases), TTLs;
- with ``cluster=True``, what redis-py's cluster client asks to learn the cluster
  (``CLUSTER SLOTS``, ``COMMAND``).

Not included: ``SELECT`` (add ``+select`` for a database other than 0), the ``Controls`` and
rollout flag hashes (add e.g. ``%R~ratekeeper:* +hgetall``), and ``CLIENT SETINFO`` (redis-py
sends it on connect to Redis 7.2+ and ignores a refusal). ``tests/test_redis_security.py``
runs every store operation as a user with exactly this rule over TLS, and checks that taking
away any one command breaks some operation.
"""

from __future__ import annotations

from .keys import check_prefix

SENT = ("evalsha", "evalsha_ro", "eval", "eval_ro", "del", "ping")
"""Commands the stores send themselves."""

IN_SCRIPTS = (
    # default layout (strings)
    "get", "set", "incrby",
    # compact layout (hashes)
    "hget", "hset", "hincrby", "hdel", "hrandfield",
    # sliding_log (lists)
    "llen", "lindex", "rpush", "linsert", "ltrim", "rpop",
    # leases (sorted sets)
    "zadd", "zcard", "zcount", "zrem", "zremrangebyscore", "zscore",
    # TTLs (leases, sliding_log, the compact layout's hashes)
    "pttl", "pexpire",
)  # fmt: skip
"""Commands the Lua scripts run."""

CLUSTER = ("cluster|slots", "command")
"""Commands redis-py's cluster client sends to discover the cluster."""


def acl_commands(*, cluster: bool = False) -> tuple[str, ...]:
    """Every command the rule allows, lower case."""
    return SENT + IN_SCRIPTS + (CLUSTER if cluster else ())


def acl_rule(prefix: str = "rk", *, cluster: bool = False) -> str:
    """The ACL rule (without user, ``on`` and password) for stores with key prefix ``prefix``."""
    allowed = " ".join(f"+{command}" for command in acl_commands(cluster=cluster))
    return f"resetkeys ~{check_prefix(prefix)}{{* resetchannels -@all {allowed}"
