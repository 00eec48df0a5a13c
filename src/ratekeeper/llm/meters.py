"""Meters: what a provider's response says it used, read as its bytes pass (sans-I/O).

A meter is fed the response body's chunks as the gateway forwards them, and closed at its
end; it keeps no copy of a stream, only what it has read so far:

- ``usage``: the provider's own final figures (``TokenUsage``), when reported and valid;
- ``best``: the largest valid usage seen, should there be several (``usage_repeated``);
- ``output``: output tokens counted from the text streamed so far (each delta through the
  gateway's token counter, at least 1), and ``input``: the prompt's tokens if the stream has
  said (Anthropic's ``message_start``): what a client that left early is charged when the
  gateway does not read on to the usage;
- ``problems``: each kind of trouble seen, with its first message (the gateway logs and
  counts them, and keeps its estimate).

``StreamMeter`` reads server-sent events of each API — where the usage comes from, and the
text counted:

- ``chat``: the chunk whose ``usage`` is not null (``stream_options.include_usage``);
  ``choices[].delta``'s ``content``, ``refusal``, ``reasoning_content``, ``reasoning`` and
  ``tool_calls[].function``;
- ``completions``: the same; ``choices[].text``;
- ``responses``: ``response.completed`` / ``incomplete`` / ``failed``'s ``response.usage``;
  every ``*.delta`` event's ``delta``;
- ``messages``: ``message_start``'s ``message.usage``, then each ``message_delta``'s
  ``usage`` (cumulative: the latest holds); ``content_block_delta``'s ``text``,
  ``partial_json`` and ``thinking``.

``BodyMeter`` reads a JSON body (kept up to ``max_bytes``; past that its usage is not read:
``body_too_large``). Problems: ``malformed_event``, ``event_too_large``, ``usage_invalid``,
``usage_repeated``, ``usage_missing``, ``error_event``, ``body_too_large``,
``body_malformed``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .sse import MAX_EVENT_BYTES, Event, SSEParser
from .usage import TokenUsage, UsageError, anthropic_usage, openai_usage, responses_usage

TokenCounter = Callable[[str], int]
"""Tokens in a text: the gateway's counter (``estimate.heuristic_tokens`` or a tokenizer)."""

APIS = ("chat", "completions", "responses", "embeddings", "messages")
"""The APIs a gateway meters: OpenAI's chat completions, completions, responses and
embeddings, Anthropic's messages."""

MAX_BODY_BYTES = 8 << 20
"""8 MiB of a JSON response kept to read its usage."""
BATCH = 16 << 10
"""A stream meter reads its chunks 16 KiB at a time."""

_FINAL = ("response.completed", "response.incomplete", "response.failed")


class Meter:
    """What a response said it used so far (module docstring); fed by the subclasses."""

    def __init__(self, api: str, counter: TokenCounter) -> None:
        if api not in APIS:
            raise ValueError(f"api {api!r} is unknown; expected one of {', '.join(APIS)}")
        self.api = api
        self.counter = counter
        self.usage: TokenUsage | None = None
        self.best: TokenUsage | None = None
        self.input: int | None = None
        self.output = 0
        self.problems: dict[str, str] = {}
        self.closed = False

    def feed(self, chunk: bytes) -> None:
        """Read the next chunk of the body."""
        raise NotImplementedError

    def close(self) -> None:
        """The body has ended."""
        raise NotImplementedError

    def flush(self) -> None:
        """Read what has been fed so far (a stream meter reads in batches)."""

    def problem(self, kind: str, message: str) -> None:
        """Note trouble of ``kind`` (its first message is kept)."""
        self.problems.setdefault(kind, message)

    def found(self, usage: TokenUsage, final: bool = True) -> None:
        """A valid usage: the final one (``final``), or one to count from."""
        if self.best is None or usage.total_tokens > self.best.total_tokens:
            self.best = usage
        if final:
            self.usage = usage

    def _read(self, read: Callable[[object], TokenUsage], usage: object) -> TokenUsage | None:
        try:
            return read(usage)
        except UsageError as exc:
            self.problem("usage_invalid", str(exc))
            return None

    def _text(self, text: object) -> None:
        if isinstance(text, str) and text:
            self.output += max(1, self.counter(text))


