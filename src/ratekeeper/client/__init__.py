"""``ratekeeper.client``: HTTP clients that pace themselves from the servers' rate-limit headers.

A ``Pacer`` (sync) or ``AsyncPacer`` learns each server's quotas from its answers (IETF
``RateLimit``/``RateLimit-Policy``, ``X-RateLimit-*``, OpenAI's and Anthropic's headers,
``Retry-After``) and holds each request until its budgets allow it; the drop-ins put one in
front of an existing client, each in one line (docs/client.md):

- httpx: ``ratekeeper.client.httpx.PacedTransport`` / ``AsyncPacedTransport``;
- requests: ``ratekeeper.client.requests.PacedAdapter``;
- aiohttp: ``ratekeeper.client.aiohttp.PacedMiddleware``.

This module imports none of the three (each drop-in module imports its own client).

The parts: ``headers`` (every header family -> ``Observation``), ``budget`` (one quota's view
and pace), ``core`` (the partitions and the rules), ``flow`` (one request's way, as a
generator), ``pacer`` (its sync and async shells), ``retry`` (which refusals are sent again,
the retry budget), ``shared`` (the pace across processes on a ratekeeper store),
``request`` (partitions and the ``Ratekeeper-*`` request headers), ``structured`` (RFC 8941
lists).
"""

from .budget import LearnedPolicy as LearnedPolicy
from .errors import WaitTooLong as WaitTooLong
from .flow import Answer as Answer
from .headers import Observation as Observation
from .headers import Quota as Quota
from .headers import read as read_headers
from .pacer import AsyncPacer as AsyncPacer
from .pacer import Pacer as Pacer
from .request import Outgoing as Outgoing
from .request import by_header as by_header
from .request import by_path_segments as by_path_segments
from .request import outgoing as outgoing
from .retry import Retries as Retries
from .retry import RetryBudget as RetryBudget

__all__ = [
    "Answer",
    "AsyncPacer",
    "LearnedPolicy",
    "Observation",
    "Outgoing",
    "Pacer",
    "Quota",
    "Retries",
    "RetryBudget",
    "WaitTooLong",
    "by_header",
    "by_path_segments",
    "outgoing",
    "read_headers",
]
