"""A local LLM upstream that answers in the providers' real formats (JSON and SSE).

OpenAI chat completions, completions, responses and embeddings, and Anthropic messages, each
as JSON or streamed, with the usage it "bills" recorded per request (``log``; ``GET /_log``
serves it to tests in other processes). Request headers steer it:

- ``x-fake-output``: output tokens to write (default 20, never above the request's most);
- ``x-fake-prompt``: the prompt tokens it reports (default a quarter of the prompt's bytes);
- ``x-fake-delay``: seconds between chunks (default 0);
- ``x-fake-mode``: hostile behaviour — ``malformed``, ``no_usage``, ``negative``, ``huge``,
  ``float``, ``twice``, ``never_ends``, ``big_body`` (100 MB), ``crlf``, ``bytewise``, ``500``,
  ``broken`` (the connection dropped mid-stream), ``string_usage``.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]


def _most(api: str, body: dict[str, Any]) -> int | None:
    for name in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        if isinstance(body.get(name), int):
            return int(body[name])
    return None


class FakeUpstream:
    """The ASGI app (module docstring)."""

    def __init__(self) -> None:
        self.log: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []

    def record(self, entry: dict[str, Any]) -> None:
        with self.lock:
            self.log.append(entry)

    async def __call__(
        self,
        scope: Scope,
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        if scope["type"] == "lifespan":
            while True:
                m = await receive()
                if m["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == "/_log":
            with self.lock:
                body = json.dumps({"log": self.log, "requests": self.requests}).encode()
            await _json(send, 200, body)
            return
        raw = b""
        more = True
        while more:
            m = await receive()
            raw += m.get("body", b"")
            more = m.get("more_body", False)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        body = json.loads(raw)
        with self.lock:
            self.requests.append({"path": path, "body": body, "headers": headers})
        api = {
            "/v1/chat/completions": "chat",
            "/v1/completions": "completions",
            "/v1/responses": "responses",
            "/v1/embeddings": "embeddings",
            "/v1/messages": "messages",
        }.get(path)
        if api is None:
            await _json(send, 404, b'{"error": {"message": "no such route"}}')
            return
        mode = headers.get("x-fake-mode", "")
        if mode == "500":
            await _json(
                send, 500, b'{"error": {"message": "upstream down", "type": "server_error"}}'
            )
            return
        most = _most(api, body)
        output = int(headers.get("x-fake-output", "20"))
        if most is not None:
            output = min(output, most)
        if api == "embeddings":
            output = 0
        prompt_default = max(
            1, len(json.dumps(body.get("messages", body.get("input", body.get("prompt", ""))))) // 4
        )
        prompt = int(headers.get("x-fake-prompt", str(prompt_default)))
        delay = float(headers.get("x-fake-delay", "0"))
        tag = headers.get("x-fake-tag", "")
        entry = {
            "api": api,
            "prompt": prompt,
            "output": output,
            "total": prompt + output,
            "mode": mode,
            "tag": tag,
            "key": headers.get("x-fake-key", ""),
            "stream": bool(body.get("stream")),
        }
        if body.get("stream"):
            await self._stream(send, api, prompt, output, delay, mode, body, entry)
        else:
            if mode == "big_body":
                await self._big(send)
                entry["total"] = None
                self.record(entry)
                return
            self.record(entry)
            await _json(send, 200, json.dumps(_whole(api, prompt, output, mode)).encode())

    async def _big(self, send: Callable[[Message], Awaitable[None]]) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        piece = b" " * (1 << 20)
        await send({"type": "http.response.body", "body": b'{"padding": "', "more_body": True})
        for _ in range(100):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        tail = b'", "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}}'
        await send({"type": "http.response.body", "body": tail})

    async def _stream(
        self,
        send: Callable[[Message], Awaitable[None]],
        api: str,
        prompt: int,
        output: int,
        delay: float,
        mode: str,
        body: dict[str, Any],
        entry: dict[str, Any],
    ) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream; charset=utf-8")],
            }
        )
        events = list(_events(api, prompt, output, mode, body))
        if mode == "never_ends":
            entry["total"] = None
            self.record(entry)
            try:
                for i in range(10**9):
                    await send(
                        {
                            "type": "http.response.body",
                            "more_body": True,
                            "body": _chat_chunk(f"w{i} "),
                        }
                    )
                    await asyncio.sleep(max(delay, 0.01))
            except Exception:
                return
        if mode in ("no_usage", "malformed", "negative", "huge", "float", "string_usage"):
            entry["total"] = None  # the gateway cannot know: its estimate stands
        if mode == "twice":
            entry["total"] = None
        self.record(entry)
        sep = b"\r\n" if mode == "crlf" else b"\n"
        for n, event in enumerate(events):
            data = event.replace(b"\n", sep)
            if mode == "broken" and n == len(events) // 2:
                raise RuntimeError("the upstream broke")  # uvicorn drops the connection
            if mode == "bytewise":
                for i in range(len(data)):
                    await send(
                        {"type": "http.response.body", "body": data[i : i + 1], "more_body": True}
                    )
            else:
                await send({"type": "http.response.body", "body": data, "more_body": True})
            if delay:
                await asyncio.sleep(delay)
        await send({"type": "http.response.body", "body": b""})


def _chat_chunk(text: str, usage: Any = None, finish: str | None = None) -> bytes:
    chunk = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": []
        if text is None
        else [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],
        "usage": usage,
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def _usage_value(mode: str, prompt: int, output: int) -> dict[str, Any]:
    if mode == "negative":
        return {"prompt_tokens": -5, "completion_tokens": output, "total_tokens": -5 + output}
    if mode == "huge":
        return {"prompt_tokens": 10**30, "completion_tokens": output, "total_tokens": 10**30}
    if mode == "float":
        return {"prompt_tokens": prompt + 0.5, "completion_tokens": output, "total_tokens": 1.5}
    if mode == "string_usage":
        return {"prompt_tokens": "12", "completion_tokens": output, "total_tokens": "99"}
    return {
        "prompt_tokens": prompt,
        "completion_tokens": output,
        "total_tokens": prompt + output,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


def _events(api: str, prompt: int, output: int, mode: str, body: dict[str, Any]) -> Any:
    include = (body.get("stream_options") or {}).get("include_usage")
    if api in ("chat", "completions"):
        yield _chat_chunk("")
        for i in range(output):
            if mode == "malformed" and i == 2:
                yield b"data: {not json\n\n"
                yield b"garbage line without colon\n\n"
            yield _chat_chunk(f"t{i} ")
        yield _chat_chunk("", finish="stop")
        if include and mode != "no_usage":
            usage = _usage_value(mode, prompt, output)
            yield _chat_chunk(None, usage)  # type: ignore[arg-type]
            if mode == "twice":
                yield _chat_chunk(None, usage)  # type: ignore[arg-type]
        yield b"data: [DONE]\n\n"
    elif api == "responses":
        yield _sse("response.created", {"type": "response.created", "response": {"id": "r"}})
        for i in range(output):
            yield _sse(
                "response.output_text.delta",
                {"type": "response.output_text.delta", "delta": f"t{i} "},
            )
        usage = {
            "input_tokens": prompt,
            "output_tokens": output,
            "total_tokens": prompt + output,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        }
        if mode != "no_usage":
            yield _sse(
                "response.completed",
                {"type": "response.completed", "response": {"id": "r", "usage": usage}},
            )
    elif api == "messages":
        start = {
            "type": "message_start",
            "message": {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": "m",
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": prompt,
                    "output_tokens": 1,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 0,
                },
            },
        }
        yield _sse("message_start", start)
        yield _sse(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        )
        yield _sse("ping", {"type": "ping"})
        for i in range(output):
            yield _sse(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": f"t{i} "},
                },
            )
        yield _sse("content_block_stop", {"type": "content_block_stop", "index": 0})
        if mode != "no_usage":
            yield _sse(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": output},
                },
            )
        yield _sse("message_stop", {"type": "message_stop"})


def _sse(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: ".encode() + json.dumps(data).encode() + b"\n\n"


def _whole(api: str, prompt: int, output: int, mode: str) -> dict[str, Any]:
    text = " ".join(f"t{i}" for i in range(output))
    if api == "chat":
        out: dict[str, Any] = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": text},
                }
            ],
        }
        if mode != "no_usage":
            out["usage"] = _usage_value(mode, prompt, output)
        return out
    if api == "completions":
        return {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "text": text, "finish_reason": "stop"}],
            "usage": _usage_value(mode, prompt, output),
        }
    if api == "embeddings":
        return {
            "object": "list",
            "model": "m",
            "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}],
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
        }
    if api == "responses":
        return {
            "id": "r",
            "object": "response",
            "status": "completed",
            "model": "m",
            "output": [
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text}],
                }
            ],
            "usage": {
                "input_tokens": prompt,
                "output_tokens": output,
                "total_tokens": prompt + output,
            },
        }
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": prompt,
            "output_tokens": output,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


async def _json(send: Callable[[Message], Awaitable[None]], status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


app = FakeUpstream()
"""For ``uvicorn tests.llm.fake_upstream:app`` in another process."""
