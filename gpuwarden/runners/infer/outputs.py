"""Resumable output writers: an append-only JSONL file and one-file-per-item folders.

Inference runs are restarted after an out-of-memory failure (and may be SIGKILLed at any time),
so every finished item goes to disk at once and a new attempt skips what is already there:

- `JsonlOutput` appends one complete line per item with a single `os.write` on an `O_APPEND`
  descriptor (no Python buffering, so a line is either in the kernel's page cache or not at all
  when the process dies). A crash in the middle of a write can still leave a partial last line
  (disk full, power loss); opening the file truncates it back to the last newline before reading
  the ids, so that item is simply done again.
- `FileOutput` writes each item to a temporary name in the same folder and renames it into
  place, so an output file that exists is always complete.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TMP_PREFIX = ".gpuwarden-tmp-"


def item_key(item_id: Any) -> str:
    """A canonical key for an item id: its JSON text, so 1 and "1" stay different items."""
    return json.dumps(item_id, sort_keys=True, ensure_ascii=False)


def repair_trailing_line(path: Path) -> int:
    """Cut `path` back to its last newline; returns how many bytes were removed (0 if none).

    Reads backwards in blocks, so a large output file costs only its tail.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    block = 64 * 1024
    with open(path, "r+b") as fh:
        end = size
        while end > 0:
            start = max(0, end - block)
            fh.seek(start)
            chunk = fh.read(end - start)
            newline = chunk.rfind(b"\n")
            if newline >= 0:
                keep = start + newline + 1
                break
            end = start
        else:
            keep = 0
        if keep == size:
            return 0
        fh.truncate(keep)
        fh.flush()
        os.fsync(fh.fileno())
        return size - keep


def _write_all(fd: int, data: bytes) -> None:
    """`os.write` until every byte is written (a regular file may take a short write on a full disk)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class JsonlOutput:
    """An append-only JSONL file of finished items, keyed by `key_field`, safe to resume.

    Opening it repairs a partial trailing line, then reads the keys already written; lines that
    do not parse (which only a foreign edit can produce, since lines are written whole) are
    counted in `bad_lines` and left in place.
    """

    def __init__(self, path: Path, key_field: str = "id") -> None:
        self.path = path
        self.key_field = key_field
        path.parent.mkdir(parents=True, exist_ok=True)
        self.repaired_bytes = repair_trailing_line(path)
        self.bad_lines = 0
        self.done: set[str] = set()
        self.rows_before = 0
        for row in self._read_rows():
            self.done.add(item_key(row.get(key_field)))
            self.rows_before += 1
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _read_rows(self) -> Iterator[dict[str, Any]]:
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except (ValueError, RecursionError):
                    self.bad_lines += 1
                    continue
                if isinstance(row, dict) and self.key_field in row:
                    yield row
                else:
                    self.bad_lines += 1

    def rows(self) -> list[dict[str, Any]]:
        """Every complete row currently in the file (for reports and tests)."""
        return list(self._read_rows())

    def is_done(self, item_id: Any) -> bool:
        return item_key(item_id) in self.done

    def write(self, row: dict[str, Any]) -> None:
        """Append `row` as one line in one write; the item counts as done from here on."""
        line = json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n"
        _write_all(self._fd, line.encode("utf-8"))
        self.done.add(item_key(row.get(self.key_field)))

    def sync(self) -> None:
        """fsync: not needed against a process crash (the kernel has the data), only power loss."""
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            try:
                os.fsync(self._fd)
            finally:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> JsonlOutput:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def remove_stale_temps(folder: Path) -> int:
    """Delete temporary files a killed attempt left behind; returns how many."""
    removed = 0
    if not folder.is_dir():
        return 0
    for path in folder.glob(TMP_PREFIX + "*"):
        try:
            path.unlink()
            removed += 1
        except OSError:
            continue
    return removed


def write_file_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary name in the same folder and a rename.

    The temporary file is fsynced before the rename so a crash never leaves a complete-looking
    name with partial content.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f"{TMP_PREFIX}{os.getpid()}-{path.name}"
    data = text.encode("utf-8")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
