"""What every part of the supervisor shares: typed store writes, events to the live stream, the
wake-up, the attempts being watched, and the backends injected from outside.

Writes that belong together commit together (`batch`), so a write the disk refuses leaves a step
undone rather than half done; what records something that already happened (a process started,
a gang signalled) is owed (`owe`) until the store takes it, and the loop settles it first.

The parts (scheduler, spawner, finisher, retuner, adoption, actions…) import this module and never
each other; the loop in `supervisor.py` alone decides in which order they act.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from gpuwarden.core.api.runs import RunSummary
from gpuwarden.core.bar_follow import BarFollow
from gpuwarden.core.config.settings import Settings
from gpuwarden.core.config.spec import Resources, RunSpec
from gpuwarden.core.errors import UserError
from gpuwarden.core.exit_record import STATUS_FILE
from gpuwarden.core.gang.watchdog import StepWatch
from gpuwarden.core.paths import Paths
from gpuwarden.core.run_state import RunState
from gpuwarden.core.store import sqlite_utils
from gpuwarden.core.store.runs import RunStore
from gpuwarden.core.store.transaction import transaction
from gpuwarden.daemon.events_tail import EventsTail
from gpuwarden.daemon.placement import Placement, place, why_waiting
from gpuwarden.daemon.process import ExitStatus, ExitVerdict, Outcome
from gpuwarden.daemon.storage_health import StorageHealth
from gpuwarden.daemon.supervise.backends import Backends, ChildProcess
from gpuwarden.daemon.supervise.hooks import AttemptEnd
from gpuwarden.daemon.supervise.ports import EnergyReadings, NoEnergyReadings, Publisher, Store

T = TypeVar("T")
log = logging.getLogger("gpuwarden.daemon.supervisor")


class Conflict(UserError):
    """An action the run's state does not allow (HTTP 409)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="conflict")


# -- what the parts pass around --------------------------------------------------------------------


@dataclass(frozen=True)
class GangStop:
    """Why the daemon itself stopped a gang: a rank's own failure, or the hang watchdog."""

    cause: Literal["oom", "error", "hang"]
    rank: int | None  # the rank whose failure it was (None: a hang with no suspect)
    reason: str  # one line, the attempt's reason
    at: float


@dataclass
class Active:
    """An attempt whose process this daemon watches. A gang (`world_size` > 1) is torchrun's
    process; rank 0's events come through `tail`, every other rank's through `rank_tails`."""

    run_id: str
    attempt: int
    child: ChildProcess
    tail: EventsTail
    gpus: list[str]
    stderr_path: Path
    oom_before: int | None
    stop_requested: bool = False
    kill_at: float | None = None
    decisive_event: str | None = None
    world_size: int = 1
    nodes: int = 1  # the machines its ranks run on (the others' through `Backends.machines`)
    rank_tails: dict[int, EventsTail] = field(default_factory=dict)
    rank_pids: dict[int, int] = field(default_factory=dict)
    steps: StepWatch | None = None  # the hang watchdog's view of the ranks' progress
    failed_rank: int | None = None  # the first rank that reported its own oom or error
    gang_stop: GangStop | None = None
    # When the loop first saw the process gone: its end, even if the store takes it later.
    exited_at: float | None = None
    group_killed: bool = False  # what it left behind was killed as it ended (once)
    bar: BarFollow = field(default_factory=BarFollow)  # the progress bar its logs draw

    @property
    def gang(self) -> bool:
        return self.world_size > 1

    @property
    def attempt_dir(self) -> Path:
        return self.stderr_path.parent

    @property
    def exit_file(self) -> Path:
        """Where the attempt's exit-status recorder writes how its program ended."""
        return self.attempt_dir / STATUS_FILE


@dataclass(frozen=True)
class Start:
    """A run's next attempt, ready to spawn: the run, the spec to start it with, its GPUs."""

    run: Mapping[str, Any]
    spec: RunSpec
    placement: Placement


_STATE_OF: dict[Outcome, RunState] = {
    "succeeded": RunState.SUCCEEDED,
    "stopped": RunState.STOPPED,
    "terminated": RunState.STOPPED,
    "oom": RunState.RETUNING,
    "hang": RunState.FAILED,
    "failed": RunState.FAILED,
    "interrupted": RunState.INTERRUPTED,
}


@dataclass(frozen=True)
class Ending:
    """An ended attempt: the verdict, how its process ended, and the run's next state."""

    run_id: str
    attempt: int
    verdict: ExitVerdict
    status: ExitStatus
    message: str  # "attempt N: why", the run's message for its next state
    end: AttemptEnd  # the facts a retune policy decides on
    final_event: str | None  # the attempt's last decisive event (oom, error, finished), if any
    ended_at: float  # when its process ended, as near as the daemon can tell

    @property
    def state(self) -> RunState:
        return _STATE_OF[self.verdict.outcome]


