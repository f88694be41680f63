"""Owner-only state: folders 0700 and files 0600 whatever the umask, in folders that are ours.

Specs carry environment variables (tokens among them), logs and samples show what a user runs:
nothing gpuwarden keeps is for other local users. A folder that already exists but belongs to
another user is refused rather than used: whoever owns it could read, replace or pre-create
what gpuwarden puts there (a socket, a lock, a database).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from gpuwarden.core.errors import UserError

# The daemon runs under this umask, so everything it and its runs create is owner-only.
OWNER_ONLY_UMASK = 0o077
DIR_MODE = 0o700
FILE_MODE = 0o600

# The uid that owns a path (injected by tests to play another user without root).
OwnerOf = Callable[[Path], int]


def file_owner(path: Path) -> int:
    return path.stat().st_uid


def check_owner(path: Path, owner_of: OwnerOf = file_owner, *, setting: str | None = None) -> None:
    """Refuse `path` when it exists and another user owns it."""
    try:
        uid = owner_of(path)
    except FileNotFoundError:
        return
    if uid != os.getuid():
        fix = f"remove it or point `{setting}` elsewhere" if setting else "remove it or use another path"
        raise UserError(
            f"{path} belongs to uid {uid}, not to you (uid {os.getuid()}) — gpuwarden never uses "
            f"another user's files: {fix}",
            code="not_owner",
        )


def make_dirs(path: Path) -> None:
    """Create `path` and each missing folder above it, 0700 whatever the umask; folders that
    exist are left as they are. The XDG Base Directory spec asks this of a program that creates
    a base folder ($XDG_STATE_HOME, the runtime or config folder), and a folder above gpuwarden's
    own holds nothing of anyone else's yet: mode=0700 alone would not do, as `Path.mkdir` makes
    the parents by the umask."""
    missing = []
    for folder in (path, *path.parents):
        if folder.is_dir():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=DIR_MODE)
        except FileExistsError:
            if not folder.is_dir():
                raise
            continue  # made meanwhile by another process: it is that one's to set
        os.chmod(folder, DIR_MODE)


def ensure_private_dir(path: Path, owner_of: OwnerOf = file_owner, *, setting: str | None = None) -> None:
    """Create `path` (and its parents, 0700) or check that the existing one is ours, then make
    it 0700."""
    make_dirs(path)
    check_owner(path, owner_of, setting=setting)
    if stat.S_IMODE(path.stat().st_mode) != DIR_MODE:
        os.chmod(path, DIR_MODE)


def make_private(path: Path) -> None:
    """Tighten an existing file or folder to owner-only (one left by an older version)."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        return  # a link's target is not ours to change
    want = DIR_MODE if stat.S_ISDIR(mode) else FILE_MODE
    if stat.S_IMODE(mode) & ~want:
        os.chmod(path, stat.S_IMODE(mode) & want)


def write_private_text(path: Path, text: str) -> None:
    """Write `text` to `path` as a 0600 file (an existing file is truncated and tightened)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "w", encoding="utf-8", closefd=False) as fh:
            fh.write(text)
    finally:
        os.close(fd)
