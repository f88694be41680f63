"""The API's models against what the store and the supervisor produce: same shapes, whole rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.core.api import Attempt, EventsPage, Retune, RunMetric
from gpuwarden.core.logtail import read_log
from gpuwarden.core.store.db import open_db
from gpuwarden.core.store.runs import RunStore


@pytest.fixture
def store(tmp_path: Path) -> RunStore:
    store = RunStore(open_db(tmp_path / "t.db"))
    spec = {"name": "a", "kind": "train", "resources": {"gpus": ["0", "1"]}}
    store.create_run("r1", "a", "train", spec, str(tmp_path / "r1"))
    store.add_attempt("r1", 1, stdout_path="o", stderr_path="e", events_path="v", gpus=["GPU-1"])
    store.add_events(
        "r1",
        1,
        [
            {
                "v": 1,
                "type": "progress",
                "ts": 2.0,
                "step": 3,
                "samples_seen": 24.0,
                "loss": 0.5,
                "extra": [1],
            },
            {"type": "note", "ts": 3.0, "v": "not a number", "message": "a script's own event"},
        ],
        200,
    )
    store.add_retune("r1", 1, {"batch_size": 8}, {"batch_size": 4}, "gpu_capacity", {"free_gib": 0.2})
    return store


def test_store_rows_validate_whole(store: RunStore) -> None:
    (attempt,) = [Attempt.model_validate(a) for a in store.attempts("r1")]
    # `prepared` comes from the attempt's folder, not its row: None for a train run.
    # `program_pid` is read from the live process by the daemon, `peak_rss` from the exit record
    # of an attempt that ended: None here. `resumed_from` and
    # `resume_warning` come from the run's events, read with every attempt.
    expected = {
        **store.attempts("r1")[0],
        "prepared": None,
        "restart": None,
        "program_pid": None,
        "peak_rss": None,
        "resumed_from": None,
        "resume_warning": None,
    }
    assert attempt.model_dump(mode="json") == expected
    (retune,) = [Retune.model_validate(r) for r in store.retunes("r1")]
    assert (retune.before, retune.after) == ({"batch_size": 8}, {"batch_size": 4})
    # the JSON keeps the API's names for the settings before and after
    assert retune.model_dump(mode="json") == store.retunes("r1")[0]
    (metric,) = [RunMetric.model_validate(m) for m in store.metrics("r1")]
    assert metric.model_dump(mode="json") == store.metrics("r1")[0]
    assert metric.step == 3 and isinstance(metric.step, int)


def test_events_keep_every_field_a_runner_or_script_wrote(store: RunStore) -> None:
    rows = store.events("r1")
    page = EventsPage.model_validate({"events": rows, "next_since": rows[-1]["id"], "state": "queued"})
    assert [e.model_dump(mode="json") for e in page.events] == rows
    (note,) = [e for e in page.events if e.type == "note"]
    assert note.model_extra == {"v": "not a number", "message": "a script's own event"}


def test_log_slices_never_split_a_character(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    log.write_bytes("ab€".encode())  # € is three bytes
    first = read_log(log, 0, 3)
    assert (first.data, first.next_offset) == ("ab", 2)
    rest = read_log(log, first.next_offset, 10)
    assert (rest.data, rest.next_offset, rest.size) == ("€", 5, 5)
    tail = read_log(log, -3, 10)
    assert (tail.data, tail.offset, tail.overflow) == ("€", 2, True)
    missing = read_log(tmp_path / "none.log", 0, 10)
    assert (missing.data, missing.size) == ("", 0)
