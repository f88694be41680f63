"""The daemon's folders made owner-only before it takes the lock, and what older versions left
readable tightened. See `gpuwarden.core.private` for why."""

from __future__ import annotations

import os

from gpuwarden.core.paths import Paths
from gpuwarden.core.private import OWNER_ONLY_UMASK, OwnerOf, check_owner, ensure_private_dir, make_private


def enter_owner_only_umask() -> int:
    """Set the process umask to owner-only; returns the one it replaces.

    Everything the daemon writes afterwards (run folders, specs, logs, probe folders) and
    everything its runs write (checkpoints, events, reports: children inherit the umask) is then
    0700/0600 without each writer having to remember it.
    """
    return os.umask(OWNER_ONLY_UMASK)


def prepare_private_state(paths: Paths, owner_of: OwnerOf) -> None:
    """Create or check the runtime and state folders (ours, 0700), refuse a database another
    user owns, and tighten run folders, the database and the daemon log left readable."""
    ensure_private_dir(paths.runtime_dir, owner_of, setting="paths.runtime_dir")
    ensure_private_dir(paths.state_dir, owner_of, setting="paths.state_dir")
    check_owner(paths.db, owner_of, setting="paths.db")
    ensure_private_dir(paths.runs_dir, owner_of, setting="paths.state_dir")
    for run_dir in paths.runs_dir.iterdir():
        make_private(run_dir)
    make_private(paths.daemon_log)
    if paths.tune_cache.exists():
        make_private(paths.tune_cache)
