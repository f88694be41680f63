"""`gpuwarden logs --runs DIR RUN -f` follows a run that `gpuwarden exec` supervises through every
attempt, as it does a daemon's run (tests/daemon/test_logs_follow.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpuwarden.client.run_folders import RunFolders
from tests.daemon.conftest import DaemonHandle, wait_for
from tests.daemon.test_logs_follow import Follower, assert_followed_to_the_end, retuned_spec
from tests.job.test_exec import Job


@pytest.fixture
def job(daemon_factory: Any) -> Iterator[Job]:
    handle: DaemonHandle = daemon_factory(start=False)
    started = Job(handle.root, handle.env)
    yield started
    started.stop_all()


def _states(job: Job) -> list[str]:
    return [r.state for r in RunFolders(job.runs).runs()] if job.runs.exists() else []


@pytest.mark.slow
def test_logs_follow_of_a_run_folder_goes_on_through_the_retune(job: Job) -> None:
    gate = job.root / "gate"
    spec = retuned_spec(job.root, gate)
    execution = job.start(str(spec), "--runs", str(job.runs))
    wait_for(lambda: _states(job) == ["running"], "attempt 1 running")
    follower = Follower(["--runs", str(job.runs), "retuned"], job.env, job.root)
    wait_for(lambda: "output of attempt 1" in follower.stdout, "attempt 1's output in logs -f --runs")
    gate.touch()
    assert_followed_to_the_end(follower)
    _, err = execution.communicate(timeout=120)
    assert execution.returncode == 0, err[-2000:]
