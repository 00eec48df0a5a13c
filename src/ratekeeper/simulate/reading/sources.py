"""Log inputs that can be read again from their start: what sorting a log needs.

A log further out of time order than ``--skew`` is read twice (``replay``): streaming
first, until a line comes too late, then again, whole, to be sorted. A regular file is read
again through a descriptor kept from the first opening, so a rotation that renames it in
between changes nothing; one that shrank in between (truncated in place) is refused.
Standard input, a pipe or a process substitution (``<(zcat ...)``) cannot be read twice, so
with ``copy`` what is read from it is also written to a temporary file as it goes (its bytes
as read: a gzip stream stays compressed); reading it again drains the rest of the stream
into the copy, then reads the copy. A copy that cannot be written (no room) is dropped and
the first reading goes on: only reading it again fails (``LogOrderError``). Without
``copy`` nothing is written and reading a pipe again is refused.
"""

from __future__ import annotations

import io
import os
import stat
import tempfile
from typing import IO

from ...errors import LogOrderError
from .lines import gunzipped, open_raw

READ = 1 << 16
"""Bytes read from a copied stream at a time."""


class Source:
    """One log input (``-``: standard input) that ``again`` reads from its start."""

    def __init__(self, path: str, copy: bool) -> None:
        self.path = path
        self.copy = copy
        self._kept: int | None = None
        """A regular file's descriptor, kept for the second reading."""
        self._size = 0
        self._tee: _Tee | None = None
        self._raw: list[IO[bytes]] = []

    @property
    def name(self) -> str:
        """The path, or ``standard input``."""
        return "standard input" if self.path == "-" else self.path

    def open(self) -> IO[bytes]:
        """The log, un-gzipped (see the module docstring); the caller closes it."""
        raw = open_raw(self.path)
        self._raw.append(raw)
        if _regular(self.path, raw):  # kept open: renamed by a rotation, it is still read
            self._kept = os.dup(raw.fileno())
            self._size = os.fstat(self._kept).st_size
        elif self.copy:
            self._tee = _Tee(raw)
            raw = io.BufferedReader(self._tee, READ)
        return gunzipped(raw)

    def again(self) -> IO[bytes]:
        """The log from its start once more (``open`` first)."""
        if self._kept is not None:
            size = os.fstat(self._kept).st_size
            if size < self._size:
                raise LogOrderError(
                    f"{self.name} cannot be read again to be sorted: it shrank between the "
                    f"two readings ({self._size:,} bytes, then {size:,}: truncated by a "
                    "rotation?)"
                )
            raw = os.fdopen(os.dup(self._kept), "rb")
            self._raw.append(raw)
            raw.seek(0)
            return gunzipped(raw)
        tee = self._tee
        if tee is None:
            raise LogOrderError(
                f"{self.name} cannot be read again to be sorted: it is not a file and was "
                "not copied (--late refuse)"
            )
        copy = tee.drained()
        if copy is None:
            raise LogOrderError(
                f"{self.name} cannot be read again to be sorted: its copy in "
                f"{tempfile.gettempdir()} could not be written ({tee.failed})"
            )
        return gunzipped(copy)

    def close(self) -> None:
        """Drop the copy and close the files opened (a gzip stream leaves its file open);
        standard input stays open."""
        if self._tee is not None:
            self._tee.drop()
        if self._kept is not None:
            os.close(self._kept)
            self._kept = None
        for raw in self._raw:
            if self.path != "-":
                raw.close()
        self._raw = []


def _regular(path: str, raw: IO[bytes]) -> bool:
    """``path`` names a regular file, which can be opened again."""
    if path == "-":
        return False
    try:
        return stat.S_ISREG(os.fstat(raw.fileno()).st_mode)
    except (OSError, ValueError):
        return False


class _Tee(io.RawIOBase):
    """A stream that writes what it reads from ``source`` to a temporary file (closing it
    leaves both alone)."""

    def __init__(self, source: IO[bytes]) -> None:
        super().__init__()
        self.source = source
        self.failed: str | None = None
        self.copy: IO[bytes] | None
        try:
            self.copy = tempfile.TemporaryFile()  # noqa: SIM115  # closed by drop()
        except OSError as exc:
            self.copy = None
            self.failed = exc.strerror or str(exc)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]  # bytes-like
        data = self.source.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        self._keep(data)
        return n

    def _keep(self, data: bytes) -> None:
        if self.copy is None or not data:
            return
        try:
            self.copy.write(data)
        except OSError as exc:
            self.failed = exc.strerror or str(exc)
            self.drop()

    def drained(self) -> IO[bytes] | None:
        """The copy, from its start, after the rest of the source is read into it (None:
        the copy failed)."""
        while self.copy is not None:
            data = self.source.read(READ)
            if not data:
                break
            self._keep(data)
        copy = self.copy
        if copy is None:
            return None
        try:
            copy.flush()
        except OSError as exc:
            self.failed = exc.strerror or str(exc)
            self.drop()
            return None
        copy.seek(0)
        return copy

    def drop(self) -> None:
        if self.copy is not None:
            self.copy.close()
            self.copy = None
