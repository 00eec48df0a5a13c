"""A client of the quota service that follows the protocol as Envoy's filter does: one
bidirectional stream, a bucket's first report alone with ``time_elapsed`` 0, then reports of
every bucket; what the service sends is read by a thread and kept with its arrival time."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from envoy.service.rate_limit_quota.v3 import rlqs_pb2 as pb

PATH = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"
Bucket = Mapping[str, str]


def report(domain: str, usages: Sequence[tuple[Bucket, int, int, int]]) -> bytes:
    """A ``RateLimitQuotaUsageReports``: (bucket id, seconds elapsed, allowed, denied) each."""
    message = pb.RateLimitQuotaUsageReports(domain=domain)
    for bucket, elapsed, allowed, denied in usages:
        usage = message.bucket_quota_usages.add()
        for key, value in bucket.items():
            usage.bucket_id.bucket[key] = value
        usage.time_elapsed.seconds = elapsed
        usage.num_requests_allowed = allowed
        usage.num_requests_denied = denied
    return bytes(message.SerializeToString())


class QuotaClient:
    """One stream to the service at ``port``."""

    def __init__(self, port: int, metadata: Sequence[tuple[str, str]] = ()) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self._out: queue.Queue[bytes | None] = queue.Queue()
        self.responses: queue.Queue[tuple[float, Any]] = queue.Queue()
        self.error: grpc.RpcError | None = None
        method = self.channel.stream_stream(
            PATH,
            request_serializer=None,
            response_deserializer=pb.RateLimitQuotaResponse.FromString,
        )
        self.call = method(iter(self._out.get, None), metadata=tuple(metadata))
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for response in self.call:
                self.responses.put((time.monotonic(), response))
        except grpc.RpcError as exc:
            self.error = exc
        finally:
            self.done.set()

    def send(self, domain: str, *usages: tuple[Bucket, int, int, int]) -> None:
        self._out.put(report(domain, usages))

    def send_raw(self, raw: bytes) -> None:
        self._out.put(raw)

    def next(self, timeout: float = 10.0) -> Any:
        """The next response (``queue.Empty`` if none comes in ``timeout`` seconds)."""
        return self.responses.get(timeout=timeout)[1]

    def next_at(self, timeout: float = 10.0) -> tuple[float, Any]:
        """The next response and its ``time.monotonic()`` of arrival."""
        return self.responses.get(timeout=timeout)

    def quiet(self, seconds: float) -> bool:
        """Whether nothing arrives for ``seconds``."""
        try:
            self.responses.get(timeout=seconds)
        except queue.Empty:
            return True
        return False

    def close(self) -> None:
        self._out.put(None)
        self.done.wait(5)
        self.channel.close()


def rate(action: Any) -> float:
    """A bucket action's token bucket as requests per second."""
    strategy = action.quota_assignment_action.rate_limit_strategy
    assert strategy.WhichOneof("strategy") == "token_bucket", action
    bucket = strategy.token_bucket
    return float(bucket.tokens_per_fill.value / bucket.fill_interval.seconds)


def kind(action: Any) -> str:
    """``abandon``, ``token_bucket``, ``ALLOW_ALL`` or ``DENY_ALL``."""
    if action.HasField("abandon_action"):
        return "abandon"
    strategy = action.quota_assignment_action.rate_limit_strategy
    which = strategy.WhichOneof("strategy")
    if which == "blanket_rule":
        enum = strategy.DESCRIPTOR.fields_by_name["blanket_rule"].enum_type
        return str(enum.values_by_number[strategy.blanket_rule].name)
    return str(which)
