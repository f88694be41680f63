"""The submitter's side: submit a batch script, read jobs' states, cancel, release a held start.

Jobs are named by Slurm's numeric job id (an array task's own id, not `123_4`). Without
accounting (sacct) Slurm forgets a job some minutes after it ends (MinJobAge): `state` then
says so rather than guessing how it ended.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from gpuwarden.core.errors import UserError
from gpuwarden.slurm.commands import refusal, run_tool, says_invalid_job

# The states in which a job will not run again by itself (squeue(1), JOB STATE CODES).
ENDED_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
        "UNKNOWN",
    }
)
# What `state` says of a job neither squeue nor scontrol knows.
FORGOTTEN = "ended (no accounting)"
# squeue's fields: %A the job's own id, %T its state in full, %r the reason it is pending (or None).
_SQUEUE_FORMAT = "%A|%T|%r"
# Slurm's credentials carry their time in whole seconds (see `release_begin_time`).
_CREDENTIAL_SECOND = 1.1


class JobState(NamedTuple):
    """A job's state as Slurm names it (PENDING, RUNNING, COMPLETED, …) and why (`BeginTime`,
    `None`, …). A job nothing knows any more is UNKNOWN, "ended (no accounting)"."""

    state: str
    reason: str

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES


def submit(script: Path) -> int:
    """Submit `script` with sbatch; the new job's id."""
    if not script.is_file():
        raise UserError(f"no batch script at {script}: write it first (sbatch_script)")
    answer = run_tool(["sbatch", "--parsable", str(script)])
    if not answer.ok:
        raise UserError(
            f"sbatch refused {script}: {refusal('sbatch', answer)}: fix that option"
            " (`sbatch --help` lists them) or the script's line that sets it",
            code="slurm_refused",
        )
    # --parsable prints `id` or `id;cluster`.
    first = answer.stdout.strip().split(";", 1)[0]
    if not first.isdigit():
        raise UserError(
            f"sbatch answered {answer.stdout.strip()!r}, not a job id: check that sbatch is Slurm's"
        )
    return int(first)


def state(job_ids: Iterable[int]) -> dict[int, JobState]:
    """Each job's state, queued, running or ended some minutes ago, in one squeue call; UNKNOWN
    ("ended (no accounting)") for a job Slurm has forgotten."""
    wanted = sorted(set(job_ids))
    found = _from_squeue(wanted)
    return {job_id: found.get(job_id, JobState("UNKNOWN", FORGOTTEN)) for job_id in wanted}


def cancel(job_id: int) -> None:
    """End the job (or take it out of the queue). A job that has already ended is left as it is."""
    # Without -v, scancel says nothing about a job id it does not know, and exits 0.
    answer = run_tool(["scancel", "-v", str(job_id)])
    errors = [line for line in answer.stderr.splitlines() if "error:" in line]
    if not errors or all("already completing or completed" in line for line in errors):
        return
    if says_invalid_job(answer):
        raise UserError(
            f"no Slurm job {job_id} to cancel: check the id with squeue", code="slurm_unknown_job"
        )
    raise UserError(f"Slurm did not cancel job {job_id}: {refusal('scancel', answer)}")


def release_begin_time(job_id: int) -> None:
    """Let a pending job start now: Slurm holds a requeued job back for a while (reason
    `BeginTime`), and `--begin` holds a new one."""
    # slurmd refuses a batch job whose credential was made in the same second as its last run was
    # killed ("Job credential revoked", the job then FAILED), which a requeued job released at
    # once can meet; after a second the new credential is younger than the revocation. Not
    # `StartTime=now+1`: a start time not yet due waits for Slurm's next scheduling pass (30 s).
    time.sleep(_CREDENTIAL_SECOND)
    answer = run_tool(["scontrol", "update", f"JobId={job_id}", "StartTime=now"])
    if answer.ok:
        return
    if says_invalid_job(answer):
        raise UserError(
            f"no Slurm job {job_id} to release: check the id with squeue", code="slurm_unknown_job"
        )
    if "no longer pending" in answer.stderr or "already finished" in answer.stderr:
        raise UserError(
            f"Slurm job {job_id} is not pending, so its start cannot be brought forward:"
            " check its state with squeue"
        )
    raise UserError(f"Slurm did not release job {job_id}: {refusal('scontrol', answer)}")


def _from_squeue(job_ids: list[int]) -> dict[int, JobState]:
    if not job_ids:
        return {}
    # --states=all lists ended jobs too, as long as slurmctld keeps them (MinJobAge): everything
    # `scontrol show job` would know, in a format of our choosing.
    argv = ["squeue", "--noheader", "--states=all", "--format", _SQUEUE_FORMAT]
    answer = run_tool([*argv, "--jobs", ",".join(map(str, job_ids))])
    # squeue refuses the whole list when it lists none of the ids.
    if not answer.ok and says_invalid_job(answer):
        return {}
    if not answer.ok:
        raise UserError(
            f"squeue failed: {refusal('squeue', answer)}: check that slurmctld is up (`scontrol ping`)"
        )
    found = {}
    for line in answer.stdout.splitlines():
        job_id, job_state, reason = line.split("|", 2)
        if job_id.isdigit() and int(job_id) in job_ids:
            found[int(job_id)] = JobState(job_state, reason)
    return found
