"""The framework pages' examples run as written and print what their comments say.

Each ``python`` block of docs/fastapi.md, docs/flask.md and docs/django.md runs in a fresh
interpreter (Django is configured once per process), with Redis URLs pointed at a test server.
A block whose first line is ``# fragment`` is part of a project (a settings.py) and is only
compiled. A ``print(...)`` followed by ``# text`` — on its line or the next — must print
``text``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = ("fastapi.md", "flask.md", "django.md")
BLOCKS = [
    pytest.param(block, id=f"{page}:{i}")
    for page in PAGES
    for i, block in enumerate(re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), re.S))
]


def expected_output(block: str) -> list[str]:
    lines = block.splitlines()
    out = []
    for i, line in enumerate(lines):
        if not line.startswith("print("):
            continue
        comment = re.search(r"\)\s+# (.+)$", line)
        if comment:
            out.append(comment.group(1).strip())
        elif i + 1 < len(lines) and lines[i + 1].startswith("# "):
            out.append(lines[i + 1][2:].strip())
    return out


@pytest.mark.parametrize("block", BLOCKS)
def test_example_runs_as_written(block: str, redis_url: str) -> None:
    if block.startswith("# fragment"):
        compile(block, "fragment", "exec")
        return
    source = block.replace("redis://127.0.0.1:6379/0", redis_url)
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", source],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    printed = [line.strip() for line in done.stdout.splitlines()]
    assert printed == expected_output(block)
