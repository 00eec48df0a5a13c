"""Envoy's Rate Limit Quota Service over gRPC: ``envoy.service.rate_limit_quota.v3.
RateLimitQuotaService/StreamRateLimitQuotas``, one bidirectional stream per Envoy, with
Envoy's own messages (``xds-protos``, imported only here).

This module is the wire: it checks the token (``auth.grpc``, as for ShouldRateLimit), reads
``RateLimitQuotaUsageReports`` into ``hub.Usage``s, hands them to ``hub.Quotas`` and writes
the ``hub.Action``s it sends as ``RateLimitQuotaResponse``s, from one writer task per stream
(so an action pushed by a reload or another stream's report can go at any time). Reports are
read leniently, as Envoy 1.40 sends them: a first report's ``time_elapsed`` of 0 and rounded
ones are accepted; a usage without a bucket id is skipped and counted. Bytes that are not a
report end the stream with ``INVALID_ARGUMENT``. The stream needs ``grpc.aio``: on the
standard server each stream would hold a handler thread for its whole life.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import grpc
from envoy.service.rate_limit_quota.v3 import rlqs_pb2 as pb
from envoy.type.v3 import ratelimit_strategy_pb2 as strategy_pb
from google.protobuf.message import DecodeError

from ..servicer import authorized
from .hub import Action, Quotas, Stream, Usage

SERVICE = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService"
METHOD = "StreamRateLimitQuotas"
MAX_USAGES = 100_000
"""Buckets read from one report (gRPC's 4 MB message holds fewer)."""
_BLANKET = {
    "allow_all": strategy_pb.RateLimitStrategy.ALLOW_ALL,
    "deny_all": strategy_pb.RateLimitStrategy.DENY_ALL,
}
log = logging.getLogger("ratekeeper.service")
EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]  # grpc-stubs does not declare it


def usages(raw: bytes) -> list[Usage]:
    """A report's buckets (``DecodeError`` for bytes that are not a report)."""
    report = pb.RateLimitQuotaUsageReports.FromString(raw)
    out = []
    domain = report.domain
    for u in report.bucket_quota_usages[:MAX_USAGES]:
        entries = tuple(sorted(u.bucket_id.bucket.items()))
        elapsed = max(0, u.time_elapsed.seconds)
        out.append(Usage(domain, entries, elapsed, u.num_requests_allowed, u.num_requests_denied))
    return out


def response(actions: list[Action]) -> bytes:
    """The ``RateLimitQuotaResponse`` carrying ``actions``."""
    message = pb.RateLimitQuotaResponse()
    for action in actions:
        item = message.bucket_action.add()
        for key, value in action.entries:
            item.bucket_id.bucket[key] = value
        if action.kind == "abandon":
            item.abandon_action.SetInParent()
            continue
        assignment = item.quota_assignment_action
        assignment.assignment_time_to_live.seconds = action.ttl
        rule = assignment.rate_limit_strategy
        if action.kind == "token_bucket":
            bucket = rule.token_bucket
            bucket.max_tokens = action.max_tokens
            bucket.tokens_per_fill.value = action.tokens_per_fill
            bucket.fill_interval.seconds = action.fill_seconds
        else:
            rule.blanket_rule = _BLANKET[action.kind]
    return bytes(message.SerializeToString())


class QuotaServicer:
    """Serves the stream on ``grpc.aio``."""

    def __init__(self, quotas: Quotas) -> None:
        self.quotas = quotas

    async def stream(self, _requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        quotas = self.quotas
        auth = quotas.engine.config.auth
        if auth.grpc and not authorized(auth, context.invocation_metadata()):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token")
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        stream = Stream(lambda actions: queue.put_nowait(response(actions)), context.peer())
        quotas.open(stream)
        writer = asyncio.create_task(_write(queue, context))
        try:
            while True:
                raw = await context.read()
                if raw is EOF:
                    break
                try:
                    found = usages(raw)
                except DecodeError:
                    quotas.stats.refuse("report")
                    await context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"report: {len(raw)} bytes that are not a RateLimitQuotaUsageReports",
                    )
                await quotas.report(stream, found)
        finally:
            await quotas.end(stream)
            queue.put_nowait(None)
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(writer, 1.0)
            writer.cancel()


async def _write(queue: asyncio.Queue[bytes | None], context: Any) -> None:
    """Write the stream's queued responses in order until told to stop (None) or the call
    is gone."""
    while True:
        data = await queue.get()
        if data is None:
            return
        try:
            await context.write(data)
        except Exception:  # the call has ended (cancelled, reset): nothing more to write
            return


def handler(servicer: QuotaServicer) -> grpc.GenericRpcHandler[Any, Any]:
    """The generic handler to add to a ``grpc.aio`` server (bytes in, bytes out)."""
    method = grpc.stream_stream_rpc_method_handler(servicer.stream)
    return grpc.method_handlers_generic_handler(SERVICE, {METHOD: method})
