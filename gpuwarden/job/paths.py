"""Where a job's run keeps everything: its own folder, which holds its store too."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuwarden.client.run_folders import run_store_path
from gpuwarden.core.paths import Paths, default_state_dir


@dataclass(frozen=True)
class JobPaths(Paths):
    """A run folder as the supervisor's `Paths`: the store in the folder, the folder's parent as
    the runs folder (the supervisor puts a run at `runs_dir / id`), the lock beside the store.
    The tuning cache stays the user's own, shared with the daemon."""

    run_dir: Path = Path()

    @classmethod
    def of(cls, run_dir: Path) -> JobPaths:
        return cls(
            state_dir=default_state_dir(), runtime_dir=run_dir, db=run_store_path(run_dir), run_dir=run_dir
        )

    @property
    def runs_dir(self) -> Path:
        return self.run_dir.parent

    @property
    def lock_file(self) -> Path:
        return self.run_dir / "exec.lock"

    @property
    def pid_file(self) -> Path:
        return self.run_dir / "exec.pid"
