"""The common log format family (combined, common, Traefik's), a block of lines at a time.

One pattern, ``TEMPLATE``, defines the format; ``line_pattern`` makes the one-line matcher
(``LINE``, which tells the format apart) and ``block_pattern`` a matcher that ``findall`` runs
over a block of lines, one row per line: the fields asked for (in template order), the time,
and the line's text when it is not in the format. Leaving out the fields nobody reads makes
the rows cheaper; the rows of the fields asked for are the same either way.

A block row matches exactly what ``LINE.match(line)`` matches: the field patterns exclude
the newline, so no match runs past its line, and whatever follows the pattern on a line is
ignored, as a prefix match ignores it.
"""

from __future__ import annotations

import re
from collections.abc import Collection

HEAD = r'{ip} \S+ {user} \[{time}\] "{method} {path}(?: {protocol})?" {status} {bytes}'
TAIL = r'(?: "{referer}" "{user_agent}")?'
TEMPLATE = HEAD + TAIL
FIELDS = {
    "ip": r"\S+",
    "user": r"\S+",
    "time": r"[^\]\n]+",
    "method": r"\S+",
    "path": r"\S+",
    "protocol": r"\S+",
    "status": r"\d\d\d",
    "bytes": r"\S+",
    "referer": r'[^"\n]*',
    "user_agent": r'[^"\n]*',
}
NAMES = tuple(re.findall(r"\{(\w+)\}", TEMPLATE))
"""The fields, in the order of their groups."""


def line_pattern(names: Collection[str], template: str = TEMPLATE) -> str:
    """The format with a group for each of ``names`` (the other fields match ungrouped)."""

    def field(m: re.Match[str]) -> str:
        name = m.group(1)
        return f"({FIELDS[name]})" if name in names else FIELDS[name]

    return re.sub(r"\{(\w+)\}", field, template)


LINE = re.compile(line_pattern(NAMES))


def block_pattern(names: Collection[str]) -> re.Pattern[str]:
    """One match per line of a block (each line ends with a newline): the groups of
    ``names`` and ``time`` for a line in the format, else only the last group, its text.
    The optional referer and user agent are matched only when asked for: whatever follows
    the bytes on a line is ignored anyway, so they change neither whether a line matches
    nor the fields before them."""
    tail = "referer" in names or "user_agent" in names
    line = line_pattern({*names, "time"}, TEMPLATE if tail else HEAD)
    return re.compile(f"(?:{line}[^\\n]*|([^\\n]*))\\n")