@dataclass(frozen=True)
class Completion:
    """What a worker thread hands back to the loop for one run: `apply`, called under the lock,
    may start the run's next attempt. Each is applied on its own: one that raises fails its run
    and no other."""

    run_id: str
    apply: Callable[[], Start | None]


DECISIVE_EVENTS = ("oom", "error", "finished")


def spec_document(spec: RunSpec) -> dict[str, Any]:
    """A spec as the JSON-able mapping the store keeps (every field, defaults included)."""
    return spec.model_dump(mode="json")


class Batch:
    """Store writes committed in one transaction, then told to the log and stream clients: a step
    of the state machine that a refused write leaves undone, never half done, so it can be taken
    again. Each method adds a write and returns the batch; `commit` writes them all."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._writes: list[tuple[Callable[[RunStore], Any], Callable[[Any], None]]] = []

    def write(self, fn: Callable[[RunStore], object]) -> Batch:
        self._writes.append((fn, _nothing))
        return self

    def set_state(self, run_id: str, state: RunState, message: str | None = None, **fields: Any) -> Batch:
        """Move the run (the store checks the move)."""
        self._writes.append(
            (
                lambda s: s.set_state(run_id, state, message, **fields),
                lambda event: self._ctx.announce_state(run_id, state, message, event),
            )
        )
        return self

    def moved(self, run_id: str, fn: Callable[[RunStore], Mapping[str, Any]]) -> Batch:
        """A write that moves the run itself and returns its `state` event (`add_attempt`)."""
        self._writes.append((fn, lambda event: self._ctx.state_moved(run_id, event)))
        return self

    def event(self, run_id: str, attempt: int | None, type_: str, **payload: Any) -> Batch:
        """An event the daemon itself says about a run."""
        self._writes.append(
            (
                lambda s: s.add_daemon_event(run_id, attempt, type_, payload),
                lambda stored: self._ctx.announce_event(run_id, stored),
            )
        )
        return self

    def commit(self) -> None:
        """Write everything in one transaction (on the writer thread), then announce it."""
        writes = list(self._writes)

        def job(db: sqlite_utils.Database) -> list[Any]:
            store = RunStore(db, self._ctx.clock)
            with transaction(db.conn):
                return [write(store) for write, _ in writes]

        results = self._ctx.writer.call(job)
        for (_, announce), result in zip(writes, results, strict=True):
            announce(result)


def _nothing(result: object) -> None:
    return None


class Context:
    """Shared by every part; see the module docstring. Parts call it under `lock`."""

    def __init__(
        self,
        settings: Settings,
        paths: Paths,
        writer: Store,
        broadcaster: Publisher,
        backends: Backends,
        energy: EnergyReadings | None = None,
    ) -> None:
        self.settings = settings
        self.paths = paths
        self.writer = writer
        self.broadcaster = broadcaster
        self.backends = backends
        self.energy: EnergyReadings = energy if energy is not None else NoEnergyReadings()
        self.clock = backends.clock
        self.lock = threading.RLock()
        self.active: dict[str, Active] = {}
        # GPUs of runs probing between attempts (autotune, retune): held for them meanwhile.
        self.held: dict[str, list[str]] = {}
        # Queued runs that wait out a restart policy's backoff: not started before this time.
        self.not_before: dict[str, float] = {}
        # Runs whose script help is still being read (`help_reader`): set when it is recorded.
        self.help_pending: dict[str, threading.Event] = {}
        self._done: queue.SimpleQueue[Completion] = queue.SimpleQueue()
        self._owed: deque[Batch] = deque()
        self.wakeup = threading.Event()
        # Where the daemon bugs logged so far were raised: each one's traceback is logged once.
        self.bugs_seen: set[tuple[str, str, int]] = set()

    @property
    def health(self) -> StorageHealth:
        """Whether the store and the state folder take writes; parts report what they refuse."""
        return self.writer.health

    # -- the store (every write runs on the writer thread) -----------------------------------------

    def store(self, fn: Callable[[RunStore], T]) -> T:
        """`fn(RunStore)` on the writer thread, committed when this returns."""

        def job(db: sqlite_utils.Database) -> T:
            return fn(RunStore(db, self.clock))

        return self.writer.call(job)

    def find(self, run_id: str) -> dict[str, Any] | None:
        return self.store(lambda s: s.get_run(run_id))

    def run(self, run_id: str) -> dict[str, Any]:
        run = self.find(run_id)
        if run is None:
            raise UserError(f"no run '{run_id}'", code="not_found")
        return run

    def state_of(self, run_id: str) -> RunState | None:
        run = self.find(run_id)
        return None if run is None else RunState(run["state"])

    def set_state(self, run_id: str, state: RunState, message: str | None = None, **fields: Any) -> None:
        """Move the run (the store checks the move), then tell stream clients."""
        self.batch().set_state(run_id, state, message, **fields).commit()

    def event(self, run_id: str, attempt: int | None, type_: str, **payload: Any) -> None:
        """Record and publish an event the daemon itself says about a run."""
        self.batch().event(run_id, attempt, type_, **payload).commit()

    def batch(self) -> Batch:
        """Writes to commit together (all or none), told to stream clients once committed."""
        return Batch(self)

    def state_moved(self, run_id: str, event: Mapping[str, Any]) -> None:
        """Tell the log and stream clients of a state move the store recorded (its `state` event)."""
        self.announce_state(run_id, RunState(event["state"]), event.get("message"), event)

    def announce_state(
        self, run_id: str, state: RunState, message: str | None, event: Mapping[str, Any]
    ) -> None:
        log.info("run %s: %s%s", run_id, state, f" — {message}" if message else "")
        if state.final and self.backends.warm is not None:
            self.backends.warm.discard(run_id)  # no attempt comes after this one
        run = self.find(run_id)
        if run is not None:
            self.publish_run(run)
            self.announce_event(run_id, event)

    def announce_event(self, run_id: str, stored: Mapping[str, Any]) -> None:
        # The frame is the event as a later read returns it (ts included): live and stored agree.
        self.broadcaster.publish("event", {"run_id": run_id, **stored}, run_id)

    def owe(self, record: Batch) -> None:
        """Commit `record`, which says what has already happened (a process started, a gang
        signalled): what the store refuses now is kept, and committed in order once it can be."""
        if not self._owed:
            try:
                record.commit()
                return
            except Exception as exc:
                if self.health.fault_of(exc) is None:
                    raise
        self._owed.append(record)

    def settle(self) -> bool:
        """Commit what is owed, oldest first; False while the store still refuses it."""
        while self._owed:
            try:
                self._owed[0].commit()
            except Exception as exc:
                if self.health.fault_of(exc) is not None:
                    return False
                self._owed.popleft()  # a bug: said once in the log, not at every pass
                raise
            self._owed.popleft()
        return True

    @property
    def owed(self) -> int:
        """Records waiting for the store to take them."""
        return len(self._owed)

    def publish_run(self, run: Mapping[str, Any]) -> None:
        # The API's own model: a `run` frame is exactly what GET /v1/runs lists.
        self.broadcaster.publish("run", RunSummary.from_row(run).model_dump(mode="json"), str(run["id"]))

    # -- GPUs ----------------------------------------------------------------------------------------

    def busy(self, *, but: str | None = None) -> dict[str, int]:
        """Runs on each GPU UUID: watched attempts plus runs probing between attempts (`but`
        that run's own hold)."""
        busy: dict[str, int] = {}
        held = [gpus for run_id, gpus in self.held.items() if run_id != but]
        for gpus in [a.gpus for a in self.active.values()] + held:
            for uuid in gpus:
                busy[uuid] = busy.get(uuid, 0) + 1
        return busy

    def place(self, resources: Resources, busy: Mapping[str, int] | None = None) -> Placement | None:
        states = self.backends.gpu_states()
        taken = self.busy() if busy is None else busy
        topology = (
            self.backends.topology() if isinstance(resources.gpus, int) and resources.gpus > 1 else None
        )
        if topology is None:
            return place(resources, states, taken, self.settings.max_runs_per_gpu)
        return place(resources, states, taken, self.settings.max_runs_per_gpu, topology)

    def why_waiting(self, resources: Resources, busy: Mapping[str, int]) -> str:
        """Why `place` gave none: what the run waits for, and what there is."""
        return why_waiting(resources, self.backends.gpu_states(), busy, self.settings.max_runs_per_gpu)

    # -- the loop's inbox ----------------------------------------------------------------------------

    def wake(self) -> None:
        self.wakeup.set()

    def hand_back(self, run_id: str, apply: Callable[[], Start | None]) -> None:
        """From a worker thread: let the loop `apply` the run's result on its next pass (woken now)."""
        self._done.put(Completion(run_id, apply))
        self.wake()

    def completions(self) -> list[Completion]:
        out: list[Completion] = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out
