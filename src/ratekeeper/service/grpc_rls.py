"""Envoy's rate limit service over gRPC: ``envoy.service.ratelimit.v3.RateLimitService/
ShouldRateLimit``, with Envoy's own messages (the ``xds-protos`` package, generated from
envoyproxy/data-plane-api; imported only here, so ``import ratekeeper`` stays free of it).

This module is the wire: it checks the token, turns a ``RateLimitRequest`` into
``envoy.Descriptor``s, asks ``envoy.Envoy`` and builds the ``RateLimitResponse``. Before
anything is counted it refuses, with ``INVALID_ARGUMENT`` and nothing charged: an empty
domain or descriptor list, more than ``envoy.max_descriptors`` descriptors or
``envoy.max_entries`` entries in one request, a ``hits_addend`` over 2**31-1, a limit
override with unit ``UNKNOWN``, a counter key over ``max_key_length``, and a request whose
answer could exceed ``MAX_REPLY_BYTES`` (its size is checked again once built).
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
from envoy.service.ratelimit.v3 import rls_pb2 as pb

from ..errors import BadRequest
from .envoy import Answer, Descriptor, Envoy, check_override_unit
from .http import check_bearer

SERVICE = "envoy.service.ratelimit.v3.RateLimitService"
MAX_HITS = 2**31 - 1
MAX_REPLY_BYTES = 4 * 1024 * 1024
"""gRPC's default largest message a client accepts."""
_STATUS_BYTES = 64
"""An upper bound on one status without its name: code, limit, remaining, duration."""
log = logging.getLogger("ratekeeper.service")
Response = pb.RateLimitResponse


class RateLimitServicer:
    """Answers ShouldRateLimit."""

    def __init__(self, envoy: Envoy) -> None:
        self.envoy = envoy

    async def should_rate_limit(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        engine = self.envoy.engine
        config = engine.config
        auth = config.auth
        if auth.grpc:  # either token, as on HTTP's client routes
            given = dict(context.invocation_metadata() or ()).get("authorization", "")
            scheme, _, token = str(given).partition(" ")
            token = token.strip() if scheme.lower() == "bearer" else ""
            if not (
                (auth.token and check_bearer(token, auth.token))
                or (auth.admin_token and check_bearer(token, auth.admin_token))
            ):
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token")
        settings = config.envoy
        try:
            descriptors = descriptors_of(request, settings.max_descriptors, settings.max_entries)
            hits = request.hits_addend
            if hits > MAX_HITS:
                raise BadRequest("hits_addend", f"hits_addend {hits} is over {MAX_HITS}")
            metadata = settings.response_dynamic_metadata
            if len(descriptors) > 1 or metadata:  # one status alone is far below the bound
                check_reply_size(request, metadata)
            answer = await self.envoy.should_rate_limit(request.domain, descriptors, hits)
        except BadRequest as exc:
            engine.metrics.refused.labels(exc.field).inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{exc.field}: {exc}")
        response = build_response(answer)
        if len(answer.statuses) == 1 and answer.metadata is None:
            return response  # one status and its headers: bounded far below MAX_REPLY_BYTES
        size = response.ByteSize()
        if size > MAX_REPLY_BYTES:  # charged already: say so rather than send what fails
            log.error("ShouldRateLimit reply of %d bytes is over %d", size, MAX_REPLY_BYTES)
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"reply of {size} bytes is too large"
            )
        return response


def descriptors_of(request: Any, max_descriptors: int, max_entries: int) -> list[Descriptor]:
    """The request's descriptors, checked (see the module docstring)."""
    if not request.domain:
        raise BadRequest("domain", "domain is empty; every request must name its domain")
    count = len(request.descriptors)
    if not count:
        raise BadRequest("descriptors", "descriptors is empty; expected at least one")
    if count > max_descriptors:
        raise BadRequest(
            "descriptors",
            f"{count} descriptors in one request; the limit is {max_descriptors} "
            "(envoy.max_descriptors)",
        )
    descriptors = request.descriptors
    if count == 1:
        entries = len(descriptors[0].entries)
    else:
        entries = sum(len(d.entries) for d in descriptors)
    if entries > max_entries:
        raise BadRequest(
            "descriptors",
            f"{entries} descriptor entries in one request; the limit is {max_entries} "
            "(envoy.max_entries)",
        )
    out = []
    for i, d in enumerate(descriptors):
        pairs = tuple([(e.key, e.value) for e in d.entries])
        if len(d.ListFields()) <= 1:  # entries only (or nothing): Envoy's usual descriptor
            out.append(Descriptor(pairs))
            continue
        hits = None
        if d.HasField("hits_addend"):
            hits = d.hits_addend.value
            if hits > MAX_HITS:
                raise BadRequest(
                    "descriptors", f"descriptor {i} hits_addend {hits} is over {MAX_HITS}"
                )
        limit = None
        if d.HasField("limit"):
            check_override_unit(i, d.limit.unit)
            limit = (d.limit.requests_per_unit, d.limit.unit)
        out.append(Descriptor(pairs, hits, limit))
    return out


def check_reply_size(request: Any, dynamic_metadata: bool) -> None:
    """Refuse, before anything is counted, a request whose reply could be too large: the
    statuses and their names are bounded by the config, the echoed metadata by the request."""
    bound = len(request.descriptors) * (_STATUS_BYTES + 1024)
    if dynamic_metadata:
        bound += 2 * request.ByteSize()
    if bound > MAX_REPLY_BYTES:
        raise BadRequest(
            "descriptors", f"the reply to this request could exceed {MAX_REPLY_BYTES} bytes"
        )


def build_response(answer: Answer) -> Any:
    """Statuses in request order, the overall code, headers and dynamic metadata (built from
    plain dicts: one constructor call is cheaper than setting fields one by one)."""
    statuses = []
    for status in answer.statuses:
        out: dict[str, Any] = {
            "code": Response.OVER_LIMIT if status.over else Response.OK,
            "limit_remaining": status.remaining,
        }
        if status.limit is not None:
            requests, unit, name = status.limit
            out["current_limit"] = {
                "requests_per_unit": min(requests, 2**32 - 1), "unit": unit, "name": name
            }  # fmt: skip
            whole = int(status.reset)
            if status.reset == whole:
                out["duration_until_reset"] = {"seconds": whole}
            else:
                nanos = round((status.reset - whole) * 1e9) % 10**9
                out["duration_until_reset"] = {"seconds": whole, "nanos": nanos}
        statuses.append(out)
    response = Response(
        overall_code=Response.OVER_LIMIT if answer.over else Response.OK,
        statuses=statuses,
        response_headers_to_add=[{"key": k, "value": v} for k, v in answer.headers],
    )
    if answer.metadata is not None:
        response.dynamic_metadata.update(answer.metadata)
    return response


def handler(envoy: Envoy) -> grpc.GenericRpcHandler[Any, Any]:
    """The generic handler to add to a ``grpc.aio`` server."""
    servicer = RateLimitServicer(envoy)
    method = grpc.unary_unary_rpc_method_handler(
        servicer.should_rate_limit,
        request_deserializer=pb.RateLimitRequest.FromString,
        response_serializer=pb.RateLimitResponse.SerializeToString,
    )
    return grpc.method_handlers_generic_handler(SERVICE, {"ShouldRateLimit": method})
