"""The daemon's folders made owner-only before it takes the lock, and what older versions left
readable tightened. See `gpuwarden.core.private` for why."""

from __future__ import annotations

import os
from pathlib import Path

from gpuwarden.core.errors import UserError
from gpuwarden.core.paths import Paths
from gpuwarden.core.private import (
    OWNER_ONLY_UMASK,
    OwnerOf,
    check_owner,
    ensure_private_dir,
    make_dirs,
    make_private,
)


def current_umask() -> int:
    """This process's umask, read the only way POSIX offers: set it and put it back."""
    umask = os.umask(OWNER_ONLY_UMASK)
    os.umask(umask)
    return umask


def enter_owner_only_umask() -> int:
    """Set the process umask to owner-only; returns the one it replaces.

    Everything the daemon writes afterwards (run folders, specs, logs, probe folders) and
    everything gpuwarden's runners write (checkpoints, events, reports: children inherit the
    umask) is then 0700/0600 without each writer having to remember it. A user's own program
    gets the user's umask back (`Backends.user_umask`): its files are the user's.
    """
    return os.umask(OWNER_ONLY_UMASK)


def prepare_private_state(paths: Paths, owner_of: OwnerOf) -> None:
    """Create or check the runtime and state folders (ours, 0700), refuse a database another
    user owns, and tighten run folders, the database and the daemon log left readable."""
    private_folder(paths.runtime_dir, owner_of, "paths.runtime_dir")
    private_folder(paths.state_dir, owner_of, "paths.state_dir")
    _database_folder(paths.db)
    check_owner(paths.db, owner_of, setting="paths.db")
    ensure_private_dir(paths.runs_dir, owner_of, setting="paths.state_dir")
    for run_dir in paths.runs_dir.iterdir():
        make_private(run_dir)
    make_private(paths.daemon_log)
    if paths.tune_cache.exists():
        make_private(paths.tune_cache)


def private_folder(path: Path, owner_of: OwnerOf, setting: str) -> None:
    """`ensure_private_dir`, where a folder that cannot be made is one line naming `setting`."""
    try:
        ensure_private_dir(path, owner_of, setting=setting)
    except OSError as exc:  # under /proc, a read-only mount, a file in the way
        raise _cannot(path, exc, setting) from None


def _database_folder(db: Path) -> None:
    """Create the folder `paths.db` names when it is missing. One that exists is left as it is:
    it may be shared (a data disk), and only the database in it is ours to make private."""
    if db.parent.is_dir():
        return
    try:
        make_dirs(db.parent)
    except OSError as exc:
        raise _cannot(db.parent, exc, "paths.db") from None


def _cannot(path: Path, exc: OSError, setting: str) -> UserError:
    why = exc.strerror or str(exc)
    return UserError(
        f"{setting}: cannot create the folder {path} ({why}) — set {setting} to a place you can write"
    )
