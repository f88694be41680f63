"""A user's script that stops halfway and resumes from its checkpoint, supervised by a real
daemon: `gpuwarden report` and the run detail count each sample once and read its loss."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.conftest import DaemonHandle, command_spec
from tests.daemon.module_daemon import module_daemon

# Ten steps of ten samples, counted on from the checkpoint it resumes from. The first attempt
# checkpoints at step 5 and exits 75, which the restart policy answers with a second attempt.
SCRIPT = """
import sys, time
from gpuwarden import sdk

start = sdk.resume_from()
step = int(open(start).read()) if start else 0
while step < 10:
    time.sleep(0.05)
    step += 1
    sdk.progress(step, step * 10, loss=1.0 / step, batch_size=10)
    if step == 5 and start is None:
        with open("ckpt-5", "w") as fh:
            fh.write("5")
        sdk.checkpoint("ckpt-5", 5, 50)
        sys.exit(75)
"""


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonHandle]:
    with module_daemon(tmp_path_factory.mktemp("daemon")) as handle:
        yield handle


@pytest.fixture(scope="module")
def resumed(gw: DaemonHandle) -> dict[str, Any]:
    """The finished run (its JSON document) of SCRIPT, stopped once and resumed."""
    restart = {"on": [{"exit_code": [75]}], "max": 1, "backoff": 0}
    run = gw.wait_state(gw.submit(command_spec("resumed", SCRIPT, restart=restart))["id"], timeout=120)
    assert run["state"] == "succeeded", run["message"]
    # Its command passes no {resume_from}: the program takes the checkpoint through the SDK,
    # and that is what says the attempt resumed.
    assert [a["prepared"]["resume_from"] for a in run["attempts"]] == [None, None]
    assert [a["resumed_from"] for a in run["attempts"]] == [None, str(Path(run["run_dir"]) / "ckpt-5")]
    return run


def test_report_counts_the_samples_of_a_resumed_script_once(
    gw: DaemonHandle, resumed: dict[str, Any]
) -> None:
    report = gw.cli_json("report", resumed["id"])
    assert report["throughput"]["samples"] == 100
    assert [a["samples"] for a in report["energy"]["per_attempt"]] == [50, 50]
    wall = sum(a["wall_s"] for a in report["attempts"])
    assert report["throughput"]["samples_per_s_wall"] == pytest.approx(100 / wall)
    # The loop's rate bounds the rate over wall time, which also holds start-up and the restart.
    assert report["throughput"]["samples_per_s_wall"] < report["throughput"]["samples_per_s"]
    assert report["energy"]["samples"] == 100


def test_the_run_detail_counts_the_samples_of_a_resumed_script_once(
    gw: DaemonHandle, resumed: dict[str, Any]
) -> None:
    with gw.client() as client:
        energy = client.run(resumed["id"]).energy.model_dump()
    assert [a["samples"] for a in energy["per_attempt"]] == [50, 50]
    assert energy["samples"] == 100


def test_report_reads_the_loss_a_script_reports_in_its_progress(
    gw: DaemonHandle, resumed: dict[str, Any]
) -> None:
    assert gw.cli_json("report", resumed["id"])["loss"] == {"first": 1.0, "last": pytest.approx(0.1)}
    shown = gw.cli("report", resumed["id"])
    assert shown.returncode == 0, shown.stderr
    assert "1.0000 → 0.1000" in shown.stdout


def test_the_events_name_the_checkpoint_of_a_resume_once(gw: DaemonHandle, resumed: dict[str, Any]) -> None:
    shown = gw.cli("events", resumed["id"])
    assert shown.returncode == 0, shown.stderr
    (line,) = [x for x in shown.stdout.splitlines() if "] prepared: " in x]
    checkpoint = str(Path(resumed["run_dir"]) / "ckpt-5")
    found = f"[2] prepared: attempt 2 found {checkpoint} (step 5) but the command passes it nowhere"
    assert found in line and "unless it loads sdk.resume_from()" in line
    # What the program took, in its own event (from the SDK's resume_from()).
    (started,) = [x for x in shown.stdout.splitlines() if "] started: " in x]
    assert f"[2] started: resumed_from={checkpoint} " in started
