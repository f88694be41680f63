"""Reading an attempt's events.jsonl from a remembered byte offset, whole lines only.

The offset only moves after the lines up to it are stored (`commit`), so a crash re-reads at most
what was not stored, and a line the runner is still writing waits for its newline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MAX_CHUNK = 1 << 20


@dataclass(frozen=True)
class Chunk:
    """Complete lines read from `start`; `end_offset` is where the next read starts."""

    lines: list[str]
    end_offset: int
    more: bool


class EventsTail:
    """Incremental reader of one events file."""

    def __init__(self, path: Path, offset: int = 0) -> None:
        self.path = path
        self.offset = offset

    def read(self, final: bool = False) -> Chunk | None:
        """New complete lines, or None when there are none. With `final` (the writer has exited) a
        last line without a newline is taken too."""
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                data = fh.read(MAX_CHUNK)
        except OSError:
            return None
        if not data:
            return None
        more = len(data) == MAX_CHUNK
        cut = data.rfind(b"\n")
        if final and not more:
            end = len(data)
        elif cut < 0:
            return None
        else:
            end = cut + 1
        lines = [line.decode("utf-8", "replace") for line in data[:end].splitlines() if line.strip()]
        return Chunk(lines, self.offset + end, more)

    def commit(self, offset: int) -> None:
        """The lines up to `offset` are stored."""
        self.offset = offset
