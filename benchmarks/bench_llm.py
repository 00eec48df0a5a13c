"""What the LLM gateway costs a stream: ratekeeper.llm.Gateway against the same proxy without it.

Three uvicorn processes serve the same thing, a streamed chat completion of ``--tokens`` chunks
(OpenAI's real SSE format, the usage chunk last) from one local upstream process:

- ``bare``: the ceiling, a reverse proxy on the same ``ratekeeper.llm.upstream.Upstream``
  (httpx, streaming) passing each chunk on, with no limits, no estimate and no meter;
- ``gateway (memory)``: ``Gateway`` with per-key TPM and RPM, a team's and an org's TPM, on a
  ``MemoryStore``: identify, estimate, reserve, meter every chunk, settle;
- ``gateway (Redis)``: the same on a private ``redis-server`` (two ``EVALSHA`` a request).

``wrk`` (one thread, ``--connections`` connections, POSTing the same body) drives each in
interleaved rounds; the table gives streams/s (median round), the proxy process's CPU per
stream, and each gateway's streams/s as a share of the bare proxy's. Run under the bench lock::

    flock /tmp/rk-bench.lock .venv/bin/python -m benchmarks.bench_llm [--tokens 200] [--rounds 5]

Needs ``wrk`` (Debian: ``apt-get install wrk``), ``redis-server`` and the ``llm`` and
``server`` extras.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from benchmarks.bench_async import redis_server, wrk_seconds
from benchmarks.bench_service import cpu_seconds

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
BODY = {
    "model": "m",
    "max_tokens": 300,
    "stream": True,
    "messages": [{"role": "user", "content": "Tell me about rate limits."}],
}
LIMITS = "100000000/minute"


def _chunk(content: str | None, usage: Any = None) -> bytes:
    choices = (
        []
        if content is None
        else [{"index": 0, "delta": {"content": content}, "finish_reason": None}]
    )
    data = {
        "id": "chatcmpl-b",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": choices,
        "usage": usage,
    }
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def upstream_app(tokens: int) -> Any:
    """A streamed chat completion of ``tokens`` chunks, one send each, the usage last."""
    chunks = [_chunk(f" word{i}") for i in range(tokens)]
    chunks.append(
        _chunk(
            None, {"prompt_tokens": 12, "completion_tokens": tokens, "total_tokens": 12 + tokens}
        )
    )
    chunks.append(b"data: [DONE]\n\n")

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


def bare_app(url: str) -> Any:
    """The proxy without ratekeeper: the same upstream client, each chunk passed on."""
    from ratekeeper.llm.upstream import Upstream

    upstream = Upstream(url)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
        response = await upstream.send("POST", scope["path"], "", headers, body)
        await send(
            {
                "type": "http.response.start",
                "status": response.status,
                "headers": [(k.encode(), v.encode()) for k, v in response.headers],
            }
        )
        try:
            async for chunk in response.body():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            await response.aclose()
        await send({"type": "http.response.body", "body": b""})

    return app


def gateway_app(url: str, redis_url: str | None) -> Any:
    from ratekeeper import RedisStore
    from ratekeeper.llm import Caller, Gateway, Limit, callers

    limits = [
        Limit("org", LIMITS),
        Limit("team", LIMITS),
        Limit("key", LIMITS),
        Limit("key", LIMITS, counts="requests"),
    ]
    store = RedisStore(redis_url, socket_timeout=2.0) if redis_url else None  # a loaded machine
    return Gateway(url, limits, callers({"k1": Caller("k1", "acme", "red")}), store=store)


def serve() -> Any:
    """The uvicorn factory of one variant (``BENCH_LLM``: JSON of what to serve)."""
    spec = json.loads(os.environ["BENCH_LLM"])
    if spec["variant"] == "upstream":
        return upstream_app(spec["tokens"])
    if spec["variant"] == "bare":
        return bare_app(spec["upstream"])
    return gateway_app(spec["upstream"], spec.get("redis"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """One uvicorn process serving ``spec``."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.port = free_port()
        env = {**os.environ, "BENCH_LLM": json.dumps(spec)}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "benchmarks.bench_llm:serve",
                "--factory",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
                "--no-access-log",
            ],
            env=env,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"{spec['variant']} did not start") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


WRK_SCRIPT = """\
wrk.method = "POST"
wrk.body = '%s'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer k1"
"""


def wrk(port: int, seconds: int, connections: int, script: str) -> tuple[int, float, int]:
    """(responses, seconds, errors) of one wrk run."""
    import re

    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{seconds}s",
            "-s",
            script,
            f"http://127.0.0.1:{port}/v1/chat/completions",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 60,
    ).stdout
    n = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    elapsed = wrk_seconds(re.search(r"requests in ([\d.]+\w+),", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = (int(bad.group(1)) if bad else 0) + sum(
        int(x) for x in re.findall(r"(?:connect|read|write|timeout) (\d+)", out)
    )
    return n, elapsed, errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=200, help="chunks per stream")
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("bench_llm needs wrk (Debian: apt-get install wrk)")
    names = {
        "bare": "bare proxy (the ceiling)",
        "memory": "gateway (memory)",
        "redis": "gateway (Redis)",
    }
    with redis_server() as redis, tempfile.NamedTemporaryFile("w", suffix=".lua") as lua:
        lua.write(WRK_SCRIPT % json.dumps(BODY))
        lua.flush()
        up = Proc({"variant": "upstream", "tokens": args.tokens})
        url = f"http://127.0.0.1:{up.port}"
        procs = {
            "bare": Proc({"variant": "bare", "upstream": url}),
            "memory": Proc({"variant": "gateway", "upstream": url}),
            "redis": Proc({"variant": "gateway", "upstream": url, "redis": redis.url}),
        }
        samples: dict[str, list[tuple[float, float, int]]] = {v: [] for v in procs}
        try:
            for p in procs.values():  # warm up: connections, scripts
                wrk(p.port, 1, args.connections, lua.name)
            order = list(procs)
            for r in range(args.rounds):
                for variant in order[r % 3 :] + order[: r % 3]:
                    p = procs[variant]
                    cpu0 = cpu_seconds(p.proc.pid)
                    n, elapsed, errors = wrk(p.port, args.seconds, args.connections, lua.name)
                    cpu = (cpu_seconds(p.proc.pid) - cpu0) / max(n, 1) * 1e6
                    samples[variant].append((n / elapsed, cpu, errors))
        finally:
            for p in [*procs.values(), up]:
                p.stop()
    print(
        f"streams of {args.tokens} chunks, wrk -t1 -c{args.connections}, {args.rounds} "
        f"interleaved rounds of {args.seconds} s (median round)"
    )
    print(
        f"{'variant':28} {'streams/s':>10} {'chunks/s':>10} {'proxy CPU us/stream':>20} "
        f"{'errors':>6} {'of bare':>8}"
    )
    bare = sorted(samples["bare"])[len(samples["bare"]) // 2][0]
    for variant, rows in samples.items():
        rate, cpu, errors = sorted(rows)[len(rows) // 2]
        print(
            f"{names[variant]:28} {rate:10,.1f} {rate * args.tokens:10,.0f} {cpu:20,.0f} "
            f"{errors:6} {rate / bare:8.2f}"
        )


if __name__ == "__main__":
    main()
