"""Side-by-side runs of a one-file Django sample, each in an interpreter of its own (Django is
configured once per process): the peer's and the port's, on memory or on a Redis."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import redis

from tests.compat import ports
from tests.compat.side import ROOT, Answer, side_by_side

Request = tuple[str, str, dict[str, str] | None]


def run_sample(source: str, requests: list[Request], transport: str, edges: list[Any]) -> Any:
    spec = {"source": source, "requests": requests, "transport": transport, "edges": edges}
    done = subprocess.run(
        [sys.executable, "-m", "tests.compat.django_driver"],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(
    source: str,
    peer_name: str,
    requests: list[Request],
    transport: str,
    url: str | None,
    edges: list[Any] = (),  # type: ignore[assignment]
    bodies: tuple[int, ...] = (403, 429),
) -> tuple[list[Answer], list[Answer]]:
    """The peer's answers and the port's (bodies kept for statuses in ``bodies``)."""

    def run(peer: bool) -> tuple[list[Answer], float]:
        text = ports.peer_source(source) if peer else source
        if url is not None:
            redis.Redis.from_url(url).flushall()
            text = ports.on_redis(text, peer_name, url)
        got = run_sample(text, requests, transport, list(edges))
        answers = [Answer(s, b if s in bodies else None) for s, b in got["answers"]]
        return answers, got["seconds"]

    return side_by_side(run, budget=20.0)  # the samples' windows: a minute or more
