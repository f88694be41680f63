"""A real Slurm for the tests that submit jobs: `.ci/slurm-up` starts one on this machine.

The `slurm` fixture checks that Slurm answers (`sinfo` lists a usable node) and skips, saying
what is missing, where it does not. Every job a module submits through it is cancelled by id
when the module ends.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuwarden.slurm.sbatch import SbatchOptions, sbatch_script
from gpuwarden.slurm.scheduler import JobState, cancel, state, submit

START_SLURM = "start one with `.ci/slurm-up` as root (README: Development)"
USABLE_NODE_STATES = ("idle", "mix", "alloc", "completing")


def _slurm_missing() -> str | None:
    """Why jobs cannot be submitted here, or None when a Slurm answers."""
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return f"needs Slurm: its client commands are not installed; {START_SLURM}"
    try:
        answer = subprocess.run(
            ["sinfo", "--noheader", "--format=%T"], capture_output=True, text=True, timeout=20
        )
    except subprocess.TimeoutExpired:
        return f"needs Slurm: sinfo did not answer in 20 s; {START_SLURM}"
    if answer.returncode != 0:
        said = answer.stderr.strip().splitlines()[-1:] or ["no message"]
        return f"needs Slurm: sinfo failed ({said[0]}); {START_SLURM}"
    if not any(line.strip().startswith(USABLE_NODE_STATES) for line in answer.stdout.splitlines()):
        return f"needs Slurm: no node is up (sinfo: {answer.stdout.split()}); {START_SLURM}"
    return None


@dataclass
class Slurm:
    """Submits scripts built by `sbatch_script` into a folder of the module's, and waits."""

    folder: Path
    submitted: list[int] = field(default_factory=list)

    def script(self, name: str, options: SbatchOptions, command: Sequence[str]) -> Path:
        path = self.folder / f"{name}.sbatch"
        path.write_text(sbatch_script(options, command))
        return path

    def submit(self, script: Path) -> int:
        job_id = submit(script)
        self.submitted.append(job_id)
        return job_id

    def output(self, name: str) -> Path:
        return self.folder / f"{name}.out"

    def wait(
        self, job_id: int, done: Callable[[JobState], bool], what: str, timeout: float = 60.0
    ) -> JobState:
        """Poll the job's state until `done` holds; fail with the last state after `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            now = state([job_id])[job_id]
            if done(now):
                return now
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"job {job_id}: gave up after {timeout:.0f} s waiting for {what}; last {now}"
                )
            time.sleep(0.2)

    def wait_ended(self, job_id: int, timeout: float = 60.0) -> JobState:
        return self.wait(job_id, lambda now: now.ended, "it to end", timeout)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    reason = _slurm_missing()
    if reason is not None:
        pytest.skip(reason)
    live = Slurm(tmp_path_factory.mktemp("slurm"))
    yield live
    # Only those still queued or running: Slurm forgets an ended job after MinJobAge, and
    # cancelling an id it has forgotten is an error.
    for job_id, now in state(live.submitted).items():
        if not now.ended:
            cancel(job_id)
