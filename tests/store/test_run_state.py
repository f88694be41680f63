"""Run states: one table of legal moves, checked by the store on every write."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwarden.core.run_state import (
    ACTIVE_STATES,
    FINAL_STATES,
    TRANSITIONS,
    IllegalTransition,
    RunState,
    check_transition,
)
from gpuwarden.core.store.db import open_db
from gpuwarden.core.store.runs import RunStore


@pytest.fixture
def store(tmp_path: Path) -> RunStore:
    run_store = RunStore(open_db(tmp_path / "t.db"))
    run_store.create_run("r1", "a", "command", {"name": "a"}, "/runs/r1")
    return run_store


def test_every_state_has_a_row_and_every_move_leads_to_a_state() -> None:
    assert set(TRANSITIONS) == set(RunState)
    assert {s.value for s in ACTIVE_STATES} == {"starting", "running", "retuning"}
    assert all(state.final for state in FINAL_STATES) and not RunState.QUEUED.final
    # Only a settled run that did not succeed can go back to the queue; succeeded is terminal.
    assert TRANSITIONS[RunState.SUCCEEDED] == frozenset()
    assert all(RunState.QUEUED in TRANSITIONS[s] for s in (RunState.FAILED, RunState.STOPPED))


def test_a_lifecycle_with_a_retune_walks_legal_moves(store: RunStore) -> None:
    for state in ("starting", "running", "retuning", "starting", "running", "succeeded"):
        event = store.set_state("r1", state, f"now {state}")
        assert event["state"] == state
    run = store.get_run("r1")
    assert run is not None and run["state"] == "succeeded" and run["ended_at"] is not None


def test_an_illegal_move_is_refused_and_changes_nothing(store: RunStore) -> None:
    store.set_state("r1", "starting")
    store.set_state("r1", "running")
    store.set_state("r1", "succeeded", "done")
    events_before = len(store.events("r1"))
    with pytest.raises(IllegalTransition, match="succeeded → running is not allowed"):
        store.set_state("r1", "running", "again?")
    run = store.get_run("r1")
    assert run is not None and run["state"] == "succeeded" and run["message"] == "done"
    assert len(store.events("r1")) == events_before


def test_a_name_that_is_no_state_is_refused() -> None:
    with pytest.raises(ValueError, match="'finished' is not a valid RunState"):
        check_transition("r1", "running", "finished")
    assert check_transition("r1", "queued", "starting") is RunState.STARTING


def test_a_new_attempt_moves_the_run_to_starting_only_where_the_table_allows(store: RunStore) -> None:
    store.add_attempt("r1", 1, stdout_path="o", stderr_path="e", events_path="ev", gpus=[], message="go")
    run = store.get_run("r1")
    assert run is not None and (run["state"], run["attempt"], run["message"]) == ("starting", 1, "go")
    assert [e["state"] for e in store.events("r1", types=["state"])] == ["queued", "starting"]
    store.set_state("r1", "running")
    store.set_state("r1", "succeeded", "done")
    events_before = len(store.events("r1"))
    with pytest.raises(IllegalTransition, match="succeeded → starting is not allowed"):
        store.add_attempt("r1", 2, stdout_path="o", stderr_path="e", events_path="ev", gpus=[])
    run = store.get_run("r1")
    assert run is not None and (run["state"], run["attempt"], run["message"]) == ("succeeded", 1, "done")
    assert [a["attempt"] for a in store.attempts("r1")] == [1]  # the attempt's row rolled back too
    assert len(store.events("r1")) == events_before
