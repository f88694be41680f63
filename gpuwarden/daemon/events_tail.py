"""Reading an attempt's events.jsonl from a remembered byte offset, whole lines only.

The offset only moves after the lines up to it are stored (`commit`), so a crash re-reads at most
what was not stored, and a line the runner is still writing waits for its newline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MAX_CHUNK = 1 << 20
# Stands for a line longer than MAX_CHUNK: not JSON, so it is counted as a skipped line.
OVERSIZED = "(a line longer than 1 MiB, skipped)"


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
        # Inside a line longer than MAX_CHUNK: its rest is dropped up to the next newline.
        self._dropping = False

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
        lines: list[str] = []
        start = 0
        if self._dropping:
            newline = data.find(b"\n")
            if newline < 0:
                return Chunk([], self.offset + len(data), more)
            self._dropping, start = False, newline + 1
        cut = data.rfind(b"\n")
        if final and not more:
            end = len(data)
        elif cut < start:
            if not more:
                return None if start == 0 else Chunk([], self.offset + start, False)
            # A whole chunk without a newline: a runaway line that would block the tail forever.
            self._dropping = True
            return Chunk([OVERSIZED], self.offset + len(data), more)
        else:
            end = cut + 1
        lines += [line.decode("utf-8", "replace") for line in data[start:end].splitlines() if line.strip()]
        return Chunk(lines, self.offset + end, more)

    def commit(self, offset: int) -> None:
        """The lines up to `offset` are stored."""
        self.offset = offset
