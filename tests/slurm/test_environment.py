"""The job's view of its `SLURM_*` variables (a real job reads them in tests/slurm/test_jobs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.core.errors import UserError
from gpuwarden.slurm.environment import ArrayTask, SlurmJob, current_job

# What the batch shell of the first task of a two-node array job sees.
ARRAY_ENV = {
    "SLURM_JOB_ID": "1043",
    "SLURM_ARRAY_JOB_ID": "1040",
    "SLURM_ARRAY_TASK_ID": "3",
    "SLURM_ARRAY_TASK_COUNT": "4",
    "SLURM_ARRAY_TASK_MIN": "0",
    "SLURM_ARRAY_TASK_MAX": "3",
    "SLURM_RESTART_COUNT": "2",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "0",
    "SLURM_PROCID": "0",
    "SLURM_JOB_NODELIST": "gpu[01-02]",
    "SLURM_JOB_GPUS": "0,1",
    "CUDA_VISIBLE_DEVICES": "5",
    "SLURM_SUBMIT_DIR": "/home/me/exp",
}


def test_outside_a_job_there_is_none() -> None:
    assert current_job({"HOME": "/root", "CUDA_VISIBLE_DEVICES": "0"}) is None


def test_every_variable_is_read_into_its_field() -> None:
    assert current_job(ARRAY_ENV) == SlurmJob(
        job_id=1043,
        array=ArrayTask(array_job_id=1040, task_id=3, task_count=4, task_min=0, task_max=3),
        restart_count=2,
        num_nodes=2,
        node_id=0,
        proc_id=0,
        nodelist="gpu[01-02]",
        gpus=("0", "1"),
        submit_dir=Path("/home/me/exp"),
    )


def test_a_first_run_outside_an_array_has_its_defaults() -> None:
    # Slurm leaves SLURM_RESTART_COUNT unset until the first requeue.
    job = current_job({"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "2, 3"})
    assert job is not None
    assert (job.array, job.restart_count, job.num_nodes, job.node_id, job.proc_id) == (None, 0, 1, 0, 0)
    assert job.gpus == ("2", "3")
    assert job.submit_dir is None
    assert job.hostnames() == []


def test_a_variable_slurm_would_never_set_is_one_line() -> None:
    with pytest.raises(UserError) as caught:
        current_job({**ARRAY_ENV, "SLURM_RESTART_COUNT": "two"})
    assert caught.value.message == (
        "SLURM_RESTART_COUNT='two' is not a whole number: unset it or run inside the Slurm job that sets it"
    )
