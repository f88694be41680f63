"""`gpuwarden exec` as a cluster job runs it: real processes, a real out-of-memory failure, real
signals, no daemon. Each exec keeps its run's whole record in the run's folder; `--runs DIR`
reads it back."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpuwarden.client.run_folders import RunFolders
from gpuwarden.core.telemetry.nvml import open_gpu_reader
from gpuwarden.job import exit_codes
from gpuwarden.runners.train.stall_hook import STALL_ENV
from tests import preloaded
from tests.daemon.conftest import REPO, DaemonHandle, wait_for

# Holds at step 20 (right after its checkpoint) until signalled; a process resumed from that
# checkpoint goes on to step 40.
STALLED_TRAIN = f"""
name: stalled
kind: train
env: {{OMP_NUM_THREADS: "1", {STALL_ENV}: "0:20"}}
resources: {{gpus: 0}}
train:
  task: image
  batch_size: 4
  max_steps: 40
  log_interval: 10
  checkpoint_interval: 20
  image: {{base_channels: 8, num_blocks: 1, patch_size: 32, synthetic_samples: 64}}
"""


class Job:
    """`gpuwarden exec` processes in one environment (private XDG folders, two fake H100s)."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.runs = root / "runs"
        self.env = env
        self.started: list[preloaded.Captured] = []

    def start(self, *args: str, env: dict[str, str] | None = None) -> preloaded.Captured:
        proc = preloaded.popen_captured(
            [sys.executable, "-m", "gpuwarden", "exec", *args], env={**self.env, **(env or {})}, cwd=self.root
        )
        self.started.append(proc)
        return proc

    def stop_all(self) -> None:
        """Kill what the test started and left running (a test that failed midway): the execs,
        and the attempts' process groups their stores name (each runs in a session of its own)."""
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=30)
        kill_recorded_groups(self.root)

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        proc = self.start(*args)
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode is not None
        return subprocess.CompletedProcess(list(args), proc.returncode, out, err)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return preloaded.run(
            [sys.executable, "-m", "gpuwarden", *args], env=self.env, cwd=self.root, timeout=60
        )

    def show(self, ref: str) -> dict[str, Any]:
        shown = self.cli("show", "--runs", str(self.runs), ref, "--json")
        assert shown.returncode == 0, shown.stderr
        detail: dict[str, Any] = json.loads(shown.stdout)
        return detail

    def folders(self) -> list[Path]:
        return sorted(p for p in self.runs.iterdir() if p.is_dir()) if self.runs.exists() else []

    def spec(self, name: str, text: str) -> Path:
        path = self.root / f"{name}.yaml"
        path.write_text(textwrap.dedent(text))
        return path


@pytest.fixture
def job(daemon_factory: Any) -> Iterator[Job]:
    handle: DaemonHandle = daemon_factory(start=False)
    started = Job(handle.root, handle.env)
    yield started
    started.stop_all()


def kill_recorded_groups(root: Path) -> None:
    """SIGKILL the process group of every attempt a run store under `root` records."""
    for store in root.rglob("run.db"):
        try:
            with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as conn:
                pids = [row[0] for row in conn.execute("SELECT pid FROM attempts WHERE pid IS NOT NULL")]
        except sqlite3.Error:
            continue
        for pid in pids:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)


def _events(job: Job, run_id: str, kind: str, folder: Path | None = None) -> list[dict[str, Any]]:
    reader = RunFolders.one(folder) if folder is not None else RunFolders(job.runs)
    page = reader.events(run_id, limit=10_000)
    return [e.model_dump() for e in page.events if e.type == kind]


