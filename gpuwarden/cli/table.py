"""Tables the CLI prints (`ps`, …), fitted to the terminal's width as the dashboard's tables are.

A column says how it gives way when the row is too wide: `keep` never (ids, states, times),
`name` shortens in the middle so the distinguishing tail stays (`oom-re…overy-c3`), `rest` (the
last column: a message) is cut at its end. Output that goes to a pipe or a file is not cut,
whatever COLUMNS says (a parent process may have set it for its own terminal): the width of a
terminal that is not there would only lose text a script greps for.
"""

from __future__ import annotations

import shutil
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

GAP = "  "
NAME_MIN = 12  # a shortened name keeps this many cells: enough of its head and tail to tell apart
REST_MIN = 12
# How a row too wide gives way, step by step: long names first down to a fair share, then the
# message down to its least, then names down to theirs.
SHRINK_STEPS = (("name", 20), ("rest", REST_MIN), ("name", NAME_MIN))


@dataclass(frozen=True)
class Column:
    """A column: its heading, how it gives way (a host's name would be `name`, like a run's),
    and its alignment."""

    head: str
    fit: Literal["keep", "name", "rest"] = "keep"
    align: Literal["<", ">"] = "<"


def output_width() -> int | None:
    """The terminal's width (COLUMNS, when set, says it); None (no limit) when the output is not
    a terminal."""
    if not sys.stdout.isatty():
        return None
    return shutil.get_terminal_size().columns


def cut_end(text: str, width: int) -> str:
    """`text` in at most `width` cells, an ellipsis marking what was cut."""
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def cut_middle(text: str, width: int) -> str:
    """`text` in at most `width` cells, cut in the middle: names that share a head (the same spec
    run three times: `oom-recovery-c1`, `-c2`, …) stay apart by their tails."""
    if len(text) <= width:
        return text
    if width < 3:
        return text[:width]
    tail = (width - 1) // 2 + 1
    head = width - 1 - tail
    return f"{text[:head]}…{text[-tail:]}"


def fitted_widths(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int | None) -> list[int]:
    """Each column's width: its widest cell, then the `name` and `rest` columns narrowed (in
    the order of SHRINK_STEPS) until the row fits `width`."""
    widths = [max([len(c.head), *(len(row[i]) for row in rows)]) for i, c in enumerate(columns)]
    if width is None:
        return widths
    for fit, least in SHRINK_STEPS:
        for i, column in enumerate(columns):
            over = sum(widths) + len(GAP) * (len(columns) - 1) - width
            if column.fit == fit and over > 0:
                widths[i] = max(min(widths[i], max(least, len(column.head))), widths[i] - over)
    return widths


def table_lines(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int | None = None
) -> list[str]:
    """The header and one line per row, fitted to `width` (None: no limit)."""
    widths = fitted_widths(columns, rows, width)

    def line(cells: Sequence[str]) -> str:
        parts = []
        for column, cell, w in zip(columns, cells, widths, strict=True):
            shown = cut_middle(cell, w) if column.fit == "name" else cut_end(cell, w)
            parts.append(f"{shown:{column.align}{w}}")
        return GAP.join(parts).rstrip()

    return [line([c.head for c in columns]), *(line(row) for row in rows)]


def wrapped(line: str, width: int | None) -> list[str]:
    """A line of prose (a retune's sentence, an attempt's reason) in `width` cells: wrapped
    between words, its continuations indented under it, rather than cut by the terminal
    mid-word at the left margin. Paths and words longer than the width stay whole."""
    if width is None or len(line) <= width:
        return [line]
    indent = " " * (len(line) - len(line.lstrip(" ")))
    return textwrap.wrap(
        line,
        width,
        initial_indent="",
        subsequent_indent=indent + "    ",
        break_long_words=False,
        break_on_hyphens=False,
        drop_whitespace=True,
    ) or [line]
