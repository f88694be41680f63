"""Events an attempt appends to events.jsonl: stored once each, whole lines only."""

from __future__ import annotations

import json

from gpuwarden.core.api.runs import RunEvent, RunSummary
from gpuwarden.core.store.runs import RunStore
from tests.supervise.conftest import Rig, command


def test_a_partial_line_waits_for_its_newline(rig: Rig) -> None:
    run_id = rig.submit(command())
    rig.step()
    proc = rig.proc_of(run_id)
    line = json.dumps({"v": 1, "type": "warning", "ts": 1.0, "code": "x", "message": "half"})
    with proc.events_path.open("a") as fh:
        fh.write(line[:10])
    rig.step(3)
    assert rig.events(run_id, "warning") == []
    with proc.events_path.open("a") as fh:
        fh.write(line[10:] + "\n")
    rig.step()
    (warning,) = rig.events(run_id, "warning")
    assert warning["message"] == "half" and warning["source"] == "runner"


def test_a_last_line_without_newline_counts_once_the_process_ended(rig: Rig) -> None:
    run_id = rig.submit(command())
    rig.step()
    proc = rig.proc_of(run_id)
    with proc.events_path.open("a") as fh:
        fh.write(json.dumps({"v": 1, "type": "finished", "ts": 1.0, "report": {}}))
    rig.step()
    assert rig.events(run_id, "finished") == []
    proc.exit(0)
    rig.step()
    assert len(rig.events(run_id, "finished")) == 1


def test_garbage_lines_are_skipped_and_counted(rig: Rig) -> None:
    run_id = rig.submit(command())
    rig.step()
    proc = rig.proc_of(run_id)
    with proc.events_path.open("a") as fh:
        fh.write("not json\n")
    proc.emit("progress", step=3, samples_seen=24)
    rig.step()
    assert [e["step"] for e in rig.events(run_id, "progress")] == [3]
    assert rig.attempts(run_id)[0]["events_skipped"] == 1


def test_live_frames_are_what_the_api_reads_later(rig: Rig) -> None:
    """A dashboard that shows a frame and one that reads the run afterwards see the same thing."""
    run_id = rig.submit(command())
    rig.step()
    rig.sup.stop_run(run_id, grace=5)  # a daemon event ("stopping"); the fake ends on SIGTERM
    rig.step()
    stored = {e["id"]: e for e in rig.events(run_id)}
    events = [data for kind, data in rig.broadcaster.frames if kind == "event"]
    assert {e["type"] for e in events} >= {"state", "stopping"}
    for frame in events:
        assert frame["ts"] > 0 and RunEvent.model_validate(frame).id == frame["id"]
        assert {k: v for k, v in frame.items() if k != "run_id"} == stored[frame["id"]]
    runs = [RunSummary.model_validate(data) for kind, data in rig.broadcaster.frames if kind == "run"]
    assert runs[-1].state == "stopped"


def test_numbers_too_large_for_a_float_or_the_store_cost_the_run_nothing(rig: Rig) -> None:
    run_id = rig.submit(command())
    rig.step()
    proc = rig.proc_of(run_id)
    huge = "9" * 30  # past SQLite's 64-bit integers
    with proc.events_path.open("a") as fh:  # and a time past a float's range
        fh.write(f'{{"v": 1, "type": "progress", "ts": 1{"0" * 400}, "step": {huge}, "loss": 0.5}}\n')
    rig.step()
    proc.exit(0)
    rig.step()
    assert rig.state(run_id) == "succeeded"
    (progress,) = rig.events(run_id, "progress")
    assert progress["step"] == int(huge)  # the event keeps what the script wrote
    assert isinstance(progress["ts"], float)  # but a time no float can hold is the daemon's
    (metric,) = rig.writer.call(lambda db: RunStore(db).metrics(run_id))
    assert (metric["step"], metric["loss"]) == (None, 0.5)
