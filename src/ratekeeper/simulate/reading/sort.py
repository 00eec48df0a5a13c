"""An external merge sort: any number of log items in order, in bounded memory.

``order`` puts a log further out of time order than its reorder buffer in order by sorting
all of it here. Items are gathered in memory up to ``limit`` lines, sorted (``list.sort``,
stable) and, when more follow, written to a temporary file as one sorted *run*; ``FAN_IN``
runs of one level are merged into one run of the next, so however long the input the runs
open at once stay few and each item is written about ``log_FAN_IN(runs)`` times. At the end
the runs, oldest first, and the last chunk, never written, are merged (``heapq.merge``): the
sort is stable. An input within ``limit`` lines is sorted in memory and nothing is written.

A run is a file of batches, each a length-prefixed ``marshal`` of a list of items (floats,
strings, lists, dicts: what ``Run`` and an entry's fields are) holding about
``BATCH_LINES`` lines; a merge holds one batch per run. Memory: at most ``limit`` lines
gathered, plus a batch per run merged (at most ``FAN_IN`` per level). Disk: the input's
items, once or a few times over; a write that fails (no room) raises ``LogOrderError``.
"""

from __future__ import annotations

import heapq
import marshal
import struct
import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any, Generic, TypeVar

from ...errors import LogOrderError

T = TypeVar("T")

FAN_IN = 64
"""Runs of one level merged at once."""
BATCH_LINES = 1024
"""Lines per batch of a run file (what a merge holds per run)."""
_LENGTH = struct.Struct("<Q")


class ExternalSort(Generic[T]):
    """Items sorted by ``key`` (see the module docstring); ``lines`` tells how many log
    lines an item holds (default: one)."""

    def __init__(
        self, key: Callable[[T], Any], limit: int, lines: Callable[[T], int] | None = None
    ) -> None:
        self.key = key
        self.limit = limit
        self.lines = lines
        self.chunk: list[T] = []
        self.held = 0
        """Lines in ``chunk``."""
        self.levels: list[list[IO[bytes]]] = []
        self.written = 0
        """Bytes written to temporary files (0: sorted in memory)."""

    def extend(self, items: Iterable[T], lines: int) -> None:
        """Add ``items``, holding ``lines`` lines in all."""
        self.chunk.extend(items)
        self.held += lines
        if self.held >= self.limit:
            self.chunk.sort(key=self.key)
            run = self._write(self.chunk)
            self.chunk, self.held = [], 0
            self._add(0, run)

    def items(self) -> Iterator[T]:
        """Every item added, in order (once: the last chunk is given up as it goes)."""
        self.chunk.sort(key=self.key)
        runs = [run for level in reversed(self.levels) for run in level]  # oldest first
        if not runs:
            return iter(self.chunk)
        return heapq.merge(*map(self._read, runs), iter(self.chunk), key=self.key)

    def close(self) -> None:
        for level in self.levels:
            for run in level:
                run.close()
        self.levels = []
        self.chunk = []

    def __enter__(self) -> ExternalSort[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _add(self, level: int, run: IO[bytes]) -> None:
        if level == len(self.levels):
            self.levels.append([])
        runs = self.levels[level]
        runs.append(run)
        if len(runs) >= FAN_IN:
            merged = self._write(heapq.merge(*map(self._read, runs), key=self.key))
            for r in runs:
                r.close()
            self.levels[level] = []
            self._add(level + 1, merged)

    def _write(self, items: Iterable[T]) -> IO[bytes]:
        """A run of ``items`` (already in order)."""
        try:
            out = tempfile.TemporaryFile()  # noqa: SIM115  # closed by close()
        except OSError as exc:
            raise _no_room(exc) from None
        try:
            count = self.lines
            pending: list[T] = []
            held = 0
            for item in items:
                pending.append(item)
                held += 1 if count is None else count(item)
                if held >= BATCH_LINES:
                    self._dump(out, pending)
                    pending, held = [], 0
            if pending:
                self._dump(out, pending)
        except OSError as exc:
            out.close()
            raise _no_room(exc) from None
        except BaseException:
            out.close()
            raise
        return out

    def _dump(self, out: IO[bytes], batch: list[T]) -> None:
        data = marshal.dumps(batch)
        out.write(_LENGTH.pack(len(data)))
        out.write(data)
        self.written += _LENGTH.size + len(data)

    @staticmethod
    def _read(run: IO[bytes]) -> Iterator[T]:
        run.flush()
        run.seek(0)
        read = run.read
        while True:
            head = read(_LENGTH.size)
            if not head:
                return
            (size,) = _LENGTH.unpack(head)
            batch: list[T] = marshal.loads(read(size))
            yield from batch


def _no_room(exc: OSError) -> LogOrderError:
    return LogOrderError(
        f"the temporary files of the sort cannot be written in {tempfile.gettempdir()} "
        f"({exc.strerror or exc})"
    )
