"""The job's side: what Slurm tells a process it started, and asking Slurm to run the job again.

`current_job()` reads the `SLURM_*` variables into a typed view (None outside a job). A job that
checkpointed at its time-limit warning calls `requeue(job.job_id)`: Slurm ends this run ("DUE TO
JOB REQUEUE") and queues the same job again, with `SLURM_RESTART_COUNT` one higher.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuwarden.core.errors import UserError
from gpuwarden.slurm.commands import refusal, run_tool, says_invalid_job


@dataclass(frozen=True)
class ArrayTask:
    """This job's place in a job array (`sbatch --array`)."""

    array_job_id: int  # SLURM_ARRAY_JOB_ID: the id the whole array was submitted as
    task_id: int  # SLURM_ARRAY_TASK_ID
    task_count: int | None  # SLURM_ARRAY_TASK_COUNT
    task_min: int | None  # SLURM_ARRAY_TASK_MIN
    task_max: int | None  # SLURM_ARRAY_TASK_MAX


@dataclass(frozen=True)
class SlurmJob:
    """A Slurm job as the process it runs sees it."""

    job_id: int  # SLURM_JOB_ID: unique even for an array's tasks
    array: ArrayTask | None
    restart_count: int  # SLURM_RESTART_COUNT: requeues so far (unset on the first run: 0)
    num_nodes: int  # SLURM_NNODES
    node_id: int  # SLURM_NODEID: this node's index among the job's nodes
    proc_id: int  # SLURM_PROCID: this task's rank among the step's tasks (0 in the batch shell)
    nodelist: str  # SLURM_JOB_NODELIST, compressed as Slurm writes it (`gpu[01-04]`)
    gpus: tuple[str, ...]  # SLURM_JOB_GPUS, else CUDA_VISIBLE_DEVICES; empty when neither is set
    submit_dir: Path | None  # SLURM_SUBMIT_DIR

    def hostnames(self) -> list[str]:
        """The job's nodes one name each, in Slurm's order (`scontrol show hostnames`)."""
        return expand_hostnames(self.nodelist)


def current_job(environ: Mapping[str, str] | None = None) -> SlurmJob | None:
    """The job this process runs in, from `environ` (default: this process's environment), or
    None outside a Slurm job. UserError names a variable Slurm would never set as it is."""
    env = os.environ if environ is None else environ
    if "SLURM_JOB_ID" not in env:
        return None
    return SlurmJob(
        job_id=_int(env, "SLURM_JOB_ID"),
        array=_array_task(env),
        restart_count=_int(env, "SLURM_RESTART_COUNT", 0),
        num_nodes=_int(env, "SLURM_NNODES", 1),
        node_id=_int(env, "SLURM_NODEID", 0),
        proc_id=_int(env, "SLURM_PROCID", 0),
        nodelist=env.get("SLURM_JOB_NODELIST", ""),
        gpus=_gpus(env),
        submit_dir=Path(env["SLURM_SUBMIT_DIR"]) if env.get("SLURM_SUBMIT_DIR") else None,
    )


def expand_hostnames(nodelist: str) -> list[str]:
    """A compressed node list (`gpu[01-02],login`) as host names, expanded by Slurm itself."""
    if not nodelist:
        return []
    answer = run_tool(["scontrol", "show", "hostnames", nodelist])
    if not answer.ok:
        raise UserError(
            f"Slurm cannot expand the node list {nodelist!r}: {refusal('scontrol', answer)}:"
            " pass a list as SLURM_JOB_NODELIST writes it"
        )
    return answer.stdout.split()


def requeue(job_id: int) -> None:
    """Ask Slurm to end the job's current run and queue the job again. Slurm then holds it back
    for a while (pending, reason `BeginTime`) before it can start again."""
    answer = run_tool(["scontrol", "requeue", str(job_id)])
    if answer.ok:
        return
    if says_invalid_job(answer):
        raise UserError(f"no Slurm job {job_id} to requeue: check the id (SLURM_JOB_ID in the job)")
    if "presently disabled" in answer.stderr:
        raise UserError(f"Slurm job {job_id} cannot be requeued: submit it with `--requeue`")
    raise UserError(f"Slurm did not requeue job {job_id}: {refusal('scontrol', answer)}")


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    value = env.get(name, "")
    if value == "" and default is not None:
        return default
    try:
        return int(value)
    except ValueError:
        raise UserError(
            f"{name}={value!r} is not a whole number: unset it or run inside the Slurm job that sets it"
        ) from None


def _optional_int(env: Mapping[str, str], name: str) -> int | None:
    return _int(env, name) if env.get(name) else None


def _array_task(env: Mapping[str, str]) -> ArrayTask | None:
    if not env.get("SLURM_ARRAY_JOB_ID"):
        return None
    return ArrayTask(
        array_job_id=_int(env, "SLURM_ARRAY_JOB_ID"),
        task_id=_int(env, "SLURM_ARRAY_TASK_ID"),
        task_count=_optional_int(env, "SLURM_ARRAY_TASK_COUNT"),
        task_min=_optional_int(env, "SLURM_ARRAY_TASK_MIN"),
        task_max=_optional_int(env, "SLURM_ARRAY_TASK_MAX"),
    )


def _gpus(env: Mapping[str, str]) -> tuple[str, ...]:
    # SLURM_JOB_GPUS names the node's GPU indices; CUDA_VISIBLE_DEVICES is what a site without
    # GPU accounting (or a user) sets by hand.
    listed = env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES") or ""
    return tuple(part.strip() for part in listed.split(",") if part.strip())
