"""A write the disk refused — full, read-only, immutable, not this user's — told apart from a
bug, with what is wrong in words and the fix.

SQLite says only "disk I/O error" or "attempt to write a readonly database", and the OS error of a
write to an open file names no file; so the files involved are looked at (the filesystem's
read-only flag, the inode's immutable and append-only flags, the user's write permission, free
space) to name the one that is the problem.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
import struct
from dataclasses import dataclass
from pathlib import Path

_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_REFUSED_ERRNOS = {errno.EROFS, errno.EPERM, errno.EACCES}
_SQLITE_REFUSED = {
    sqlite3.SQLITE_READONLY,
    sqlite3.SQLITE_IOERR,
    sqlite3.SQLITE_CANTOPEN,
    sqlite3.SQLITE_PERM,
}
_FREE_SPACE = "free space on that disk"
_MOVE_OR_REMOUNT = "remount it read-write, or keep gpuwarden's state elsewhere (paths.state_dir, paths.db)"

# <linux/fs.h>: FS_IOC_GETFLAGS reads an inode's flags (what `lsattr` shows).
_FS_IOC_GETFLAGS = 0x80086601
_FS_IMMUTABLE_FL = 0x10
_FS_APPEND_FL = 0x20


@dataclass(frozen=True)
class StorageFault:
    """Why `path` cannot be written, and what fixes it. `full`: space, not permission."""

    path: Path
    why: str
    fix: str
    full: bool = False

    @property
    def code(self) -> str:
        """The API's error code."""
        return "storage_full" if self.full else "storage_unwritable"

    @property
    def problem(self) -> str:
        """`<file>: <why>`, the same words each time the same fault comes back."""
        return f"{self.path}: {self.why}"

    def line(self) -> str:
        return f"cannot write {self.problem} — {self.fix}"


def storage_fault(exc: BaseException, *, folder: Path, db: Path) -> StorageFault | None:
    """The fault when `exc` is a write the disk refused, else None (a bug, or the user's input).
    `folder` stands for the file when an OS error names none (a write to a file already open)."""
    if isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS | _REFUSED_ERRNOS:
        path = Path(exc.filename) if exc.filename else folder
        if exc.errno in _FULL_ERRNOS:
            return StorageFault(path, exc.strerror or "no space left", _FREE_SPACE, full=True)
        # Creating or removing a file is refused by its folder.
        found = unwritable(path) or unwritable(path.parent)
        if found is None and not exc.filename and exc.errno != errno.EROFS:
            # Naming no file, EPERM is as likely a process's (a signal, a process read): it is
            # the state folder's only when that folder cannot be written.
            return None
        return found or StorageFault(path, exc.strerror or str(exc), _fix_permission(path))
    if not isinstance(exc, sqlite3.Error):
        return None
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return None
    primary = code & 0xFF
    if primary == sqlite3.SQLITE_FULL:
        return StorageFault(db, str(exc), _FREE_SPACE, full=True)
    if primary not in _SQLITE_REFUSED:
        return None
    for part in database_files(db):
        if (fault := unwritable(part)) is not None:
            return fault
    return StorageFault(db, str(exc), "check the disk under it (dmesg) and that this user can write it")


def database_files(db: Path) -> list[Path]:
    """The files a SQLite database in WAL mode writes, and the folder SQLite creates them in."""
    return [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm"), db.parent]


def unwritable(path: Path) -> StorageFault | None:
    """Why `path` (or, when it does not exist, the nearest folder above it) cannot be written now;
    None when nothing says it cannot."""
    there = _existing(path)
    if there is None:
        return None
    try:
        fs = os.statvfs(there)
    except OSError:
        return None
    if fs.f_flag & os.ST_RDONLY:
        return StorageFault(there, "on a read-only filesystem", _MOVE_OR_REMOUNT)
    flags = _inode_flags(there)
    if flags & _FS_IMMUTABLE_FL:
        return StorageFault(there, "marked immutable", f"clear the flag (chattr -i {there})")
    if flags & _FS_APPEND_FL:
        return StorageFault(there, "marked append-only", f"clear the flag (chattr -a {there})")
    if not os.access(there, os.W_OK):
        return StorageFault(there, "permission denied", _fix_permission(there))
    if fs.f_bfree == 0 or (fs.f_bavail == 0 and os.geteuid() != 0):  # root may use the reserve
        return StorageFault(there, "no space left on the disk", _FREE_SPACE, full=True)
    return None


def _existing(path: Path) -> Path | None:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return None


def _inode_flags(path: Path) -> int:
    """The inode's flags (0 where the filesystem or the platform has none)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        # The kernel writes an int, whatever the request's encoded size says.
        raw = fcntl.ioctl(fd, _FS_IOC_GETFLAGS, bytes(8))
        return int(struct.unpack_from("i", raw)[0])
    except OSError:
        return 0
    finally:
        os.close(fd)


def _fix_permission(path: Path) -> str:
    return f"give uid {os.geteuid()} write access to it (chown or chmod {path})"