def _only_run(job: Job) -> str:
    """The id of the one run under the job's runs folder, once its record can be read."""
    runs = wait_for(lambda: RunFolders(job.runs).runs() if job.runs.exists() else [], "the run's record")
    assert len(runs) == 1, runs
    return runs[0].id


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_real_out_of_memory_is_retuned_inside_the_job(job: Job) -> None:
    spec = REPO / "configs" / "examples" / "oom-recovery-cpu.yaml"
    done = job.run(str(spec), "--runs", str(job.runs), timeout=500)
    assert done.returncode == exit_codes.SUCCEEDED, done.stderr[-3000:]
    assert "host_oom" in done.stderr and "retuned" in done.stderr
    # The retune's probes are said as they run, as `run --follow` says them.
    assert "probe: probe 2 of 2: micro-batch 16 × 2 starting" in done.stderr
    assert "probe: probe 2 of 2: micro-batch 16 → peak " in done.stderr
    (folder,) = job.folders()
    detail = job.show(folder.name)
    assert detail["state"] == "succeeded" and detail["effective_batch"] == 32
    (retune,) = detail["retunes"]
    assert retune["to"] == {"train.batch_size": 16, "train.grad_accum_steps": 2}
    assert [a["classification"] for a in detail["attempts"]] == ["oom", "succeeded"]
    # The record is the run folder's own, written with a journal that is safe on NFS.
    with sqlite3.connect(folder / "run.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert not (job.root / "state" / "gpuwarden" / "gpuwarden.db").exists()


@pytest.mark.slow
def test_a_signal_stops_at_a_checkpoint_and_the_next_exec_goes_on_from_it(job: Job) -> None:
    spec = job.spec("stalled", STALLED_TRAIN)
    first = job.start(str(spec), "--runs", str(job.runs))
    run_id = _only_run(job)
    wait_for(lambda: _events(job, run_id, "checkpoint"), "the checkpoint at step 20", timeout=120)
    first.send_signal(signal.SIGUSR1)  # what Slurm sends before the time limit
    _, err = first.communicate(timeout=120)
    assert first.returncode == exit_codes.RESTART, err[-3000:]
    assert "stopped at a checkpoint (SIGUSR1): exit 75" in err
    assert job.show(run_id)["state"] == "stopped"

    again = job.run("--run", str(job.runs / run_id))
    assert again.returncode == exit_codes.SUCCEEDED, again.stderr[-3000:]
    assert "#1 [-] state: queued" not in again.stderr  # what the first exec printed is not printed again
    detail = job.show(run_id)
    assert detail["state"] == "succeeded"
    steps = {n: [e["step"] for e in _events(job, run_id, "progress") if e["attempt"] == n] for n in (1, 2)}
    assert steps[1][-1] == 20
    assert steps[2][0] > 20 and steps[2][-1] == 40  # no step done twice
    started = [e for e in _events(job, run_id, "started") if e["attempt"] == 2]
    assert started and started[0]["resumed_from"]


@pytest.mark.slow
def test_an_exec_killed_with_its_job_leaves_a_folder_that_reads_and_goes_on(job: Job) -> None:
    spec = job.spec("stalled", STALLED_TRAIN)
    first = job.start(str(spec), "--runs", str(job.runs))
    run_id = _only_run(job)
    wait_for(lambda: _events(job, run_id, "checkpoint"), "the checkpoint at step 20", timeout=120)
    # A job's end kills every process in it at once, the exec's included: no one records anything.
    tree = [psutil.Process(first.pid), *psutil.Process(first.pid).children(recursive=True)]
    for proc in tree:
        proc.kill()
    first.communicate(timeout=30)
    psutil.wait_procs(tree, timeout=30)

    # Its record last said running; no exec holds the folder any more: it reads as interrupted.
    shown = job.show(run_id)
    assert shown["state"] == "interrupted", shown["message"]
    assert shown["message"].startswith("its gpuwarden exec is gone (was running)")
    listed = job.cli("ps", "--runs", str(job.runs))
    assert run_id in listed.stdout and "interrupted" in listed.stdout

    again = job.run("--run", str(job.runs / run_id))
    assert again.returncode == exit_codes.SUCCEEDED, again.stderr[-3000:]
    detail = job.show(run_id)
    assert [a["classification"] for a in detail["attempts"]] == ["interrupted", "succeeded"]
    steps = [e["step"] for e in _events(job, run_id, "progress") if e["attempt"] == 2]
    assert steps[0] > 20 and steps[-1] == 40


def test_execs_and_a_daemon_side_by_side_never_share_a_store(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory()
    job = Job(gw.root, gw.env)
    try:
        _side_by_side(gw, job)
    finally:
        job.stop_all()


def _side_by_side(gw: DaemonHandle, job: Job) -> None:
    code = "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES'))"
    procs = [
        job.start("--runs", str(job.runs), "--gpus", "1", "--", sys.executable, "-c", code) for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    folders = job.folders()
    assert len(folders) == 2
    for folder in folders:
        with sqlite3.connect(f"file:{folder / 'run.db'}?mode=ro", uri=True) as conn:
            assert [r[0] for r in conn.execute("SELECT id FROM runs")] == [folder.name]
    with gw.client() as client:
        assert client.runs() == []  # the daemon's store holds none of them

    # A second exec on a run folder another one holds is refused in one line, touching nothing.
    go = gw.root / "go"
    waits = f"import pathlib, time\nwhile not pathlib.Path({str(go)!r}).exists(): time.sleep(0.05)"
    holder = job.start("--runs", str(gw.root / "held"), "--", sys.executable, "-c", waits)
    try:
        held = wait_for(
            lambda: RunFolders(gw.root / "held").runs() if (gw.root / "held").exists() else [], "it"
        )
        refused = job.run("--run", str(gw.root / "held" / held[0].id))
        assert refused.returncode == exit_codes.REFUSED
        assert (
            refused.stderr.count("\n") == 1 and "another gpuwarden exec supervises this run" in refused.stderr
        )
    finally:
        go.touch()
        holder.communicate(timeout=60)
    assert holder.returncode == 0


def test_a_job_places_its_run_on_the_gpus_it_was_given(job: Job) -> None:
    code = "import os; print('visible', os.environ['CUDA_VISIBLE_DEVICES'])"
    given = {"CUDA_VISIBLE_DEVICES": "1"}
    proc = job.start("--runs", str(job.runs), "--gpus", "1", "--", sys.executable, "-c", code, env=given)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    detail = job.show(_only_run(job))
    (attempt,) = detail["attempts"]
    reader = open_gpu_reader("h100x2")
    try:
        second = next(g.uuid for g in reader.gpus() if g.index == 1)
    finally:
        reader.close()
    assert attempt["gpus"] == [second]  # the card the job was given, never the node's first
    assert f"visible {second}" in out


def test_bad_invocations_are_one_line(job: Job, tmp_path: Path) -> None:
    for args, words in (
        ((), "give a spec"),
        (("--run", str(tmp_path)), "no run there"),
        (("--run", str(tmp_path), "--runs", str(tmp_path)), "give one"),
        (("nope.yaml",), "no such file"),
    ):
        done = job.run(*args, timeout=60)
        assert done.returncode == exit_codes.REFUSED, (args, done.stderr)
        assert done.stderr.count("\n") == 1 and words in done.stderr, (args, done.stderr)
    assert not job.runs.exists() or job.folders() == []


@pytest.mark.slow
def test_the_same_command_starts_the_run_in_its_folder_then_takes_it_up(job: Job) -> None:
    """What an engine does: it starts the same command again after exit 75, so `--run DIR` with a
    spec starts the run there the first time and goes on with it every time after."""
    spec = job.spec("stalled", STALLED_TRAIN)
    folder = job.root / "my-run"
    first = job.start(str(spec), "--run", str(folder))
    wait_for(lambda: _id(folder) and _events(job, _id(folder), "checkpoint", folder), "the checkpoint")
    first.send_signal(signal.SIGTERM)  # a preemption
    first.communicate(timeout=120)
    assert first.returncode == exit_codes.RESTART
    again = job.run(str(spec), "--run", str(folder))
    assert again.returncode == exit_codes.SUCCEEDED, again.stderr[-3000:]
    detail = json.loads(job.cli("show", "--runs", str(job.root), _id(folder), "--json").stdout)
    assert detail["state"] == "succeeded" and len(detail["attempts"]) == 2
    assert detail["run_dir"] == str(folder)


def _id(folder: Path) -> str:
    """The id of the run in `folder` ("" before its record can be read)."""
    runs = RunFolders.one(folder).runs() if (folder / "run.db").exists() else []
    return runs[0].id if runs else ""
