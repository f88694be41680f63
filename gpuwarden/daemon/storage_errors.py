"""A full or read-only disk under the daemon's state, told apart from a daemon bug.

Writing a run's files or a database row can fail because the disk is full, over quota or mounted
read-only. That is the machine's problem, with a fix the user can make; such a failure is
answered and logged in one line that names the file, never as a traceback.
"""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

_STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}
_SQLITE_STORAGE_CODES = {sqlite3.SQLITE_FULL, sqlite3.SQLITE_READONLY}


def storage_problem(exc: BaseException, folder: Path, db: Path) -> str | None:
    """`<file>: <why>` when `exc` is a write the disk refused, else None. `folder` is named when
    the error does not say which file (a write to a file already open)."""
    if isinstance(exc, OSError) and exc.errno in _STORAGE_ERRNOS:
        return f"{exc.filename or folder}: {exc.strerror}"
    if isinstance(exc, sqlite3.Error) and getattr(exc, "sqlite_errorcode", None) in _SQLITE_STORAGE_CODES:
        return f"{db}: {exc}"
    return None


def storage_message(problem: str) -> str:
    return f"the daemon cannot write {problem} — free space on that disk (or make it writable), then retry"
