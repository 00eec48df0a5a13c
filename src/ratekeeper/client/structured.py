"""Structured-field lists (RFC 8941 / RFC 9651), as the IETF ``RateLimit`` fields use them.

Only what ``RateLimit`` and ``RateLimit-Policy`` need: a List of Items with Parameters. Bare
items: Integer, Decimal, String, Token, Byte Sequence, Boolean. Inner Lists are skipped as a
whole member. The parser never raises: a field that does not parse is ``None`` (RFC 8941 4.2:
a field that fails to parse is ignored), so hostile input puts the client in reactive mode,
never in an exception.

    parse_list('"burst";q=100;w=60, "day";q=1000;w=86400')
    -> [("burst", {"q": 100, "w": 60}), ("day", {"q": 1000, "w": 86400})]
"""

from __future__ import annotations

import base64
import binascii
import re

Bare = int | float | str | bytes | bool
Member = tuple[Bare, dict[str, Bare]]

MAX_FIELD = 4096
"""Longer fields are ignored: no server needs more, and it bounds the parser's work."""
_KEY_FIRST = set("abcdefghijklmnopqrstuvwxyz*")
_KEY = _KEY_FIRST | set("0123456789_-.")
_TOKEN_FIRST = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ*")
_TOKEN = _TOKEN_FIRST | set("0123456789:/!#$%&'+-.^_`|~")
_NUMBER = re.compile(r"-?[0-9]{1,15}(\.[0-9]{1,3})?")


class _Bad(Exception):
    """Raised inside the parser only; ``parse_list`` turns it into ``None``."""


class _Reader:
    __slots__ = ("pos", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def skip_spaces(self, also_tabs: bool = False) -> None:
        while self.peek() == " " or (also_tabs and self.peek() == "\t"):
            self.pos += 1

    def bare(self) -> Bare:
        char = self.peek()
        if char == "-" or char.isdigit():
            return self.number()
        if char == '"':
            return self.string()
        if char == ":":
            return self.bytes()
        if char == "?":
            return self.boolean()
        if char in _TOKEN_FIRST and char:
            return self.token()
        raise _Bad

    def number(self) -> int | float:
        match = _NUMBER.match(self.text, self.pos)
        if match is None:
            raise _Bad
        self.pos = match.end()
        text = match.group()
        if match.group(1) is None:
            return int(text)
        if len(text.lstrip("-").partition(".")[0]) > 12:
            raise _Bad
        return float(text)

    def string(self) -> str:
        self.pos += 1
        out: list[str] = []
        while True:
            char = self.peek()
            self.pos += 1
            if char == "":
                raise _Bad
            if char == '"':
                return "".join(out)
            if char == "\\":
                char = self.peek()
                self.pos += 1
                if char not in ('"', "\\"):
                    raise _Bad
            elif not " " <= char <= "~":
                raise _Bad
            out.append(char)

    def bytes(self) -> bytes:
        end = self.text.find(":", self.pos + 1)
        if end < 0:
            raise _Bad
        chunk = self.text[self.pos + 1 : end]
        self.pos = end + 1
        try:
            return base64.b64decode(chunk, validate=True)
        except (binascii.Error, ValueError):
            raise _Bad from None

    def boolean(self) -> bool:
        value = self.text[self.pos + 1 : self.pos + 2]
        if value not in ("0", "1"):
            raise _Bad
        self.pos += 2
        return value == "1"

    def token(self) -> str:
        start = self.pos
        while self.peek() in _TOKEN and self.peek():
            self.pos += 1
        return self.text[start : self.pos]

    def key(self) -> str:
        start = self.pos
        if self.peek() not in _KEY_FIRST or not self.peek():
            raise _Bad
        while self.peek() in _KEY and self.peek():
            self.pos += 1
        return self.text[start : self.pos]

    def parameters(self) -> dict[str, Bare]:
        params: dict[str, Bare] = {}
        while self.peek() == ";":
            self.pos += 1
            self.skip_spaces()
            name = self.key()
            value: Bare = True
            if self.peek() == "=":
                self.pos += 1
                value = self.bare()
            params[name] = value
        return params

    def inner_list(self) -> None:
        self.pos += 1
        while True:
            self.skip_spaces()
            if self.peek() == ")":
                self.pos += 1
                self.parameters()
                return
            self.bare()
            self.parameters()
            if self.peek() not in (" ", ")"):
                raise _Bad


def parse_list(field: str | None) -> list[Member] | None:
    """The members of a structured-field List (Items with their Parameters), or ``None`` when
    the field is absent, too long or does not parse. Inner Lists are left out."""
    if field is None or len(field) > MAX_FIELD:
        return None
    reader = _Reader(field)
    out: list[Member] = []
    try:
        reader.skip_spaces()
        if reader.peek() == "":
            return []
        while True:
            if reader.peek() == "(":
                reader.inner_list()
            else:
                value = reader.bare()
                out.append((value, reader.parameters()))
            reader.skip_spaces(also_tabs=True)
            if reader.peek() == "":
                return out
            if reader.peek() != ",":
                raise _Bad
            reader.pos += 1
            reader.skip_spaces(also_tabs=True)
            if reader.peek() == "":
                raise _Bad  # a trailing comma
    except (_Bad, IndexError, ValueError, OverflowError):
        return None