class StreamMeter(Meter):
    """A server-sent event stream of ``api`` (module docstring).

    The stream is cut into runs of whole events (up to the last blank line so far; the rest
    waits, at most ``max_event_bytes``). A run is parsed event by event when it may say
    something about the charge — it names ``"usage"`` (other than ``"usage":null``) or
    ``"error"``, or a data line does not open a JSON object, or its braces do not balance,
    or it names an event type the API's usage or errors come in (``message_delta``,
    ``response.completed``...) — and, with ``text``, always (each delta's text through the
    counter). Otherwise its content events are counted, one token each, without parsing:
    less than a microsecond a chunk (benchmarks/bench_llm.py)."""

    def __init__(
        self,
        api: str,
        counter: TokenCounter,
        max_event_bytes: int = MAX_EVENT_BYTES,
        text: bool = True,
    ) -> None:
        super().__init__(api, counter)
        self.max_event_bytes = max_event_bytes
        self.text = text
        self.dropped = 0
        self._pending = bytearray()
        self._parts: list[bytes] = []
        self._size = 0
        self._skipping = False  # an over-long event: dropped up to its blank line
        self._on: Callable[[Event], None] = {
            "chat": self._openai,
            "completions": self._openai,
            "embeddings": self._openai,
            "responses": self._responses,
            "messages": self._anthropic,
        }[api]
        self._delta = {"responses": b'.delta"', "messages": b'"content_block_delta"'}.get(api)
        self._marks: tuple[bytes, ...] = {
            "responses": (b"error", b"response.completed", b"response.incomplete",
                          b"response.failed"),
            "messages": (b"error", b"message_start", b"message_delta"),
        }.get(api, (b'"error"',))  # fmt: skip
        self._final_seen = False
        self._started = False
        self._base: TokenUsage | None = None

    def feed(self, chunk: bytes) -> None:
        """Take ``chunk``; it is read with the next ones once ``BATCH`` bytes have come (or at
        ``flush``/``close``): one pass over many chunks costs less than one each."""
        self._parts.append(chunk)
        self._size += len(chunk)
        if self._size >= BATCH:
            self.flush()

    def flush(self) -> None:
        """Read what has been taken so far."""
        parts = self._parts
        if parts:
            data = parts[0] if len(parts) == 1 else b"".join(parts)
            parts.clear()
            self._size = 0
            self._feed(data)

    def _feed(self, chunk: bytes) -> None:
        """Read ``chunk``: each run of whole events it completes."""
        pending = self._pending
        if not pending and not self._skipping and chunk[-2:] == b"\n\n":
            self._run(chunk)  # the common case: whole events, one chunk
            return
        lo = max(0, len(pending) - 1)  # a blank line may straddle the seam
        pending += chunk
        end = max(pending.rfind(b"\n\n", lo), pending.rfind(b"\r\r", lo),
                  pending.rfind(b"\n\r", lo))  # fmt: skip
        if end < 0:
            if len(pending) > self.max_event_bytes:
                self._drop()
            return
        run = bytes(pending[: end + 2])
        del pending[: end + 2]
        if self._skipping:  # the rest of a dropped event, up to its blank line
            self._skipping = False
            first = min((i for i in (run.find(b"\n\n"), run.find(b"\r\r"), run.find(b"\n\r"))
                         if i >= 0), default=len(run))  # fmt: skip
            run = run[first + 2 :]
        if len(pending) > self.max_event_bytes:
            self._drop()
        if run:
            self._run(run)

    def _drop(self) -> None:
        if not self._skipping:
            self.dropped += 1
        self._pending.clear()
        self._skipping = True

    def _run(self, run: bytes) -> None:
        """A run of whole events: parsed, or counted (class docstring)."""
        if not self.text:
            datas = run.count(b"data:")
            usages = run.count(b'"usage"')
            plain = (
                (not usages or usages == run.count(b'"usage":null') + run.count(b'"usage": null'))
                and not any([mark in run for mark in self._marks])
                and datas == run.count(b"data: {") + run.count(b"data:{") + run.count(b"[DONE]")
                and run.count(b"{") == run.count(b"}")
            )
            if plain:
                delta = self._delta
                self.output += run.count(delta) if delta is not None else datas
                return
        parser = SSEParser(self.max_event_bytes)
        for event in parser.feed(run):
            self._on(event)
        for event in parser.close():
            self._on(event)
        self.dropped += parser.dropped

    def _count(self, text: object) -> None:
        if self.text:
            self._text(text)
        elif isinstance(text, str) and text:
            self.output += 1

    def close(self) -> None:
        """The stream has ended: read an event left open, note what is missing."""
        if self.closed:
            return
        self.flush()
        self.closed = True
        if self._pending and not self._skipping:
            self._run(bytes(self._pending) + b"\n\n")  # an event left without its blank line
        self._pending.clear()
        if self.dropped:
            self.problem("event_too_large", f"{self.dropped} event(s) over "
                                            f"{self.max_event_bytes:_} bytes dropped")  # fmt: skip
        if self.usage is None:
            self.problem("usage_missing", "the stream ended without a usage event")

    def _json(self, event: Event) -> dict[str, Any] | None:
        try:
            obj = json.loads(event.data)
        except ValueError:
            self.problem("malformed_event", f"event data is not JSON: {event.data[:40]!r}")
            return None
        if not isinstance(obj, dict):
            self.problem("malformed_event", f"event data is not an object: {event.data[:40]!r}")
            return None
        return obj

    def _final(self, read: Callable[[object], TokenUsage], usage: object) -> None:
        if self._final_seen:
            self.problem("usage_repeated", "a second usage event")
            found = self._read(read, usage)
            if found is not None:
                self.found(found, final=False)
            self.usage = None  # which one is true? the gateway keeps the most of them
            return
        self._final_seen = True
        found = self._read(read, usage)
        if found is not None:
            self.found(found)

    def _openai(self, event: Event) -> None:
        if event.data == b"[DONE]":
            return
        obj = self._json(event)
        if obj is None:
            return
        if "error" in obj:
            self.problem("error_event", f"the upstream sent an error: {str(obj['error'])[:80]}")
        usage = obj.get("usage")
        if usage is not None:
            self._final(openai_usage, usage)
        choices = obj.get("choices")
        if not isinstance(choices, list):
            return
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            self._count(choice.get("text"))
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                continue
            for name in ("content", "refusal", "reasoning_content", "reasoning"):
                self._count(delta.get(name))
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                for call in calls:
                    function = call.get("function") if isinstance(call, dict) else None
                    if isinstance(function, dict):
                        self._count(function.get("name"))
                        self._count(function.get("arguments"))

    def _responses(self, event: Event) -> None:
        obj = self._json(event)
        if obj is None:
            return
        kind = obj.get("type", event.type)
        if not isinstance(kind, str):
            return
        if kind.endswith(".delta"):
            self._count(obj.get("delta"))
        elif kind in _FINAL:
            response = obj.get("response")
            usage = response.get("usage") if isinstance(response, dict) else None
            self._final(responses_usage, usage)
        elif kind == "error":
            self.problem("error_event", f"the upstream sent an error: {str(obj)[:80]}")

    def _anthropic(self, event: Event) -> None:
        obj = self._json(event)
        if obj is None:
            return
        kind = obj.get("type", event.type)
        if kind == "content_block_delta":
            delta = obj.get("delta")
            if isinstance(delta, dict):
                for name in ("text", "partial_json", "thinking"):
                    self._count(delta.get(name))
        elif kind == "message_start":
            message = obj.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            if self._started:
                self.problem("usage_repeated", "a second message_start")
                self.usage = None
                self._final_seen = True
            self._started = True
            found = self._read(anthropic_usage, usage)
            if found is not None:
                self.input = found.total_tokens - found.output_tokens
                self.found(found, final=False)
                self._base = found
        elif kind == "message_delta":
            usage = obj.get("usage")
            if usage is None:
                return
            base = self._base
            found = self._read(lambda u: anthropic_usage(u, base), usage)
            if found is None:
                return
            if "usage_repeated" in self.problems or "usage_invalid" in self.problems:
                self.found(found, final=False)
                return
            self.found(found)  # cumulative: the latest holds
        elif kind == "error":
            self.problem("error_event", f"the upstream sent an error: {str(obj)[:80]}")


