"""Which controls a run offers in its state, and in one line why a control it does not offer
would do nothing. The footer and the command palette show only what a run allows; a key pressed
for anything else answers with the reason (the daemon's own rules, from `core.run_state`)."""

from __future__ import annotations

from gpuwarden.core.run_state import (
    CHANGEABLE_STATES,
    FINAL_STATES,
    RESUMABLE_STATES,
    STOPPABLE_STATES,
    RunState,
)
from gpuwarden.tui.backend import RunRow

RUN_CONTROLS = ("stop_run", "resume_run", "edit_run", "tune_run", "rerun_run")
# The key of each control, to name it in a reason.
CONTROL_KEYS = {
    "stop_run": "s",
    "resume_run": "r",
    "edit_run": "e",
    "tune_run": "t",
    "rerun_run": "R",
    "kill_process": "x",
}
OFFLINE = "daemon not reachable — reconnecting (gpuwarden up starts it)"


# How a state reads after a run's name: "x is running", "x succeeded", "x was stopped".
_STATE_PHRASE = {
    RunState.SUCCEEDED: "succeeded",
    RunState.FAILED: "failed",
    RunState.STOPPED: "was stopped",
    RunState.INTERRUPTED: "was interrupted",
}


def refusal(action: str, run: RunRow) -> str | None:
    """None when `run` allows `action` now, else the one line saying why not."""
    state = RunState(run.state)
    who = f"{run.name} {_STATE_PHRASE.get(state, f'is {state}')}"
    if action == "stop_run":
        return None if state in STOPPABLE_STATES else f"{who}: nothing to stop"
    if action == "resume_run":
        if state in RESUMABLE_STATES:
            return None
        if state is RunState.SUCCEEDED:
            return f"{who}: nothing to resume (n submits a new run)"
        return f"{who}: only a failed, stopped or interrupted run resumes"
    if action in ("edit_run", "tune_run"):
        verb = "change" if action == "edit_run" else "tune"
        if state in CHANGEABLE_STATES:
            return None
        if state is RunState.SUCCEEDED:
            return f"{who}: a finished run is not changed — run it again with changes (R)"
        return f"{who}: stop it first (s), then {verb} it"
    if action == "rerun_run":
        return _rerun_refusal(who, state)
    return None


def _rerun_refusal(who: str, state: RunState) -> str | None:
    """Only a run that has ended runs again (as a new run); one still to come is changed instead."""
    if state in FINAL_STATES:
        return None
    if state in CHANGEABLE_STATES:
        return f"{who}: it has not run yet — change it instead (e)"
    return f"{who}: it has not ended — stop it (s), then change it (e) or run it again (R)"


def rerun_in_footer(run: RunRow) -> bool:
    """Whether the footer shows `R` for `run`: for a run that ended and offers nothing else. A
    failed or stopped run's footer is full at 80 columns with r, e and t; its `R` works unshown
    (the help and the palette list it)."""
    return refusal("rerun_run", run) is None and refusal("resume_run", run) is not None


def offered(run: RunRow | None) -> frozenset[str]:
    """The run controls `run` allows now (none without a run)."""
    if run is None:
        return frozenset()
    return frozenset(a for a in RUN_CONTROLS if refusal(a, run) is None)


class PendingStops:
    """Runs a stop was sent to and that have not stopped yet: the daemon accepts a stop at once,
    while the run checkpoints and ends seconds later. Said when it has ended, not when asked."""

    def __init__(self) -> None:
        self._names: dict[str, str] = {}

    def asked(self, run: RunRow) -> str:
        self._names[run.id] = run.name
        return f"{run.name}: stopping — SIGTERM sent, it checkpoints, then stops"

    def ended(self, runs: dict[str, RunRow]) -> list[str]:
        """One line for each run asked to stop that no longer runs (its final state)."""
        lines = []
        for run_id, name in list(self._names.items()):
            run = runs.get(run_id)
            if run is not None and RunState(run.state) not in STOPPABLE_STATES:
                del self._names[run_id]
                lines.append(f"{name}: {_STATE_PHRASE.get(RunState(run.state), run.state)}")
        return lines
