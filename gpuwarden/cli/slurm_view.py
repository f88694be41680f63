"""What `gpuwarden ps --runs DIR` adds for runs submitted with `gpuwarden slurm submit`: each
one's Slurm job and its state, and the runs whose job has not started yet (no record of their
own so far: they wait in Slurm's queue)."""

from __future__ import annotations

from pathlib import Path

from gpuwarden.core.api import RunSummary
from gpuwarden.core.errors import UserError
from gpuwarden.slurm.record import records
from gpuwarden.slurm.scheduler import JobState, state


def slurm_jobs(runs_dir: Path, runs: list[RunSummary]) -> tuple[list[RunSummary], dict[str, str]]:
    """(the runs, with those still waiting in Slurm added; run id → its job and state, as ps
    shows it). Nothing is added where no run was submitted to Slurm, and without Slurm's
    commands a job's state reads `?`."""
    found = records(runs_dir)
    if not found:
        return runs, {}
    try:
        states = state(record.job_id for _, record in found.values())
    except UserError:
        states = {}
    jobs: dict[str, str] = {}
    for run_id, (_, record) in found.items():
        job = states.get(record.job_id)
        said = (
            "?" if job is None else job.state if job.reason in ("", "None") else f"{job.state} ({job.reason})"
        )
        jobs[run_id] = f"{record.job_id} {said}"
    listed = {r.id for r in runs}
    waiting = [record.waiting_run() for run_id, (_, record) in found.items() if run_id not in listed]
    return sorted([*runs, *waiting], key=lambda r: r.created_at, reverse=True), jobs


def _said(job: JobState | None) -> str:
    if job is None:
        return "?"
    return job.state if job.reason in ("", "None") else f"{job.state} ({job.reason})"
