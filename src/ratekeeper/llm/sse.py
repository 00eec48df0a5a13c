"""Server-sent events, parsed incrementally from bytes as they pass (sans-I/O).

``SSEParser.feed(chunk)`` takes the stream's bytes in chunks cut anywhere — mid-line, mid-CRLF,
mid-UTF-8 character — and returns the events completed so far, as the WHATWG rules read them:

- a line ends at LF, CR or CRLF (a CR ending one chunk and an LF starting the next are one
  line end); a UTF-8 byte order mark at the very start is dropped;
- ``data:`` lines append to the event's data (joined by LF), ``event:`` names its type, a line
  starting with ``:`` is a comment; one space after the colon is dropped; other fields
  (``id``, ``retry``) are ignored;
- a blank line ends the event; an event without data is no event.

Memory is bounded per stream: no event (its data and the line being read) grows past
``max_event_bytes``. A longer event is dropped whole, up to the blank line ending it, and
counted in ``dropped`` (the meter logs it). Lines are split on bytes, never decoded here, so a
character cut between chunks is whole again in the event's data. ``close()`` ends the stream
and returns an event left without its blank line (a server that closed early): the rules
discard it, a meter still reads its usage.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_EVENT_BYTES = 1 << 20
"""1 MiB: far above any completion chunk or usage event."""


@dataclass(frozen=True, slots=True)
class Event:
    """One event: its type (``message`` when it named none) and its data as bytes."""

    type: str
    data: bytes


class SSEParser:
    """The incremental parser of one stream (module docstring)."""

    __slots__ = ("_cr", "_data", "_drop", "_line", "_size", "_start", "_type", "dropped", "max")

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self.max = max_event_bytes
        self.dropped = 0
        self._line = bytearray()  # the line being read
        self._data: list[bytes] = []
        self._type = ""
        self._size = 0  # bytes of the event so far (data lines)
        self._drop = False  # the event went past the bound: skip to its blank line
        self._cr = False  # the last chunk ended in CR: an LF opening the next is its pair
        self._start = True

    def feed(self, chunk: bytes) -> list[Event]:
        """The events that ``chunk`` completes (often none, often one)."""
        if not chunk:
            return []
        if self._start:
            if len(self._line) + len(chunk) < 3 and b"\xef\xbb\xbf".startswith(self._line + chunk):
                self._line += chunk  # maybe a BOM cut in two: wait for the rest
                return []
            chunk = bytes(self._line) + chunk
            self._line.clear()
            self._start = False
            if chunk.startswith(b"\xef\xbb\xbf"):
                chunk = chunk[3:]
        if self._cr and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._cr = chunk[-1:] == b"\r"
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        end = chunk.rfind(b"\n")
        if end < 0:
            self._grow(chunk)
            return []
        lines = chunk[:end].split(b"\n")
        if self._line:
            first = bytes(self._line) + lines[0]
            self._line.clear()
            lines[0] = first
        rest = chunk[end + 1 :]
        events: list[Event] = []
        for line in lines:
            self._take(line, events)
        if rest:
            self._grow(rest)
        return events

    def close(self) -> list[Event]:
        """End of stream: the event left without its blank line, if any."""
        events: list[Event] = []
        if self._line:
            line = bytes(self._line)
            self._line.clear()
            self._take(line, events)
        self._take(b"", events)
        return events

    def _grow(self, part: bytes) -> None:
        """Add ``part`` to the line being read, within the bound."""
        if self._drop:  # skipping an over-long event: one byte says the line is not blank
            if not self._line:
                self._line += part[:1]
            return
        self._line += part
        if self._size + len(self._line) > self.max:
            self._overflow()
            self._line += b"x"  # mid-line: not blank

    def _overflow(self) -> None:
        """The event went past the bound: forget it, skip to its blank line."""
        if not self._drop:
            self.dropped += 1
        self._drop = True
        self._line.clear()
        self._data.clear()
        self._size = 0

    def _take(self, line: bytes, events: list[Event]) -> None:
        """One whole line (without its end)."""
        if not line:
            if self._data and not self._drop:
                events.append(Event(self._type or "message", b"\n".join(self._data)))
            self._data.clear()
            self._type = ""
            self._size = 0
            self._drop = False
            return
        if self._drop:
            return
        if line[0] == 58:  # ":" a comment
            return
        colon = line.find(b":")
        if colon < 0:
            field, value = line, b""
        else:
            field, value = line[:colon], line[colon + 1 :]
            if value[:1] == b" ":
                value = value[1:]
        if field == b"data":
            self._size += len(value) + 1
            if self._size > self.max:
                self._overflow()
                return
            self._data.append(value)
        elif field == b"event":
            self._type = value.decode("utf-8", "replace")