class BodyMeter(Meter):
    """A JSON body of ``api``: kept up to ``max_bytes``, its usage read at the end."""

    def __init__(self, api: str, counter: TokenCounter, max_bytes: int = MAX_BODY_BYTES) -> None:
        super().__init__(api, counter)
        self.max_bytes = max_bytes
        self._body: bytearray | None = bytearray()
        self.size = 0

    def feed(self, chunk: bytes) -> None:
        """Keep ``chunk`` (while the body is within the bound)."""
        self.size += len(chunk)
        if self._body is None:
            return
        if self.size > self.max_bytes:
            self._body = None
            self.problem("body_too_large", f"the body is over {self.max_bytes:_} bytes")
            return
        self._body += chunk

    def close(self) -> None:
        """Read the usage of the whole body."""
        if self.closed:
            return
        self.closed = True
        body, self._body = self._body, None
        if body is None:
            return
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError):
            self.problem("body_malformed", f"the body is not JSON: {bytes(body[:40])!r}")
            return
        if not isinstance(obj, dict):
            self.problem("body_malformed", f"the body is not an object: {bytes(body[:40])!r}")
            return
        read = {"responses": responses_usage, "messages": anthropic_usage}.get(
            self.api, openai_usage
        )
        if "usage" not in obj:
            self.problem("usage_missing", "the body has no usage")
            return
        found = self._read(read, obj["usage"])
        if found is not None:
            self.found(found)
