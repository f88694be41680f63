"""Where a job's run keeps everything: its own folder, which holds its store too."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuwarden.core.paths import Paths, default_state_dir
from gpuwarden.core.run_folder import PID_NAME, lock_path, run_store_path


@dataclass(frozen=True)
class JobPaths(Paths):
    """A run folder as the supervisor's `Paths`: its one run lives in it, whatever its name (an
    engine restarts the same command, so the folder is the run's stable name), with the store and
    the lock inside. The tuning cache stays the user's own, shared with the daemon."""

    folder: Path = Path()

    @classmethod
    def of(cls, folder: Path) -> JobPaths:
        db = run_store_path(folder)
        return cls(state_dir=default_state_dir(), runtime_dir=folder, db=db, folder=folder)

    @property
    def runs_dir(self) -> Path:
        return self.folder.parent

    def run_dir(self, run_id: str) -> Path:
        return self.folder

    @property
    def lock_file(self) -> Path:
        return lock_path(self.folder)

    @property
    def pid_file(self) -> Path:
        return self.folder / PID_NAME
