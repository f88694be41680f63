"""The Ray example (examples/clusters/ray_job.py) against a real Ray head on this machine: its
loop submits `gpuwarden exec SPEC --run DIR` through the Jobs API, and submits it again after the
driver exits 75, until the run is done."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import psutil
import pytest

from gpuwarden.client.run_folders import RunFolders
from gpuwarden.job import exit_codes
from tests.daemon.conftest import REPO, DaemonHandle, wait_for
from tests.job.test_exec import STALLED_TRAIN, Job

NEEDS_RAY = "needs Ray with its job server: pip install -c constraints.txt -e '.[ray]'"
job_submission = pytest.importorskip("ray.job_submission", reason=NEEDS_RAY)
# Without its `default` extra (which brings aiohttp) Ray imports, but has no job server or client.
pytest.importorskip("aiohttp", reason=NEEDS_RAY)

T = TypeVar("T")
EXAMPLE = REPO / "examples" / "clusters" / "ray_job.py"
# What the test's gpuwarden reads (private XDG folders, fake GPUs, the repository): a cluster's
# nodes would have their own, so it travels with each job, as a user's --env would.
CARRIED = ("XDG_", "GPUWARDEN_", "PYTHONPATH")


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ray_job_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ray_job = _example()


class RayHead:
    """A `ray start --head --block` process of this test's own, with its dashboard's job server."""

    def __init__(self, temp_dir: Path) -> None:
        self.temp_dir = temp_dir
        self.log = temp_dir / "head.log"
        dashboard, client_server, agent = _free_ports(3)
        self.address = f"http://127.0.0.1:{dashboard}"
        self.argv = [
            str(Path(sys.executable).with_name("ray")),
            *("start", "--head", "--block", "--disable-usage-stats", "--temp-dir", str(temp_dir)),
            # Few resources: one CPU for the job's driver, the smallest object store Ray takes.
            *("--num-cpus", "1", "--num-gpus", "0", "--object-store-memory", str(80 * 2**20)),
            # Ports of its own (0: any free one), so it sits beside any other Ray on the machine.
            *("--port", "0", "--ray-client-server-port", str(client_server)),
            *("--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard)),
            *("--dashboard-agent-listen-port", str(agent)),
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith((*CARRIED, "RAY_"))}
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env={**env, "RAY_USAGE_STATS_ENABLED": "0"},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        # Ready once it runs a job: its job server answers before its node's agent can take one.
        first = wait_for(self._takes_a_job, "the Ray head's job server", timeout=180)
        client = job_submission.JobSubmissionClient(self.address)
        done = wait_for(lambda: _ended(client, first), "the Ray head's first job", timeout=120)
        assert done.status == job_submission.JobStatus.SUCCEEDED, done.message

    def _takes_a_job(self) -> str:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"ray start exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
        try:
            submitted: str = job_submission.JobSubmissionClient(self.address).submit_job(entrypoint="true")
            return submitted
        except (OSError, RuntimeError):  # not listening yet (ConnectionError), or no agent yet
            return ""

    def stop(self) -> None:
        """SIGTERM to `ray start --block` ends every process it started; any left (and what the
        jobs started) are killed by pid, from the tree listed before."""
        if self.proc is None or self.proc.poll() is not None:
            return
        head = psutil.Process(self.proc.pid)
        tree = [head, *head.children(recursive=True)]
        head.terminate()
        _, alive = psutil.wait_procs(tree, timeout=60)
        for proc in alive:
            proc.kill()
        psutil.wait_procs(alive, timeout=30)
        self.proc.wait(timeout=30)

    def jobs(self, entrypoint: str) -> list[Any]:
        """This head's jobs of `entrypoint`, oldest first."""
        client = job_submission.JobSubmissionClient(self.address)
        found = [j for j in client.list_jobs() if j.entrypoint == entrypoint]
        return sorted(found, key=lambda j: j.start_time or 0)

    def logs(self, jobs: list[Any]) -> str:
        """The end of each job's output, for a failure's message."""
        client = job_submission.JobSubmissionClient(self.address)
        return "".join(
            f"\n--- {j.submission_id}:\n{client.get_job_logs(j.submission_id)[-3000:]}" for j in jobs
        )


def _ended(client: Any, job_id: str) -> Any:
    """The job's details once it has ended, else None."""
    details = client.get_job_info(job_id)
    return details if details.status.is_terminal() else None


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.fixture(scope="module")
def ray_head() -> Iterator[RayHead]:
    # Short: Ray's Unix sockets live under it, and a socket's path is limited to 107 bytes.
    head = RayHead(Path(tempfile.mkdtemp(prefix="ray", dir="/tmp")))
    try:
        head.start()
        yield head
    finally:
        head.stop()
        shutil.rmtree(head.temp_dir, ignore_errors=True)


