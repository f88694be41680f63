"""One daemon per user: an fcntl lock on Paths.lock_file, held for the daemon's whole process.

The lock (not the pid file) is the truth: the kernel drops it when the process exits, so a daemon
killed with -9 never leaves a stale lock behind, and a daemon that is still shutting down (a
request thread finishing, the store flushing) still holds it: no second daemon starts beside it.
The lock is therefore never released by hand. The pid file is only for messages and `down`; it
may outlive the process, since only the lock says whether a daemon runs.

`gpuwarden up` takes the lock before it starts a daemon and hands its descriptor down (flock
locks belong to the open file, which the child shares): of several `up`s typed at once only the
one holding the lock starts a process, and that process holds the lock from its first instruction.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from gpuwarden.core.errors import UserError
from gpuwarden.core.private import OwnerOf, ensure_private_dir, file_owner, write_private_text
from gpuwarden.daemon.private_state import private_folder

__all__ = [
    "DaemonRunning",
    "DatabaseInUse",
    "DatabaseLock",
    "InstanceLock",
    "ensure_private_dir",
    "lock_holder_alive",
    "read_pid",
    "take_lock",
    "write_pid",
]


class DaemonRunning(UserError):
    """Another daemon holds the lock."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        super().__init__(
            f"gpuwarden daemon already running (pid {pid if pid else '?'})", code="already_running"
        )


def read_pid(pid_file: Path) -> int | None:
    """The pid written by the running daemon, or None when the file is missing or garbled."""
    try:
        return int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def write_pid(pid_file: Path, pid: int) -> None:
    """Record the daemon's pid (0600, replaced whole: a reader never sees half of it)."""
    tmp = pid_file.with_suffix(".tmp")
    write_private_text(tmp, f"{pid}\n")
    os.replace(tmp, pid_file)


def take_lock(lock_file: Path, owner_of: OwnerOf = file_owner) -> int | None:
    """A descriptor holding the daemon lock, or None while another process holds it."""
    private_folder(lock_file.parent, owner_of, "paths.runtime_dir")
    try:
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:  # a folder in its place, a read-only mount
        raise UserError(
            f"paths.runtime_dir: cannot open the daemon's lock {lock_file} ({exc.strerror or exc}) — "
            "remove what is in its place or set paths.runtime_dir to a folder you can write"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _inherited(fd: int, lock_file: Path) -> bool:
    """Whether `fd`, handed down by `gpuwarden up`, is `lock_file` with its lock held. It is then
    kept from the daemon's own children: a run holding it would pass for a running daemon."""
    try:
        if not os.path.samestat(os.fstat(fd), os.stat(lock_file)):
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held already by this open file: a no-op
    except OSError:
        return False
    os.set_inheritable(fd, False)
    return True


class InstanceLock:
    """Exclusive, non-blocking lock plus pid file, held until the process exits."""

    def __init__(self, lock_file: Path, pid_file: Path, owner_of: OwnerOf = file_owner) -> None:
        self.lock_file = lock_file
        self.pid_file = pid_file
        self._owner_of = owner_of
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, inherited: int | None = None) -> None:
        """Take the lock, or keep the `inherited` descriptor that holds it; or raise
        DaemonRunning with the holder's pid."""
        if inherited is not None and _inherited(inherited, self.lock_file):
            fd: int | None = inherited
        else:
            fd = take_lock(self.lock_file, self._owner_of)
        if fd is None:
            raise DaemonRunning(read_pid(self.pid_file))
        self._fd = fd
        write_pid(self.pid_file, os.getpid())

    def release(self) -> None:
        """Drop the lock now. Only for a process that stays alive without being the daemon any
        more (tests); the daemon keeps it until it exits."""
        if self._fd is None:
            return
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def lock_holder_alive(lock_file: Path) -> bool:
    """True when some process holds the daemon lock (probe without keeping it)."""
    try:
        fd = os.open(lock_file, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


class DatabaseInUse(UserError):
    """Another daemon writes the same database (it was started with another runtime folder)."""

    def __init__(self, db: Path, holder: str) -> None:
        socket = holder.partition(", socket ")[2] or "<its socket>"
        super().__init__(
            f"another gpuwarden daemon ({holder or 'pid ?'}) uses the database {db} — use that one "
            f"(GPUWARDEN_SOCKET={socket} gpuwarden …), or stop it first, or set XDG_RUNTIME_DIR as "
            "it was when that one started",
            code="already_running",
        )


class DatabaseLock:
    """A second lock, next to the database: the instance lock lives in the runtime folder, which a
    shell without XDG_RUNTIME_DIR (cron, some SSH sessions) puts elsewhere, so without this two
    daemons could supervise the same runs from one database. Held until the process exits."""

    def __init__(self, db: Path) -> None:
        self.path = db.with_name(db.name + ".lock")
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, socket: Path) -> None:
        """Take the lock, recording who holds it, or raise DatabaseInUse naming the holder."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:  # a folder we may not write in
            raise UserError(
                f"paths.db: cannot write {self.path} ({exc.strerror or exc}) — "
                "set paths.db to a file in a folder you can write"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode("utf-8", "replace").strip()
            os.close(fd)
            raise DatabaseInUse(self.path.with_suffix(""), holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}, socket {socket}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Drop the lock now (tests only; the daemon keeps it until it exits)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
