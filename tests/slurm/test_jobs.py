"""Scripts from `sbatch_script`, submitted to a real Slurm (`.ci/slurm-up`) and watched there."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from gpuwarden.core.errors import UserError
from gpuwarden.slurm.environment import requeue
from gpuwarden.slurm.sbatch import SbatchOptions
from gpuwarden.slurm.scheduler import FORGOTTEN, JobState, cancel, release_begin_time, state
from tests.slurm.conftest import Slurm

# Slurm numbers jobs upwards from 1 and wraps only past MaxJobId (67 043 328 by default).
UNKNOWN_JOB = 67_000_000

REPORT = """
import json, os
from gpuwarden.slurm.environment import current_job
job = current_job()
print(json.dumps({"job_id": job.job_id, "name": os.environ["SLURM_JOB_NAME"],
                  "hosts": job.hostnames(), "node": os.environ["SLURMD_NODENAME"],
                  "restarts": job.restart_count, "nodes": job.num_nodes, "submit_dir": str(job.submit_dir)}))
"""

REQUEUE_ONCE = """
import os, sys
from gpuwarden.slurm.environment import current_job, requeue
job = current_job()
print(f"run {job.restart_count}: SLURM_RESTART_COUNT={os.environ.get('SLURM_RESTART_COUNT')}", flush=True)
if job.restart_count == 0:
    requeue(job.job_id)
    sys.exit(75)
print("finished", flush=True)
"""

SLEEP = "import time; print('started', flush=True); time.sleep(600)"

WAIT_FOR_USR1 = """
import os, signal, sys, time
start = time.monotonic()
def stop(signum, frame):
    print(f"USR1 after {time.monotonic() - start:.0f} s in task {os.environ.get('SLURM_PROCID')}"
          f" of step {os.environ.get('SLURM_STEP_ID', 'batch')}", flush=True)
    sys.exit(0)
signal.signal(signal.SIGUSR1, stop)
print("waiting for USR1", flush=True)
time.sleep(300)
print("no USR1", flush=True)
sys.exit(1)
"""


def _python(slurm: Slurm, name: str, code: str, options: SbatchOptions | None = None) -> int:
    """Submit a job that runs `code` in this Python, its output in the module's folder."""
    with_output = replace(options or SbatchOptions(), output=str(slurm.output(name)))
    return slurm.submit(slurm.script(name, with_output, [sys.executable, "-c", code]))


def _running(now: JobState) -> bool:
    return now.state == "RUNNING"


def test_a_built_script_runs_its_command_which_sees_its_job(slurm: Slurm) -> None:
    # An option given after `--` comes later in the script, so it wins; its value, a token of its
    # own, reaches Slurm whole, space included.
    options = SbatchOptions(job_name="gpuwarden report", extra=("-J", "named after --"))
    job_id = _python(slurm, "report", REPORT, options)
    assert slurm.wait_ended(job_id) == JobState("COMPLETED", "None")
    seen = json.loads(slurm.output("report").read_text())
    assert seen == {
        "job_id": job_id,
        "name": "named after --",
        "hosts": [seen["node"]],
        "node": seen["node"],
        "restarts": 0,
        "nodes": 1,
        "submit_dir": str(Path.cwd()),
    }


def test_a_job_requeues_itself_once_and_appends_its_second_run(slurm: Slurm) -> None:
    job_id = _python(slurm, "requeue", REQUEUE_ONCE, SbatchOptions(requeue=True, open_mode_append=True))
    # Slurm holds a requeued job back before it may start again.
    slurm.wait(job_id, lambda now: now == JobState("PENDING", "BeginTime"), "the requeue's hold")
    release_begin_time(job_id)
    assert slurm.wait_ended(job_id) == JobState("COMPLETED", "None")
    lines = slurm.output("requeue").read_text().splitlines()
    # Slurm's own notice comes only when it stops the job before the job has exited by itself,
    # a race the machine's load decides.
    notices = [line for line in lines if "DUE TO JOB REQUEUE" in line]
    assert all(f"JOB {job_id} ON" in line for line in notices) and len(notices) <= 1, lines
    runs = [line for line in lines if line not in notices]
    assert runs == ["run 0: SLURM_RESTART_COUNT=None", "run 1: SLURM_RESTART_COUNT=1", "finished"], lines


