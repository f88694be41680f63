"""What `gpuwarden slurm submit` leaves in a run's folder beside its batch script: the job it
submitted, so `ps --runs` shows the job's state and `slurm cancel` finds it.

The job id stays the same through requeues (Slurm queues the same job again), so one record per
run folder is the whole story; the job's own history (`SLURM_RESTART_COUNT`) is in the run's events.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from gpuwarden.core.api import RunSummary
from gpuwarden.core.errors import UserError
from gpuwarden.core.run_state import RunState
from gpuwarden.core.safeload import read_json_file

RECORD_NAME = "slurm.json"
SCRIPT_NAME = "job.sbatch"
SPEC_NAME = "job.yaml"
WAITING = "waiting for its Slurm job to start"


@dataclass(frozen=True)
class SlurmRecord:
    """The job a run folder was submitted as."""

    job_id: int
    run_id: str
    name: str
    kind: str
    submitted_at: float
    max_requeues: int

    def write(self, folder: Path) -> None:
        tmp = folder / (RECORD_NAME + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        os.replace(tmp, folder / RECORD_NAME)

    def waiting_run(self) -> RunSummary:
        """The run as listed while its job has not started: it has no record of its own yet (its
        exec makes that), so it is queued since it was submitted."""
        return RunSummary(
            id=self.run_id,
            name=self.name,
            kind=self.kind,
            state=RunState.QUEUED,
            attempt=0,
            message=WAITING,
            created_at=self.submitted_at,
            updated_at=self.submitted_at,
            started_at=None,
            ended_at=None,
            gpus=None,
        )


def read_record(folder: Path) -> SlurmRecord | None:
    """The folder's record, or None when it has none (a run not submitted to Slurm) or one that
    is not a record (the folder is the user's: it may hold anything)."""
    path = folder / RECORD_NAME
    if not path.is_file():
        return None
    try:
        data = read_json_file(path, what="Slurm record")
        return SlurmRecord(
            job_id=int(data["job_id"]),
            run_id=str(data["run_id"]),
            name=str(data["name"]),
            kind=str(data["kind"]),
            submitted_at=float(data["submitted_at"]),
            max_requeues=int(data["max_requeues"]),
        )
    except (UserError, KeyError, TypeError, ValueError):
        return None


def records(root: Path) -> dict[str, tuple[Path, SlurmRecord]]:
    """Run id → (its folder, its record) for every folder under `root` submitted to Slurm."""
    found: dict[str, tuple[Path, SlurmRecord]] = {}
    if not root.is_dir():
        return found
    for folder in sorted(root.iterdir()):
        record = read_record(folder) if folder.is_dir() else None
        if record is not None:
            found[record.run_id] = (folder, record)
    return found
