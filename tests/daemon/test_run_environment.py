"""A run gets the environment of the shell that submitted it, not the daemon's: a PATH with the
user's own programs, a virtualenv's variables, a token. It is stored with the run (a daemon
started later starts the run's next attempts with it) and never shown back."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from typing import Any

import httpx
import psutil
import pytest

from tests.daemon.conftest import DaemonHandle, command_spec, wait_for

SECRET = "tok-5e3f1a9c"  # a value the run must see and nothing may show


def _shell(gw: DaemonHandle) -> dict[str, str]:
    """The submitter's variables over the daemon's: a folder of its own on PATH holding `envtool`
    (a program the daemon's PATH cannot find), a token, and what a `gpuwarden run` typed inside a
    rank of another supervised run inherits from it."""
    tools = gw.root / "tools"
    tools.mkdir(exist_ok=True)
    envtool = tools / "envtool"
    envtool.write_text('#!/bin/sh\necho "envtool FOO=$FOO rank=${RANK-none} in $(pwd)"\n')
    envtool.chmod(0o755)
    return {
        "PATH": f"{tools}{os.pathsep}{gw.env['PATH']}",
        "FOO": SECRET,
        "GPUWARDEN_RUN_TAG": "outer-run:1",
        "RANK": "1",
        "WORLD_SIZE": "2",
    }


def _stdout(gw: DaemonHandle, run_id: str, attempt: int) -> str:
    with gw.client() as client:
        return client.logs(run_id, stream="stdout", attempt=attempt).data


def _nothing_shows(gw: DaemonHandle, run_id: str) -> None:
    """Neither the token nor the submitter's PATH is in what the CLI, the API or the daemon's
    log shows of the run."""
    detail = gw.cli_json("show", run_id)
    assert "environment" not in detail
    shown = gw.cli("show", run_id).stdout
    with gw.client() as client:
        events = json.dumps([e.model_dump(mode="json") for e in client.events(run_id, limit=10_000).events])
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(gw.socket)), base_url="http://gw") as http:
        raw = http.get(f"/v1/runs/{run_id}").text + http.get("/v1/runs").text
    tools = str(gw.root / "tools")
    daemon_log = gw.state_dir / "daemon.log"
    logs = gw.log.read_text() + (daemon_log.read_text() if daemon_log.exists() else "")
    for text in (json.dumps(detail), shown, events, raw, logs):
        assert SECRET not in text and tools not in text


@pytest.mark.slow
def test_a_command_runs_with_the_environment_and_folder_of_the_shell_that_submitted_it(
    gw: DaemonHandle,
) -> None:
    here = gw.root / "project"
    here.mkdir()
    assert "FOO" not in gw.env and not any("tools" in p for p in gw.env["PATH"].split(os.pathsep))
    result = gw.cli(
        "run", "--name", "envcheck", "--gpus", "0", "--follow", "--", "envtool", env=_shell(gw), cwd=here
    )
    assert result.returncode == 0, result.stderr
    # Found through the submitter's PATH, with its variables, in its folder; not as a rank of the
    # run it was typed in.
    assert f"envtool FOO={SECRET} rank=none in {here}" in result.stdout, result.stdout
    submitted = re.search(r"^(\S+)  envcheck  submitted$", result.stderr, re.MULTILINE)
    assert submitted, result.stderr
    _nothing_shows(gw, submitted.group(1))


SURVIVOR = """
name: survivor
kind: command
resources: {gpus: 0}
on_interrupt: resume
command:
  argv: [sh, -c, 'echo "attempt $GPUWARDEN_ATTEMPT: $(envtool)"; [ "$GPUWARDEN_ATTEMPT" = 2 ] || exec sleep 600']
"""


@pytest.mark.slow
def test_a_daemon_started_later_resumes_the_run_with_the_environment_it_was_submitted_with(
    daemon_factory: Any,
) -> None:
    gw: DaemonHandle = daemon_factory({"GPUWARDEN_FAKE_NVML": "none"})
    spec = gw.write_spec("survivor", SURVIVOR)
    result = gw.cli("run", str(spec), "--json", env=_shell(gw))
    assert result.returncode == 0, result.stderr
    run_id = json.loads(result.stdout)["id"]
    pid = gw.wait_state(run_id, ("running",))["attempts"][0]["pid"]
    wait_for(lambda: "attempt 1: envtool" in _stdout(gw, run_id, 1), "attempt 1's output")

    # The daemon dies, then the attempt; a new daemon (which never had FOO) finds it gone.
    gw.kill9()
    os.killpg(pid, signal.SIGKILL)
    wait_for(lambda: _gone(pid), f"pid {pid} to be gone")
    gw.start()
    done = gw.wait_state(run_id)
    assert done["state"] == "succeeded", done["message"]
    assert [a["classification"] for a in done["attempts"]] == ["interrupted", "succeeded"]
    assert f"attempt 2: envtool FOO={SECRET} rank=none" in _stdout(gw, run_id, 2)
    _nothing_shows(gw, run_id)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _post(gw: DaemonHandle, body: dict[str, Any]) -> httpx.Response:
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(gw.socket)), base_url="http://gw") as http:
        return http.post("/v1/runs", json=body)


@pytest.mark.parametrize(
    ("environment", "says"),
    [
        ("FOO=bar", "environment: Input should be a valid dictionary"),
        ({"FOO": 1}, "environment.FOO: Input should be a valid string"),
        (
            {f"V{i}": "" for i in range(260_000)},
            "environment: the environment is 2.1 MiB, more than the 2 MiB",
        ),
        ({"A=B": "x"}, "environment: variable name 'A=B' is empty or holds '=' or a NUL"),
        ({"FOO": "a\0b"}, "environment: the value of FOO holds a NUL character"),
        (
            {"BIG": "x" * 2_200_000},
            "environment: the environment is 2.1 MiB, more than the 2 MiB a run carries",
        ),
    ],
    ids=["not-an-object", "not-text", "too-many", "name-with-equals", "nul", "too-large"],
)
def test_an_environment_the_run_could_not_start_with_is_refused_in_one_line(
    gw: DaemonHandle, environment: Any, says: str
) -> None:
    response = _post(gw, {"spec": command_spec("x", "pass"), "environment": environment})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and "\n" not in error["message"]
    assert error["message"].startswith(says), error["message"]
    assert "a\\u0000b" not in response.text and "xxxxxxxxxx" not in response.text  # values not echoed


def test_without_an_environment_a_run_gets_the_daemons_as_before(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory({"GPUWARDEN_FAKE_NVML": "none", "FROM_DAEMON": "yes"})
    code = "import os; print('daemon says', os.environ.get('FROM_DAEMON'))"
    response = _post(gw, {"spec": command_spec("raw", code, resources={"gpus": 0})})
    assert response.status_code == 201, response.text
    run_id = response.json()["id"]
    assert gw.wait_state(run_id)["state"] == "succeeded"
    assert "daemon says yes" in _stdout(gw, run_id, 1)


def test_a_submitted_environment_is_stored_in_the_owner_only_database(daemon_factory: Any) -> None:
    gw: DaemonHandle = daemon_factory({"GPUWARDEN_FAKE_NVML": "none"})
    failing = command_spec("kept", "raise SystemExit(1)", resources={"gpus": 0})
    response = _post(gw, {"spec": failing, "environment": {"FOO": SECRET}})
    assert response.status_code == 201, response.text
    kept = response.json()["id"]
    assert gw.wait_state(kept)["state"] == "failed"  # its files are written; it may be resumed
    holders = [p for p in gw.state_dir.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert holders and all(p.name.startswith("gpuwarden.db") for p in holders), holders
    assert all(p.stat().st_mode & 0o077 == 0 for p in holders)
    assert gw.state_dir.stat().st_mode & 0o077 == 0
    # A run that succeeded never starts again: its environment is dropped.
    response = _post(
        gw, {"spec": command_spec("done", "pass", resources={"gpus": 0}), "environment": {"FOO": "x"}}
    )
    done = response.json()["id"]
    assert gw.wait_state(done)["state"] == "succeeded"
    with contextlib.closing(sqlite3.connect(gw.db)) as db:
        stored = dict(db.execute("SELECT run_id, COUNT(*) FROM run_environments GROUP BY run_id").fetchall())
    assert stored == {kept: 1}


def test_a_shell_with_a_large_environment_submits_and_one_past_what_a_run_carries_is_told_why(
    gw: DaemonHandle,
) -> None:
    # Exported functions and long module paths: 600 KiB, which any program of the shell gets.
    large = {f"BASH_FUNC_big{i}%%": "() { " + "x" * 100_000 + "; }" for i in range(6)}
    count = "import os; print(len(str(os.environ)))"
    done = gw.cli("run", "--gpus", "0", "--follow", "--", sys.executable, "-c", count, env=large)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[0]) > 600_000  # the program got all of it
    # A stack limit of 64 MiB lets Linux start programs with up to 16 MiB of environment: a shell
    # so set up exports 2.4 MiB, then runs gpuwarden.
    exports = gw.root / "huge.sh"
    exports.write_text("".join(f"export HUGE{i}={'x' * 100_000}\n" for i in range(25)))
    shell = f'ulimit -s 65536 && . {exports} && exec "$@"'
    refused = subprocess.run(
        ["sh", "-c", shell, "sh", sys.executable, "-m", "gpuwarden", "run", "--", "true"],
        env=gw.env,
        capture_output=True,
        text=True,
        cwd=gw.root,
        timeout=60,
    )
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith(
        "gpuwarden: the environment is 2.4 MiB, more than the 2 MiB a run carries"
    )
