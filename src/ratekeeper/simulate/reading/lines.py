"""Log files -> blocks of whole lines, in bounded memory and time linear in the input.

``open_log`` opens a file (``-``: standard input) and un-gzips it when its first bytes say so,
whatever its name. ``Blocks`` decodes it (UTF-8, bad bytes replaced; ``\\r\\n`` and ``\\r``
end lines too) and yields blocks of whole lines, each ending with a newline.

A line longer than ``max_line`` characters is not kept: its text is dropped as it streams
past (so a 100 MB line, or a gzip bomb of one, costs what reading it costs and holds at most
``max_line`` characters), and the block gets a one-line stand-in, ``OVERLONG`` followed by an
index into ``Blocks.overlong`` (its length and first characters). The stand-in matches no
format, so every parser counts it as one bad line where the line was, with its number; they
ask ``overlong_reason`` why.

Work is linear: a chunk is searched for newlines once, and the pieces of a line that spans
chunks are joined once, when it ends.
"""

from __future__ import annotations

import gzip
import io
import sys
from collections.abc import Iterator
from typing import IO

from ...errors import ConfigError

BLOCK_CHARS = 1 << 16
"""Characters read at a time (then cut after the last whole line): a block's rows then stay
in the processor's cache (measured: 1 MiB blocks parsed a fifth slower)."""
MAX_LINE = 1 << 16
"""Default longest line kept, in characters (64 KiB: real access log lines stay far below;
CloudFront refuses URLs over 8 KB and headers over 20 KB)."""
OVERLONG = "\x00overlong:"
"""How a dropped line's stand-in starts: a NUL and no space, so no format matches it."""
HEAD = 200
"""Characters of a dropped line kept to show."""
KEPT = 100
"""Dropped lines whose first characters are kept (the report shows the first few bad lines)."""


def open_log(path: str) -> IO[bytes]:
    """A binary stream of the log at ``path`` (``-``: stdin), un-gzipped if it is gzip."""
    return gunzipped(open_raw(path))


def open_raw(path: str) -> IO[bytes]:
    """The log at ``path`` (``-``: stdin) as it is stored."""
    if path == "-":
        return sys.stdin.buffer
    try:
        return open(path, "rb")  # closed by the caller
    except OSError as exc:
        raise ConfigError(f"cannot read log {path!r}: {exc.strerror or exc}") from None


def gunzipped(raw: IO[bytes]) -> IO[bytes]:
    """``raw`` un-gzipped when its first bytes say it is gzip, whatever its name."""
    buffered = isinstance(raw, io.BufferedReader | io.BufferedRandom)
    head = raw.peek(2)[:2] if buffered else b""  # type: ignore[attr-defined]  # both peek
    if head == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw)  # type: ignore[return-value]  # a binary stream
    return raw


class Blocks:
    """The blocks of whole lines of one stream (see the module docstring). ``chars`` counts
    what was read, as it is read (the progress bar's measure)."""

    def __init__(self, stream: IO[bytes], max_line: int = MAX_LINE) -> None:
        if max_line < 1:
            raise ConfigError(f"--max-line {max_line!r} is invalid; expected a length >= 1")
        self.text = io.TextIOWrapper(stream, encoding="utf-8", errors="replace")
        self.max_line = max_line
        self.chars = 0
        self.overlong: list[tuple[int, str]] = []
        """(length, first characters) of each line dropped for its length."""
        self._pushed: list[str] = []
        self._source = self._read()  # one generator: it holds the unfinished line

    def sample(self, count: int) -> list[str] | None:
        """The first ``count`` lines that are not blank (fewer if the stream has fewer),
        read ahead: iterating still yields every block from the first. None: the stream
        is empty."""
        out: list[str] = []
        for block in self._source:
            self._pushed.append(block)
            out.extend(line for line in block.split("\n") if line.strip() and line[0] != "\x00")
            if len(out) >= count:
                break
        return out[:count] if self._pushed else None

    def __iter__(self) -> Iterator[str]:
        while self._pushed:
            yield self._pushed.pop(0)
        yield from self._source

    def _read(self) -> Iterator[str]:
        read = self.text.read
        size = min(BLOCK_CHARS, self.max_line)  # so no line inside one chunk is overlong
        limit = self.max_line
        parts: list[str] = []  # the unfinished line, in pieces
        held = 0  # its length so far
        dropping = False  # it is overlong: its text is not kept
        while True:
            chunk = read(size)
            if not chunk:
                break
            self.chars += len(chunk)
            nl = chunk.find("\n")
            if nl < 0:  # the whole chunk continues the unfinished line
                held += len(chunk)
                if not dropping:
                    parts.append(chunk)
                    if held > limit:
                        dropping = True
                        parts = [self._head(parts)]
                elif len(parts[0]) < HEAD:  # keep its first characters to show
                    parts[0] += chunk[: HEAD - len(parts[0])]
                continue
            end = chunk.rfind("\n") + 1
            if held + nl > limit:
                first = self._stand_in(parts, chunk[:nl], held + nl)
                block = first + chunk[nl + 1 : end]
            elif parts:
                parts.append(chunk[:end])
                block = "".join(parts)
            else:
                block = chunk if end == len(chunk) else chunk[:end]
            parts, held, dropping = [], 0, False
            if end < len(chunk):
                parts.append(chunk[end:])
                held = len(chunk) - end
            yield block
        if held > limit:
            yield self._stand_in(parts, "", held)
        elif parts:
            yield "".join(parts) + "\n"

    @staticmethod
    def _head(parts: list[str]) -> str:
        head = ""
        for p in parts:
            head += p[: HEAD - len(head)]
            if len(head) >= HEAD:
                break
        return head

    def _stand_in(self, parts: list[str], tail: str, length: int) -> str:
        head = self._head([*parts, tail]) if len(self.overlong) < KEPT else ""
        self.overlong.append((length, head))
        return f"{OVERLONG}{len(self.overlong) - 1}\n"

    def overlong_reason(self, line: str) -> tuple[str, str] | None:
        """(shown text, why) for a stand-in; None for any other line."""
        if not line.startswith(OVERLONG):
            return None
        try:
            length, head = self.overlong[int(line[len(OVERLONG) :].strip())]
        except (ValueError, IndexError):
            return None
        return head, f"line of {length:,} characters is longer than --max-line {self.max_line:,}"