@pytest.fixture
def job(daemon_factory: Any) -> Job:
    handle: DaemonHandle = daemon_factory(start=False)
    return Job(handle.root, handle.env)


def _run_id(folder: Path) -> str:
    """The id of the run in `folder` ("" before its record can be read)."""
    runs = RunFolders.one(folder).runs() if (folder / "run.db").exists() else []
    return runs[0].id if runs else ""


def _unless_ended(loop: subprocess.Popen[str], condition: Callable[[], T]) -> Callable[[], T]:
    """`condition`, failing at once with the loop's output if the loop has ended."""

    def check() -> T:
        if loop.poll() is not None:
            out, err = loop.communicate()
            raise AssertionError(f"the loop ended first, exit {loop.returncode}:\n{out}{err}")
        return condition()

    return check


def _events(folder: Path, run_id: str, kind: str) -> list[dict[str, Any]]:
    page = RunFolders.one(folder).events(run_id, limit=10_000)
    return [e.model_dump() for e in page.events if e.type == kind]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_job_stopped_at_a_checkpoint_is_submitted_again_and_the_run_goes_on(
    ray_head: RayHead, job: Job
) -> None:
    spec = job.spec("stalled", STALLED_TRAIN)
    folder = job.runs / "stalled"
    gpuwarden = f"{sys.executable} -m gpuwarden"
    carried = [f"--env={k}={v}" for k, v in job.env.items() if k.startswith(CARRIED)]
    argv = [sys.executable, str(EXAMPLE), "--address", ray_head.address, "--run", str(folder), str(spec)]
    loop = subprocess.Popen(
        [*argv, "--max-starts", "3", "--gpuwarden", gpuwarden, *carried],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        run_id = wait_for(_unless_ended(loop, lambda: _run_id(folder)), "the run's record", timeout=180)
        checkpoint = _unless_ended(loop, lambda: _events(folder, run_id, "checkpoint"))
        wait_for(checkpoint, "the checkpoint at step 20", timeout=180)
        # What a preemption notice sends: the exec stops the run at its checkpoint and exits 75.
        os.kill(int((folder / "exec.pid").read_text().split()[0]), signal.SIGUSR1)
        out, err = loop.communicate(timeout=400)
    finally:
        if loop.poll() is None:
            loop.kill()
            loop.communicate()
    jobs = ray_head.jobs(ray_job.exec_entrypoint(str(spec), str(folder), gpuwarden))
    assert loop.returncode == 0, out + err + ray_head.logs(jobs)
    assert len([line for line in out.splitlines() if line.startswith("start ")]) == 2, out
    assert "stopped at a checkpoint (exit 75)" in out
    assert [(j.status, j.driver_exit_code) for j in jobs] == [
        (job_submission.JobStatus.FAILED, exit_codes.RESTART),
        (job_submission.JobStatus.SUCCEEDED, 0),
    ]
    shown = job.cli("show", "--runs", str(job.runs), run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    detail = json.loads(shown.stdout)
    assert detail["state"] == "succeeded" and len(detail["attempts"]) == 2
    steps = {n: [e["step"] for e in _events(folder, run_id, "progress") if e["attempt"] == n] for n in (1, 2)}
    assert steps[1][-1] == 20
    assert steps[2][0] > 20 and steps[2][-1] == 40  # no step done twice


def test_the_loop_stops_at_its_bound_and_on_any_other_end(
    ray_head: RayHead, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    client = job_submission.JobSubmissionClient(ray_head.address)
    always_stopped = f"echo {tmp_path.name}; exit 75"
    code = ray_job.run_to_the_end(client, always_stopped, max_starts=2, poll_s=0.1)
    assert code == exit_codes.RESTART and len(ray_head.jobs(always_stopped)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stopped at a checkpoint 2 times: run this again" in err

    refused = f"echo {tmp_path.name}; exit 2"
    code = ray_job.run_to_the_end(client, refused, max_starts=3, poll_s=0.1)
    assert code == exit_codes.REFUSED and len(ray_head.jobs(refused)) == 1  # never submitted again
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "gpuwarden exec exited 2 (refused, nothing ran)" in err


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--run", "runs/x", "/specs/x.yaml"], "give them absolute"),
        (["--run", "/runs/x", "/specs/x.yaml", "--env", "NOPE"], "give KEY=VALUE"),
        (["--run", "/runs/x", "/specs/x.yaml", "--max-starts", "0"], "1 or more"),
    ],
)
def test_bad_invocations_are_one_line_and_submit_nothing(
    args: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # No cluster at this address: a refusal must come before any call to one.
    assert ray_job.main(["--address", "http://127.0.0.1:9", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err
