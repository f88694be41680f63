"""What the API asks, by the run's state: what each state allows, and the conflict otherwise."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuwarden.core.errors import UserError
from gpuwarden.core.run_state import RunState
from gpuwarden.daemon.supervise import Hooks
from tests.supervise.conftest import Rig, command, train

# More free memory than either GPU has: the run waits in the queue.
NEVER_FITS = {"gpus": 1, "min_free_memory": "200GiB"}
ACTIONS: dict[str, Callable[[Rig, str], Any]] = {
    "resume": lambda rig, run_id: rig.sup.resume_run(run_id),
    "tune": lambda rig, run_id: rig.sup.tune_run(run_id),
    "edit": lambda rig, run_id: rig.sup.edit_run(run_id, {"name": "renamed"}),
    "delete": lambda rig, run_id: rig.sup.delete_run(run_id),
    "stop": lambda rig, run_id: rig.sup.stop_run(run_id, grace=0),
}
# For each state a run can be brought to: the actions it allows (the others are conflicts).
ALLOWED = {
    RunState.QUEUED: {"tune", "edit", "delete", "stop"},
    RunState.RUNNING: {"stop"},
    RunState.RETUNING: {"stop"},
    RunState.SUCCEEDED: {"delete"},
    RunState.FAILED: {"resume", "tune", "edit", "delete"},
    RunState.STOPPED: {"resume", "tune", "edit", "delete"},
    RunState.INTERRUPTED: {"resume", "tune", "edit", "delete"},
}


def _bring_to(rig: Rig, state: RunState) -> str:
    """A train run brought to `state` by what its process does."""
    if state is RunState.QUEUED:
        return rig.submit(train(resources=NEVER_FITS))
    run_id = rig.submit(train())
    rig.step()
    proc = rig.proc_of(run_id)
    if state is RunState.RETUNING:
        rig.workers.hold = True
        proc.emit("oom", verdict="gpu_capacity")
        proc.exit(3)
    elif state is RunState.SUCCEEDED:
        proc.exit(0)
    elif state is RunState.FAILED:
        proc.exit(1)
    elif state is RunState.STOPPED:
        rig.sup.stop_run(run_id, grace=0)
    elif state is RunState.INTERRUPTED:
        proc.exit(sig=9, recorded=False)  # its recorder with it: nothing says how it ended
        rig.restart()
    rig.step()
    assert rig.state(run_id) == state
    return run_id


@pytest.mark.parametrize("state", list(ALLOWED))
@pytest.mark.parametrize("action", list(ACTIONS))
def test_each_action_is_allowed_or_a_conflict_by_state(rig: Rig, state: RunState, action: str) -> None:
    rig.use(Hooks(retune=lambda run, end, events, notes: None))
    run_id = _bring_to(rig, state)
    if action in ALLOWED[state]:
        ACTIONS[action](rig, run_id)
        return
    with pytest.raises(UserError) as refused:
        ACTIONS[action](rig, run_id)
    assert refused.value.code == "conflict"
    message = str(refused.value)
    assert message.startswith(f"run {run_id} ") and "\n" not in message
    # A finished run cannot be stopped: the advice is a new run, not "stop it first".
    if state.final and action == "stop":
        assert f"has already ended ({state}): nothing to stop" in message
    if state is RunState.SUCCEEDED and action in ("tune", "edit", "resume"):
        assert (
            " is succeeded" not in message and "stop it" not in message and "submit a new run" in message
        ), message


def test_resume_queues_the_next_attempt(rig: Rig) -> None:
    run_id = _bring_to(rig, RunState.FAILED)
    resumed = rig.sup.resume_run(run_id)
    assert resumed["state"] == RunState.QUEUED and resumed["ended_at"] is None
    rig.step()
    assert rig.run(run_id)["attempt"] == 2 and rig.state(run_id) == RunState.RUNNING


def test_edit_revalidates_the_whole_spec_and_keeps_the_state(rig: Rig) -> None:
    run_id = _bring_to(rig, RunState.STOPPED)
    edited = rig.sup.edit_run(run_id, {"set": {"train.batch_size": 2, "train.grad_accum_steps": 8}})
    assert edited["state"] == RunState.STOPPED
    assert (edited["spec"]["train"]["batch_size"], edited["spec"]["train"]["grad_accum_steps"]) == (2, 8)
    (record,) = rig.events(run_id, "edited")  # the change is part of the run's timeline
    before = rig.run(run_id)["submitted_spec"]["train"]
    assert record["changes"] == {
        "train.batch_size": [before["batch_size"], 2],
        "train.grad_accum_steps": [before["grad_accum_steps"], 8],
    }
    with pytest.raises(UserError, match="did you mean 'batch_size'"):
        rig.sup.edit_run(run_id, {"set": {"train.batchsize": 2}})
    with pytest.raises(UserError, match="not a spec key path"):
        rig.sup.edit_run(run_id, {"set": {"train..batch_size": 2}})
    with pytest.raises(UserError) as wrong:
        rig.sup.edit_run(run_id, {"set": {"train.batch_size": "many"}})
    # said in the words the dashboard and CLI user knows, not the HTTP method behind them
    assert str(wrong.value).startswith(f"the edit of run {run_id}: train.batch_size"), wrong.value
    assert rig.run(run_id)["spec"]["train"]["batch_size"] == 2  # a refused edit loses nothing


def test_a_command_run_is_tuned_only_when_its_roles_let_a_probe_run(rig: Rig) -> None:
    run_id = rig.submit(command(resources=NEVER_FITS))
    with pytest.raises(UserError) as refused:
        rig.sup.tune_run(run_id)
    assert refused.value.code != "conflict" and "command.roles.micro_batch" in str(refused.value)
    probeable = command(
        "probeable",
        resources=NEVER_FITS,
        knobs={"bs": 16, "acc": 1, "steps": 100, "out": "{run_dir}/out"},
        command={
            "argv": [sys.executable, "-c", "pass", "{bs}", "{acc}", "{steps}", "{out}"],
            "roles": {"micro_batch": "bs", "accum_steps": "acc", "max_steps": "steps", "output_dir": "out"},
        },
    )
    tuned = rig.sup.tune_run(rig.submit(probeable))
    assert tuned["spec"]["autotune"] is True


def test_delete_forgets_the_run_and_its_folder(rig: Rig) -> None:
    run_id = _bring_to(rig, RunState.SUCCEEDED)
    run_dir = Path(rig.run(run_id)["run_dir"])
    rig.sup.delete_run(run_id)
    assert not run_dir.exists()
    with pytest.raises(UserError) as gone:
        rig.sup.resume_run(run_id)
    assert gone.value.code == "not_found"


def test_an_edit_that_changes_nothing_is_refused_and_not_recorded(rig: Rig) -> None:
    run_id = rig.submit(command(knobs={"bs": 4}, resources=NEVER_FITS))
    nothing: list[dict[str, Any]] = [{}, {"knobs": {}}, {"knobs": {"bs": 4}}]
    for changes in nothing:
        with pytest.raises(
            UserError, match=f"nothing to change: run {run_id} already has what the edit asks"
        ):
            rig.sup.edit_run(run_id, changes)
    assert rig.events(run_id, "edited") == []
    rig.sup.edit_run(run_id, {"knobs": {"bs": 2}})
    (edited,) = rig.events(run_id, "edited")
    assert edited["changes"] == {"knobs.bs": [4, 2]}


def test_a_key_of_another_kinds_section_is_named_as_such(rig: Rig) -> None:
    run_id = rig.submit(command(knobs={"bs": 4}, resources=NEVER_FITS))
    with pytest.raises(UserError) as err:
        rig.sup.edit_run(run_id, {"set": {"train.batch_size": 2}})
    assert str(err.value) == (
        "train.batch_size: a command run has no train section — its settings are in knobs (knobs.NAME)"
    )
    trained = rig.submit(train(resources=NEVER_FITS))
    with pytest.raises(
        UserError, match=r"^infer.batch_size: a train run has no infer section — .* \(train.KEY\)"
    ):
        rig.sup.edit_run(trained, {"set": {"infer.batch_size": 2}})
