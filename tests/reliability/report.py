"""Rows of the reliability table and how they are printed and written to docs/reliability.md.

The runner owns only the block between ``BEGIN`` and ``END`` in docs/reliability.md (the fault,
load and exactness rows); everything else in that file is left as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

BEGIN = "<!-- faults-and-load:begin (written by ./scripts/reliability) -->"
END = "<!-- faults-and-load:end -->"


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the table: the fault or input, what was checked, the figure, pass/fail."""

    fault: str
    checked: str
    figure: str
    passed: bool


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| fault or input | what was checked | figure | result |",
        "| --- | --- | --- | --- |",
    ]
    for r in rows:
        cells = (r.fault, r.checked, r.figure, "pass" if r.passed else "**FAIL**")
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def write_doc(path: Path, block: str) -> None:
    """Put ``block`` between the markers in ``path`` (appending them if absent)."""
    text = path.read_text() if path.exists() else "# Reliability\n"
    wrapped = f"{BEGIN}\n{block.rstrip()}\n{END}"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        text = head + wrapped + tail
    else:
        text = text.rstrip() + "\n\n" + wrapped + "\n"
    path.write_text(text)
