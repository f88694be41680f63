"""A run's state, and the moves between states that the supervisor may make.

One table says which moves are legal; the store checks it on every write, so a bug that would
skip a step (a finished run started again, a queued run "succeeding") fails loudly at the write
instead of leaving a run in a state nothing else expects.
"""

from __future__ import annotations

from enum import StrEnum


class RunState(StrEnum):
    """Where a run is in its lifecycle (the string is what the database and the API carry)."""

    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    RETUNING = "retuning"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    INTERRUPTED = "interrupted"

    @property
    def active(self) -> bool:
        """An attempt is being started, runs, or is being retuned: the run holds its GPUs."""
        return self in ACTIVE_STATES

    @property
    def final(self) -> bool:
        """Nothing happens to the run until a person (or a restart policy) resumes it."""
        return self in FINAL_STATES


ACTIVE_STATES: tuple[RunState, ...] = (RunState.STARTING, RunState.RUNNING, RunState.RETUNING)
FINAL_STATES: tuple[RunState, ...] = (
    RunState.SUCCEEDED,
    RunState.FAILED,
    RunState.STOPPED,
    RunState.INTERRUPTED,
)
RUN_STATES: tuple[RunState, ...] = tuple(RunState)
# Runs a person may resume: they are settled and have no process.
RESUMABLE_STATES: tuple[RunState, ...] = (RunState.FAILED, RunState.STOPPED, RunState.INTERRUPTED)
# Runs whose spec a person may change (edit, tune): settled ones, and queued ones not yet started.
CHANGEABLE_STATES: tuple[RunState, ...] = (RunState.QUEUED, *RESUMABLE_STATES)
# Runs a stop applies to: waiting in the queue, or holding a process.
STOPPABLE_STATES: tuple[RunState, ...] = (RunState.QUEUED, *ACTIVE_STATES)

_ENDINGS = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED, RunState.INTERRUPTED})

TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    # A queued run starts (or starts probing), is stopped before it starts, or its stored spec no
    # longer validates.
    RunState.QUEUED: frozenset({RunState.STARTING, RunState.STOPPED, RunState.FAILED}),
    # STARTING → STARTING: an autotune finished and the first attempt starts. An attempt that ended
    # while no daemon watched can end in anything, retuning included, straight from STARTING.
    RunState.STARTING: frozenset({RunState.STARTING, RunState.RUNNING, RunState.RETUNING}) | _ENDINGS,
    # RUNNING → QUEUED: the run's restart policy queues the next attempt after a failure.
    RunState.RUNNING: frozenset({RunState.RETUNING, RunState.QUEUED}) | _ENDINGS,
    # After a retune the next attempt starts at once, or waits in the queue for GPUs.
    # RETUNING → RETUNING: a daemon restarted while the run was retuning decides the retune again.
    RunState.RETUNING: frozenset({RunState.RETUNING, RunState.QUEUED, RunState.STARTING}) | _ENDINGS,
    RunState.SUCCEEDED: frozenset(),
    RunState.FAILED: frozenset({RunState.QUEUED}),
    RunState.STOPPED: frozenset({RunState.QUEUED}),
    RunState.INTERRUPTED: frozenset({RunState.QUEUED, RunState.STOPPED}),
}


class IllegalTransition(ValueError):
    """A move the state table does not allow: a supervisor bug, never a user's mistake."""

    def __init__(self, run_id: str, current: RunState, target: RunState) -> None:
        allowed = ", ".join(sorted(TRANSITIONS[current])) or "nothing"
        super().__init__(f"run {run_id}: {current} → {target} is not allowed ({current} may go to {allowed})")
        self.current = current
        self.target = target


def check_transition(run_id: str, current: str, target: str) -> RunState:
    """The target state, after checking the move from `current` is legal; raises otherwise
    (ValueError for a name that is no state at all)."""
    source, goal = RunState(current), RunState(target)
    if goal not in TRANSITIONS[source]:
        raise IllegalTransition(run_id, source, goal)
    return goal