def test_cancel_ends_a_running_job_and_an_ended_one_is_left_alone(slurm: Slurm) -> None:
    job_id = _python(slurm, "sleeper", SLEEP, SbatchOptions(extra=("--no-requeue",)))
    slurm.wait(job_id, _running, "it to run")
    with pytest.raises(
        UserError, match=rf"^Slurm job {job_id} cannot be requeued: submit it with `--requeue`$"
    ):
        requeue(job_id)
    cancel(job_id)
    assert slurm.wait_ended(job_id).state == "CANCELLED"
    cancel(job_id)
    with pytest.raises(UserError, match=rf"^no Slurm job {UNKNOWN_JOB} to cancel: check the id with squeue$"):
        cancel(UNKNOWN_JOB)


def test_state_of_pending_running_ended_and_forgotten_jobs(slurm: Slurm) -> None:
    held = _python(slurm, "held", "print('released')", SbatchOptions(extra=("--begin=now+1hour",)))
    running = _python(slurm, "running", SLEEP)
    quick = _python(slurm, "quick", "print('quick')")
    slurm.wait(running, _running, "it to run")
    slurm.wait_ended(quick)
    now = state([held, running, quick, UNKNOWN_JOB])
    assert now[held].state == "PENDING" and not now[held].ended
    assert now[running] == JobState("RUNNING", "None") and not now[running].ended
    assert now[quick] == JobState("COMPLETED", "None") and now[quick].ended
    assert now[UNKNOWN_JOB] == JobState("UNKNOWN", FORGOTTEN) and now[UNKNOWN_JOB].ended
    assert state([]) == {}
    cancel(running)
    release_begin_time(held)
    assert slurm.wait_ended(held) == JobState("COMPLETED", "None")
    assert slurm.output("held").read_text() == "released\n"
    with pytest.raises(UserError, match=rf"^Slurm job {held} is not pending, so its start cannot be brought"):
        release_begin_time(held)


def test_slurm_refusing_an_option_is_one_line_naming_it(slurm: Slurm) -> None:
    script = slurm.script("bogus", SbatchOptions(extra=("--bogus=3",)), ["true"])
    with pytest.raises(UserError) as caught:
        slurm.submit(script)
    assert caught.value.message == (
        f"sbatch refused {script}: unrecognized option '--bogus=3': fix that option"
        " (`sbatch --help` lists them) or the script's line that sets it"
    )
    script = slurm.script("nowhere", SbatchOptions(partition="nowhere"), ["true"])
    with pytest.raises(
        UserError, match=r"^sbatch refused .*: invalid partition specified: nowhere; Batch job"
    ):
        slurm.submit(script)


def test_unknown_ids_are_one_line(slurm: Slurm) -> None:
    with pytest.raises(
        UserError, match=rf"^no Slurm job {UNKNOWN_JOB} to release: check the id with squeue$"
    ):
        release_begin_time(UNKNOWN_JOB)
    with pytest.raises(UserError, match=rf"^no Slurm job {UNKNOWN_JOB} to requeue: check the id"):
        requeue(UNKNOWN_JOB)


@pytest.mark.slow
def test_the_time_limit_warning_reaches_the_command_alone_and_under_srun(slurm: Slurm) -> None:
    # Slurm checks time limits every 30 s and sends the warning at the first check less than
    # lead + 30 s before the limit: with 2 minutes and a 75 s lead that is 15 to 45 s after the
    # start, late enough for the command to have set its handler (with --time=1 it can come
    # before Python has started, and its default action kills).
    warned = SbatchOptions(time=timedelta(minutes=2), signal_lead_s=75)
    alone = _python(slurm, "usr1", WAIT_FOR_USR1, warned)
    # The script for several nodes, run on this one-node cluster: srun is what it tests.
    multi = slurm.script(
        "usr1-srun",
        replace(warned, output=str(slurm.output("usr1-srun")), nodes=2),
        [sys.executable, "-c", WAIT_FOR_USR1],
    )
    text = multi.read_text()
    assert "\n#SBATCH --nodes=2\n" in text and "exec srun " in text
    multi.write_text(text.replace("\n#SBATCH --nodes=2\n", "\n#SBATCH --nodes=1\n"))
    under_srun = slurm.submit(multi)
    assert slurm.wait_ended(alone, timeout=150) == JobState("COMPLETED", "None")
    assert slurm.wait_ended(under_srun, timeout=150) == JobState("COMPLETED", "None")
    alone_said = slurm.output("usr1").read_text().splitlines()
    assert alone_said[0] == "waiting for USR1"
    assert alone_said[1].startswith("USR1 after ") and alone_said[1].endswith(" in task 0 of step batch")
    srun_said = slurm.output("usr1-srun").read_text().splitlines()
    assert srun_said[0] == "waiting for USR1"
    assert any(line.startswith("USR1 after ") and line.endswith("in task 0 of step 0") for line in srun_said)
