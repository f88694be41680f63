"""Reading a run's log by byte offset (supervisord's tail: offset, length → bytes, next offset,
overflow), for the daemon's API and for the dashboard on a database."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from gpuwarden.core.api.runs import LogChunk, LogSlice


def read_log(path: Path, offset: int | None, limit: int) -> LogSlice:
    """Bytes from `offset` (negative: that many from the end; None: the last `limit`), never
    splitting a UTF-8 character; `overflow` when bytes before the slice were skipped. A log that
    is missing or unreadable reads as empty."""
    try:
        stat = path.stat()
        size, modified = stat.st_size, stat.st_mtime
    except OSError:
        size, modified = 0, None
    overflow = False
    if offset is None or offset < 0:
        want = limit if offset is None else min(-offset, limit)
        start = max(0, size - want)
        overflow = start > 0
    else:
        start = min(offset, size)
    data = b""
    if size > start:
        try:
            with path.open("rb") as fh:
                fh.seek(start)
                data = fh.read(min(limit, size - start))
        except OSError:
            data = b""
    data = data[: _utf8_complete(data)]
    return LogSlice(
        data=data.decode("utf-8", "replace"),
        offset=start,
        next_offset=start + len(data),
        overflow=overflow,
        size=size,
        modified=modified,
    )


def log_chunk(piece: LogSlice, *, ended: bool, attempt: int, stream: Literal["stdout", "stderr"]) -> LogChunk:
    """A slice of an attempt's log; `eof` once the attempt has ended and the slice reaches the
    end of the log."""
    return LogChunk(
        **piece.model_dump(), eof=ended and piece.next_offset >= piece.size, attempt=attempt, stream=stream
    )


NO_LOG = LogSlice(data="", offset=0, next_offset=0, overflow=False, size=0)


def _utf8_complete(data: bytes) -> int:
    """Length of `data` without a trailing incomplete UTF-8 sequence."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue  # continuation byte: look further back for the lead byte
        if byte & 0x80 == 0:
            return len(data)
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4
        return len(data) if back >= need else len(data) - back
    return len(data)
