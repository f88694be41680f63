"""The run supervisor's loop: the one place that decides in which order the parts act.

Every state change goes through the store writer and is committed before it is acted on (a
crash between the two leaves the run recoverable); while the disk refuses writes, nothing is
acted on that could not be recorded, and what happened meanwhile is recorded once it can be.
The loop runs on a thread named `supervisor`; API calls take the same lock, so the state machine
has one owner at a time. Slow policies (autotune, retune) run on threads of their own and hand
their result back to the loop.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from gpuwarden.core.config.settings import Settings
from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.paths import Paths
from gpuwarden.core.run_state import RunState
from gpuwarden.core.submission import Submission
from gpuwarden.daemon.process import ExitStatus
from gpuwarden.daemon.supervise import (
    actions,
    adoption,
    faults,
    finisher,
    help_reader,
    restarts,
    retuner,
    scheduler,
    spawner,
    tuning,
    watchdog,
)
from gpuwarden.daemon.supervise.backends import Backends
from gpuwarden.daemon.supervise.bar_watch import watch_bar
from gpuwarden.daemon.supervise.context import Active, Completion, Context, Ending, GangStop, Start
from gpuwarden.daemon.supervise.faults import contained
from gpuwarden.daemon.supervise.gang_stop import kill_now, stop_gang
from gpuwarden.daemon.supervise.hooks import Hooks
from gpuwarden.daemon.supervise.ports import EnergyReadings, Publisher, Store
from gpuwarden.daemon.supervise.pump import pump

T = TypeVar("T")
log = logging.getLogger("gpuwarden.daemon.supervisor")

LOOP_INTERVAL_S = 0.2


class Supervisor:
    """Owns every run's lifecycle; see the module docstring."""

    def __init__(
        self,
        settings: Settings,
        paths: Paths,
        writer: Store,
        broadcaster: Publisher,
        backends: Backends,
        hooks: Hooks | None = None,
        energy: EnergyReadings | None = None,
    ) -> None:
        """`energy`: reads the GPUs' energy counters as attempts start and end (None: the
        attempts' energy comes from the samples alone)."""
        self.ctx = Context(settings, paths, writer, broadcaster, backends, energy)
        self.hooks = hooks or Hooks()
        # What the loop took on but the store has not recorded yet, taken up again each pass.
        self._endings: deque[Ending] = deque()
        self._completions: deque[Completion] = deque()
        self._starts: deque[Start] = deque()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="supervisor", daemon=True)

    # What the API and tests read.
    @property
    def active(self) -> dict[str, Active]:
        return self.ctx.active

    @property
    def lock(self) -> threading.RLock:
        return self.ctx.lock

    @property
    def writer(self) -> Store:
        return self.ctx.writer

    def clock(self) -> float:
        return self.ctx.clock()

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> None:
        """Adopt or settle runs left by a previous daemon, then start the loop thread."""
        with self.lock:
            self.adopt()
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (runs keep running: a later daemon re-adopts them)."""
        self._stop.set()
        self.wake()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if self.ctx.backends.warm is not None:
            self.ctx.backends.warm.close()

    def wake(self) -> None:
        self.ctx.wake()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                with self.lock:
                    self.step()
            except Exception as exc:
                self._pass_failed(exc)
            self.ctx.wakeup.wait(LOOP_INTERVAL_S)
            self.ctx.wakeup.clear()

    def _pass_failed(self, exc: Exception) -> None:
        """Each run's work is contained (`faults.py`); what fails here is the pass's own, and would
        fail every pass: its traceback once, then quiet."""
        if faults.refused_write(self.ctx, exc):
            log.debug("supervisor pass: a write was refused (%s); retrying", exc)  # health says it
        elif faults.first_time(self.ctx, exc):
            log.exception("supervisor pass failed; retrying")
        else:
            log.debug("supervisor pass failed again (%s); retrying", exc)

    def _attempt(self, run_id: str, work: Callable[..., object], *args: Any) -> bool:
        """`work(*args)`, which is run `run_id`'s; False when the disk refused one of its writes
        (the next pass tries again). A bug in it fails that run alone (`faults.py`): done."""
        try:
            return self._try(work, *args)
        except Exception as exc:
            faults.fail(self.ctx, run_id, exc)
        return True

    def _try(self, work: Callable[..., object], *args: Any) -> bool:
        """`work(*args)`; False when the disk refused one of its writes, its exception when it is
        a bug (for the caller's `_attempt` to contain)."""
        try:
            work(*args)
        except Exception as exc:
            if not faults.refused_write(self.ctx, exc):
                raise
            return False
        return True

    def _drain(self, waiting: deque[T], work: Callable[[T], object], run_of: Callable[[T], str]) -> bool:
        """`work` on each item, oldest first, until the disk refuses one (it waits at the front)."""
        while waiting:
            if not self._attempt(run_of(waiting[0]), work, waiting[0]):
                return False
            waiting.popleft()
        return True

    def adopt(self) -> None:
        """After a restart: watch live attempts again, finish those that ended meanwhile, and
        decide again the retunes the previous daemon was deciding."""
        found = adoption.adopt(self.ctx)
        help_reader.read_again(self.ctx)  # before any retune decided again waits for one
        for g in found.gone:
            contained(self.ctx, g.active.run_id, self._gone, g)
        for e in found.ended:
            contained(self.ctx, e.run_id, self._ended_unwatched, e)
        for u in found.retunes:
            contained(self.ctx, u.run_id, self._retune_again, u)

    def _gone(self, gone: adoption.Gone) -> None:
        self._ended(finisher.finish(self.ctx, gone.active, gone.status, note=gone.note, kill_group=False))

    def _ended_unwatched(self, ended: adoption.Unfinished) -> None:
        self._ended(finisher.recorded_ending(self.ctx, ended.run_id, ended.attempt))

    def _retune_again(self, retune: adoption.Unfinished) -> None:
        end = finisher.recorded_end(self.ctx, retune.run_id, retune.attempt)
        message = f"attempt {end.number}: {end.reason}"
        retuner.begin(self.ctx, retune.run_id, end, message, self.hooks.retune, again=True)

    def step(self) -> None:
        """One pass: record what is owed, apply what worker threads decided, tail events, notice
        exits, enforce stop deadlines, start what fits. Each run's part of it is contained: one
        that raises fails that run (`faults.py`), and the pass goes on with the others.

        While the disk refuses writes, attempts are still watched (exits noticed, deadlines kept)
        and their events stay in their files; what cannot be recorded is not acted on, and waits
        (in order) for a pass that can record it: an attempt's end, a retune's decision, a start.
        """
        self._completions.extend(self.ctx.completions())
        settled = self.ctx.settle()
        if settled:
            self._drain(self._endings, self._settle_ending, lambda e: e.run_id)
            self._drain(self._completions, self._complete, lambda c: c.run_id)
            self._drain(self._starts, self._start_waiting, lambda s: str(s.run["id"]))
        now = self.ctx.clock()
        for active in list(self.ctx.active.values()):
            self._attempt(active.run_id, self._watch, active, now, settled)
        if settled and self.ctx.health.writable:
            for due in scheduler.due(self.ctx, can_tune=self.hooks.autotune is not None):
                # A refused start leaves the run queued for the next pass.
                self._attempt(str(due.start.run["id"]), self._begin, due)

    def _begin(self, due: scheduler.Scheduled) -> None:
        if due.tune and self.hooks.autotune is not None:
            tuning.begin(self.ctx, due.start, self.hooks.autotune)
        else:
            spawner.start(self.ctx, due.start)

    @property
    def unsettled(self) -> int:
        """What happened that the store has not taken yet (records, ends, decisions, starts)."""
        return self.ctx.owed + len(self._endings) + len(self._completions) + len(self._starts)

    def _watch(self, active: Active, now: float, settled: bool) -> None:
        pumped = self._try(pump, self.ctx, active)
        status = active.child.poll()
        if status is not None:
            if active.exited_at is None:
                active.exited_at = now
                self._try(watch_bar, self.ctx, active, now, True)  # its bar as it ended, before its end
                # Its energy ends here, whenever the store takes its end.
                self.ctx.energy.read_energy(active.run_id, active.attempt, active.gpus, "end")
            if settled:  # its record goes after what is owed
                self._try(self._finish, active, status)
        elif active.kill_at is not None and now >= active.kill_at:
            log.info("run %s: grace period over, SIGKILL to its processes", active.run_id)
            kill_now(active)
            active.kill_at = None
        else:
            self._try(watch_bar, self.ctx, active, now)
            if active.gang and pumped:  # progress not stored is progress not seen: no false hang
                self._try(self._watch_gang, active, now)

    def _finish(self, active: Active, status: ExitStatus) -> None:
        self._endings.append(finisher.finish(self.ctx, active, status))
        self._drain(self._endings, self._settle_ending, lambda e: e.run_id)

    def _watch_gang(self, active: Active, now: float) -> None:
        """One rank's own failure stops the whole gang at once; so does a hang."""
        rank = active.failed_rank
        if rank is not None and active.gang_stop is None and not active.stop_requested:
            oom = active.decisive_event == "oom"
            reason = f"rank {rank} {'ran out of memory' if oom else 'failed'}; the whole gang stopped at once"
            stop_gang(self.ctx, active, GangStop("oom" if oom else "error", rank, reason, now))
        else:
            watchdog.check(self.ctx, active, now)

    def _complete(self, completion: Completion) -> None:
        """Apply a worker's decision; the attempt it starts, if the disk refuses it, waits."""
        start = completion.apply()
        if start is not None and not self._try(spawner.start, self.ctx, start):
            self.ctx.held[str(start.run["id"])] = list(start.placement.gpus)
            self._starts.append(start)

    def _start_waiting(self, start: Start) -> None:
        """An attempt the disk refused to start: again, unless its run was moved on meanwhile."""
        run_id = str(start.run["id"])
        run = self.ctx.find(run_id)
        if run is not None and (run["state"], run["attempt"]) == (start.run["state"], start.run["attempt"]):
            spawner.start(self.ctx, start)
        self.ctx.held.pop(run_id, None)

    def _settle_ending(self, ending: Ending) -> None:
        """Move the run on from an attempt that ended, unless something else moved it meanwhile
        (a stop that came while the store refused its end)."""
        state = self.ctx.state_of(ending.run_id)
        if state in (RunState.RUNNING, RunState.STARTING):
            self._ended(ending)

    def _ended(self, ending: Ending) -> None:
        if ending.verdict.outcome == "oom":
            retuner.begin(self.ctx, ending.run_id, ending.end, ending.message, self.hooks.retune)
            return
        restart, message = restarts.decide(self.ctx, ending)
        if restart is not None:
            restarts.schedule(self.ctx, ending, restart)
        else:
            final = {"ended_at": ending.ended_at} if ending.state.final else {}
            self.ctx.set_state(ending.run_id, ending.state, message, **final)
        self.wake()

    # -- what the API calls ---------------------------------------------------------------------------

    def submit(
        self,
        spec: RunSpec,
        submitted_text: str | None = None,
        *,
        label: str = "spec",
        check_inputs: bool = True,
        environment: Mapping[str, str] | None = None,
        submission: Submission | None = None,
        run_id: str | None = None,
    ) -> dict[str, Any]:
        """Queue a run. `check_inputs=False` queues one whose model or data an earlier run is
        still to create; `environment` is the submitter's, which its processes start from;
        `submission` says how the client sent it (its key, how long it waits)."""
        return actions.submit(
            self.ctx,
            spec,
            submitted_text,
            label=label,
            check_inputs=check_inputs,
            profile=self.hooks.profile,
            environment=environment,
            submission=submission,
            run_id=run_id,
        )

    def stop_run(self, run_id: str, grace: float | None = None) -> dict[str, Any]:
        """SIGTERM the run's process group now and SIGKILL it after the grace period."""
        return actions.stop(self.ctx, run_id, grace)

    def resume_run(self, run_id: str) -> dict[str, Any]:
        return actions.resume(self.ctx, run_id)

    def tune_run(self, run_id: str) -> dict[str, Any]:
        return actions.tune(self.ctx, run_id)

    def edit_run(self, run_id: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        return actions.edit(self.ctx, run_id, changes)

    def delete_run(self, run_id: str) -> None:
        actions.delete(self.ctx, run_id)

    def pid_owners(self) -> dict[int, str]:
        """Process-group id → run id for every watched attempt (a GPU process belongs to the run
        whose group it is in, so dataloader workers count too; torchrun's ranks lead groups of
        their own, known from their `started` events)."""
        with self.lock:
            owners = {a.child.pid: a.run_id for a in self.ctx.active.values() if a.child.pid}
            for a in self.ctx.active.values():
                owners.update({pid: a.run_id for pid in a.rank_pids.values()})
            return owners

    def program_of(self, run_id: str) -> int | None:
        """The pid of the program the run's watched attempt runs, if any (the attempt's process is
        gpuwarden's exit-status recorder; a signal meant for the program goes here)."""
        with self.lock:
            active = self.ctx.active.get(run_id)
            pid = active.child.pid if active is not None else 0
        return self.ctx.backends.processes.program(pid) if pid else None


def owner_of(pid: int, groups: Mapping[int, str]) -> str | None:
    """The run a pid belongs to, by its process group."""
    try:
        pgid = os.getpgid(pid)
    except OSError:
        return None
    return groups.get(pgid)
