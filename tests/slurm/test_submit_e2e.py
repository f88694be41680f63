"""`gpuwarden slurm submit` against the real Slurm: a real out-of-memory failure retuned inside
the job, a time limit and a preemption that checkpoint, requeue and go on with no step done
twice. The jobs run `gpuwarden exec` in the test's environment (sbatch exports it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from gpuwarden.client.run_folders import RunFolders
from gpuwarden.slurm.record import read_record
from gpuwarden.slurm.scheduler import JobState, cancel, release_begin_time, state
from tests.daemon.conftest import REPO, wait_for
from tests.job.test_exec import STALLED_TRAIN, kill_recorded_groups
from tests.slurm.conftest import Slurm

PINNED = {"OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2"}  # as the OOM example pins them


class Submitter:
    """`gpuwarden slurm submit` and the run commands in one private environment."""

    def __init__(self, root: Path, slurm: Slurm) -> None:
        self.root = root
        self.runs = root / "runs"
        self.slurm = slurm
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("GPUWARDEN_", "XDG_", "SLURM_"))},
            "XDG_CONFIG_HOME": str(root / "config"),
            "XDG_STATE_HOME": str(root / "state"),
            "PYTHONPATH": str(REPO),
        }

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpuwarden", *args],
            env=self.env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def submit(self, *args: str) -> tuple[str, int]:
        done = self.cli("slurm", "submit", "--runs", str(self.runs), "--json", *args)
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        self.slurm.submitted.append(answer["job_id"])
        return answer["run_id"], answer["job_id"]

    def show(self, run_id: str) -> dict[str, Any]:
        shown = self.cli("show", "--runs", str(self.runs), run_id, "--json")
        assert shown.returncode == 0, shown.stderr
        detail: dict[str, Any] = json.loads(shown.stdout)
        return detail

    def events(self, run_id: str, kind: str) -> list[dict[str, Any]]:
        reader = RunFolders.one(self.runs / run_id)
        if not (self.runs / run_id / "run.db").exists() or not reader.runs():
            return []  # the job has not started it yet
        page = reader.events(run_id, limit=10_000)
        return [e.model_dump() for e in page.events if e.type == kind]

    def log(self, job_id: int, run_id: str) -> str:
        return (self.runs / run_id / f"slurm-{job_id}.out").read_text()


@pytest.fixture
def gw(slurm: Slurm, tmp_path: Path) -> Iterator[Submitter]:
    submitter = Submitter(tmp_path, slurm)
    yield submitter
    # A job cancelled mid-run under proctrack/linuxproc can leave its attempt's session behind.
    for job_id, now in state(slurm.submitted).items():
        if not now.ended:
            cancel(job_id)
    kill_recorded_groups(tmp_path)


def _requeued(now: JobState) -> bool:
    return now.state == "PENDING" and now.reason == "BeginTime"


def _go_on_after_requeue(gw: Submitter, job_id: int, run_id: str, minutes: int | None = None) -> None:
    """Slurm holds a requeued job back a while (BeginTime): let it start now (with a time limit of
    `minutes`, so its own warning cannot come before a loaded machine ends it), then see it end."""
    gw.slurm.wait(job_id, _requeued, "the job to be requeued", timeout=180)
    if minutes is not None:
        limit = ["scontrol", "update", f"JobId={job_id}", f"TimeLimit={minutes}"]
        assert subprocess.run(limit, capture_output=True, timeout=30).returncode == 0
    release_begin_time(job_id)
    ended = gw.slurm.wait_ended(job_id, timeout=300)
    assert ended.state == "COMPLETED", (ended, gw.log(job_id, run_id)[-3000:])


def _steps(gw: Submitter, run_id: str) -> dict[int, list[int]]:
    steps: dict[int, list[int]] = {}
    for event in gw.events(run_id, "progress"):
        steps.setdefault(int(event["attempt"]), []).append(int(event["step"]))
    return steps


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_out_of_memory_is_retuned_inside_the_job_and_matches_an_uninterrupted_run(
    gw: Submitter, tmp_path: Path
) -> None:
    spec = REPO / "configs" / "examples" / "oom-recovery-cpu.yaml"
    run_id, job_id = gw.submit(str(spec), "--time", "15")
    ended = gw.slurm.wait_ended(job_id, timeout=600)
    assert ended.state == "COMPLETED", gw.log(job_id, run_id)[-3000:]
    detail = gw.show(run_id)
    assert detail["state"] == "succeeded" and detail["effective_batch"] == 32
    (retune,) = detail["retunes"]
    assert retune["from"] == {"train.batch_size": 32, "train.grad_accum_steps": 1}
    assert retune["to"] == {"train.batch_size": 16, "train.grad_accum_steps": 2}
    # Inside the allocation: one job start, no requeue.
    (job,) = gw.events(run_id, "job")
    assert job["slurm_job_id"] == str(job_id) and "slurm_restart_count" not in job

    reference = tmp_path / "reference.yaml"
    reference.write_text(
        spec.read_text()
        .replace("batch_size: 32", "batch_size: 16")
        .replace("grad_accum_steps: 1 ", "grad_accum_steps: 2 ")
        .replace("memory_limit: 1.4GiB", "memory_limit: 4GiB")
    )
    ref_dir = tmp_path / "reference-run"
    done = subprocess.run(
        [sys.executable, "-m", "gpuwarden.runners", "--spec", str(reference), "--run-dir", str(ref_dir)],
        env={**os.environ, **PINNED},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    recovered = torch.load(gw.runs / run_id / "outputs" / "model" / "model.pt", weights_only=True)
    expected = torch.load(ref_dir / "outputs" / "model" / "model.pt", weights_only=True)
    for name, tensor in expected.items():
        torch.testing.assert_close(recovered[name], tensor, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_time_limit_checkpoints_requeues_and_goes_on_with_no_step_redone(gw: Submitter) -> None:
    spec = gw.root / "stalled.yaml"
    spec.write_text(STALLED_TRAIN)
    # The warning comes 15–45 s into a 2-minute job (Slurm checks time limits every 30 s).
    run_id, job_id = gw.submit(str(spec), "--time", "2:00", "--signal-lead", "75")
    _go_on_after_requeue(gw, job_id, run_id, minutes=10)
    detail = gw.show(run_id)
    assert detail["state"] == "succeeded", detail["message"]
    assert [a["classification"] for a in detail["attempts"]] == ["stopped", "succeeded"]
    starts = gw.events(run_id, "job")
    assert [e.get("slurm_restart_count") for e in starts] == [None, "1"]
    assert {e["slurm_job_id"] for e in starts} == {str(job_id)}
    steps = _steps(gw, run_id)
    assert steps[2][0] > steps[1][-1] and steps[2][-1] == 40  # no step done twice
    log = gw.log(job_id, run_id)
    assert (
        "stopped at a checkpoint (SIGUSR1): exit 75" in log
        and f"Slurm job {job_id} requeued (1 of 10)" in log
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_preemption_checkpoints_and_the_requeued_job_goes_on(gw: Submitter) -> None:
    spec = gw.root / "stalled.yaml"
    spec.write_text(STALLED_TRAIN)
    run_id, job_id = gw.submit(str(spec), "--time", "20")
    wait_for(lambda: gw.events(run_id, "checkpoint"), "the checkpoint at step 20", timeout=180)
    preempted = subprocess.run(
        ["scontrol", "requeue", str(job_id)], capture_output=True, text=True, timeout=30
    )
    assert preempted.returncode == 0, preempted.stderr
    _go_on_after_requeue(gw, job_id, run_id)
    detail = gw.show(run_id)
    assert detail["state"] == "succeeded", detail["message"]
    steps = _steps(gw, run_id)
    assert steps[1][-1] == 20 and steps[2][0] > 20 and steps[2][-1] == 40
    record = read_record(gw.runs / run_id)
    assert record is not None and record.job_id == job_id


def test_ps_shows_the_job_and_cancel_ends_it(gw: Submitter) -> None:
    spec = gw.root / "stalled.yaml"
    spec.write_text(STALLED_TRAIN)
    run_id, job_id = gw.submit(str(spec), "--time", "20", "--", "--begin=now+3600")  # held: never starts
    listed = gw.cli("ps", "--runs", str(gw.runs))
    assert listed.returncode == 0, listed.stderr
    (line,) = [row for row in listed.stdout.splitlines() if row.startswith(run_id)]
    assert f"{job_id} PENDING (BeginTime)" in line and "waiting for its Slurm job to start" in line
    script = (gw.runs / run_id / "job.sbatch").read_text()
    assert "#SBATCH --requeue" in script and "#SBATCH --begin=now+3600" in script
    assert f"exec {sys.executable} -m gpuwarden exec" in script and "--slurm-requeue 10" in script
    cancelled = gw.cli("slurm", "cancel", "--runs", str(gw.runs), run_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert gw.slurm.wait_ended(job_id).state == "CANCELLED"
    refused = gw.cli("slurm", "cancel", "--runs", str(gw.runs), "rnothere")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    before = sorted(gw.runs.iterdir())
    several = gw.cli("slurm", "submit", "--runs", str(gw.runs), str(spec), "--", "--nodes=2")
    assert several.returncode == 2 and "give gpuwarden's own --nodes N" in several.stderr
    assert sorted(gw.runs.iterdir()) == before  # nothing submitted, no folder left


@pytest.mark.slow
def test_a_job_cancelled_while_it_runs_stays_cancelled(gw: Submitter) -> None:
    """scancel sends SIGTERM, as a preemption does: the run stops at a checkpoint, and the job
    must not queue itself again (only the time limit's warning asks for that)."""
    spec = gw.root / "stalled.yaml"
    spec.write_text(STALLED_TRAIN)
    run_id, job_id = gw.submit(str(spec), "--time", "20")
    wait_for(lambda: gw.events(run_id, "checkpoint"), "the checkpoint at step 20", timeout=180)
    cancelled = gw.cli("slurm", "cancel", "--runs", str(gw.runs), run_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert gw.slurm.wait_ended(job_id, timeout=120).state == "CANCELLED"
    # Stopped at its checkpoint, or (this stalled runner ignores SIGTERM) killed with its job
    # after Slurm's KillWait: either way no longer running, and not queued again.
    wait_for(lambda: gw.show(run_id)["state"] in ("stopped", "interrupted"), "the run to end")
    assert "requeued" not in gw.log(job_id, run_id)
