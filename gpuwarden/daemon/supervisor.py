"""The run supervisor: queue, placement, attempts, event tailing, stop, exit handling, re-adoption.

Every state change goes through the store writer and is committed before it is acted on (a
crash between the two leaves the run recoverable). The loop runs on a thread named `supervisor`;
API handlers call the public methods, which take the same lock, so the state machine has one
owner at a time.
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psutil
import sqlite_utils
import yaml

from gpuwarden.core.command.complete import complete_command
from gpuwarden.core.command.prepare import prepare_attempt
from gpuwarden.core.config.inputs import require_inputs
from gpuwarden.core.config.settings import Settings
from gpuwarden.core.config.spec import RunSpec, spec_from_mapping
from gpuwarden.core.errors import UserError
from gpuwarden.core.events import decode
from gpuwarden.core.oom.classify import classify_text, oom_kill_grew, read_oom_kill_count
from gpuwarden.core.paths import Paths
from gpuwarden.core.run_state import ACTIVE_STATES, FINAL_STATES
from gpuwarden.core.store.runs import RunStore
from gpuwarden.daemon import process
from gpuwarden.daemon.events_tail import EventsTail
from gpuwarden.daemon.placement import GpuState, Placement, check_feasible, place
from gpuwarden.daemon.stream import Broadcaster
from gpuwarden.daemon.writer import StoreWriter

log = logging.getLogger("gpuwarden.daemon.supervisor")

LOOP_INTERVAL_S = 0.2
STDERR_TAIL_BYTES = 65536


class Conflict(UserError):
    """An action the run's state does not allow (HTTP 409)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="conflict")


@dataclass(frozen=True)
class RetuneDecision:
    """What a retune hook returns: the spec of the next attempt and the record to store."""

    spec: dict[str, Any]
    from_: dict[str, Any]
    to: dict[str, Any]
    verdict: str | None = None
    evidence: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None


@dataclass(frozen=True)
class AttemptEnd:
    """How an attempt ended, with the evidence a retune policy needs (maps onto
    gpuwarden.core.oom.recovery.AttemptFacts)."""

    number: int
    outcome: str  # the daemon's verdict: "oom" when the hook is called
    reason: str
    exit_code: int | None
    signal: int | None
    oom_kill: bool | None  # the cgroup's oom_kill counter grew during the attempt
    stderr_tail: str
    gpus: list[str]
    gpu_capacity: int | None  # smallest memory among the attempt's GPUs
    host_capacity: int | None  # the address-space limit, else the host's memory
    adopted: bool
    pid: int | None = None  # the attempt's process (and process group) id


# (spec, placed GPU UUIDs, run dir) → (the spec document to start with, one line for the log).
AutotuneHook = Callable[[RunSpec, list[str], Path], tuple[dict[str, Any], str]]
# spec → (the spec document with profile values, or None; one line saying what happened).
ProfileHook = Callable[[RunSpec], tuple[dict[str, Any] | None, str]]


class RetuneGiveUp(Exception):
    """Raised by a retune hook when the run must fail; the message says why, in one line."""


class RetuneHook(Protocol):
    """Called (on its own thread) when an attempt ended out of memory, with the run (spec
    included), how the attempt ended, and every event of the run, oldest first. A decision starts
    the next attempt with its spec; None fails the run."""

    def __call__(
        self, run: Mapping[str, Any], end: AttemptEnd, events: Sequence[Mapping[str, Any]]
    ) -> RetuneDecision | None: ...


def no_retune(
    run: Mapping[str, Any], end: AttemptEnd, events: Sequence[Mapping[str, Any]]
) -> RetuneDecision | None:
    """The default hook until OOM recovery is plugged in: never retune."""
    return None


@dataclass
class Active:
    """An attempt whose process this daemon watches."""

    run_id: str
    attempt: int
    child: process.Child
    tail: EventsTail
    gpus: list[str]
    stderr_path: Path
    oom_before: int | None
    stop_requested: bool = False
    kill_at: float | None = None
    decisive_event: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def run_summary(run: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a run that list views and `run` stream frames carry."""
    spec = run["spec"]
    return {
        "id": run["id"],
        "name": run["name"],
        "kind": run["kind"],
        "state": run["state"],
        "attempt": run["attempt"],
        "message": run["message"],
        "created_at": run["created_at"],
        "updated_at": run["updated_at"],
        "started_at": run["started_at"],
        "ended_at": run["ended_at"],
        "gpus": spec.get("resources", {}).get("gpus"),
    }


def spec_document(spec: RunSpec) -> dict[str, Any]:
    """A spec as the JSON-able mapping the store keeps (every field, defaults included)."""
    return spec.model_dump(mode="json")


class Supervisor:
    """Owns every run's lifecycle; see the module docstring."""

    def __init__(
        self,
        settings: Settings,
        paths: Paths,
        writer: StoreWriter,
        gpu_states: Callable[[], list[GpuState]],
        broadcaster: Broadcaster,
        retune_hook: RetuneHook = no_retune,
        clock: Callable[[], float] = time.time,
        autotune_hook: AutotuneHook | None = None,
        profile_hook: ProfileHook | None = None,
    ) -> None:
        self.settings = settings
        self.autotune_hook = autotune_hook
        self.profile_hook = profile_hook
        # Runs whose first attempt waits on an autotune: their GPUs count as busy meanwhile.
        self.tuning: dict[str, Placement] = {}
        self.paths = paths
        self.writer = writer
        self.gpu_states = gpu_states
        self.broadcaster = broadcaster
        self.retune_hook = retune_hook
        self.clock = clock
        self.lock = threading.RLock()
        self.active: dict[str, Active] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="supervisor", daemon=True)

    # -- store helpers (everything runs on the writer thread) ------------------------------------

    def _w(self, fn: Callable[[RunStore], Any]) -> Any:
        def job(db: sqlite_utils.Database) -> Any:
            return fn(RunStore(db))

        return self.writer.call(job)

    def _run(self, run_id: str) -> dict[str, Any]:
        run = self._w(lambda s: s.get_run(run_id))
        if run is None:
            raise UserError(f"no run '{run_id}'", code="not_found")
        assert isinstance(run, dict)
        return run

    def _set_state(self, run_id: str, state: str, message: str | None = None, **fields: Any) -> None:
        event = self._w(lambda s: s.set_state(run_id, state, message, **fields))
        log.info("run %s: %s%s", run_id, state, f" — {message}" if message else "")
        run = self._w(lambda s: s.get_run(run_id))
        if run is not None:
            self.broadcaster.publish("run", run_summary(run), run_id)
            self.broadcaster.publish("event", {"run_id": run_id, **event}, run_id)

    def _daemon_event(self, run_id: str, attempt: int | None, type_: str, **payload: Any) -> None:
        event_id = self._w(lambda s: s.add_daemon_event(run_id, attempt, type_, payload))
        self.broadcaster.publish(
            "event",
            {
                "run_id": run_id,
                "id": event_id,
                "attempt": attempt,
                "type": type_,
                "source": "daemon",
                **payload,
            },
            run_id,
        )

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Re-adopt or settle runs left by a previous daemon, then start the loop thread."""
        with self.lock:
            self.recover()
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (runs keep running: a later daemon re-adopts them)."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def wake(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                with self.lock:
                    self.step()
            except Exception:
                log.exception("supervisor step failed; retrying")
            self._wake.wait(LOOP_INTERVAL_S)
            self._wake.clear()

    def step(self) -> None:
        """One pass: tail events, notice exits, enforce stop deadlines, start what fits."""
        now = self.clock()
        for active in list(self.active.values()):
            self._pump(active)
            status = active.child.poll()
            if status is not None:
                self._finish(active, status)
            elif active.kill_at is not None and now >= active.kill_at:
                log.info("run %s: grace period over, SIGKILL to its process group", active.run_id)
                active.child.signal_group(signal.SIGKILL)
                active.kill_at = None
        self._schedule()

    # -- recovery --------------------------------------------------------------------------------

    def recover(self) -> None:
        """Adopt live attempts of a previous daemon; settle the ones whose process is gone."""
        for attempt in self._w(lambda s: s.live_attempts()):
            self._recover_attempt(attempt)
        # Runs caught between attempts (retuning with no live attempt, starting before the spawn).
        for run in self._w(lambda s: s.list_runs(states=ACTIVE_STATES)):
            if run["id"] not in self.active:
                self._interrupted(run)

    def _recover_attempt(self, attempt: dict[str, Any]) -> None:
        run = self._w(lambda s: s.get_run(attempt["run_id"]))
        if run is None:
            return
        tail = EventsTail(Path(attempt["events_path"]), attempt["events_offset"])
        child = None
        if attempt["pid"] and attempt["create_time"]:
            child = process.adopt(int(attempt["pid"]), float(attempt["create_time"]))
        active = Active(
            run_id=run["id"],
            attempt=attempt["attempt"],
            child=child or process.Child(int(attempt["pid"] or 0), float(attempt["create_time"] or 0)),
            tail=tail,
            gpus=list(attempt["gpus"]),
            stderr_path=Path(attempt["stderr_path"]),
            oom_before=attempt["oom_kill_before"],
            stop_requested=bool(run["stop_requested"]),
        )
        last = self._w(
            lambda s: s.last_event(attempt["run_id"], attempt["attempt"], ("oom", "error", "finished"))
        )
        active.decisive_event = last["type"] if last else None
        if child is not None:
            self.active[run["id"]] = active
            self._w(
                lambda s: s.update_attempt(attempt["run_id"], attempt["attempt"], adopted=1, state="running")
            )
            self._daemon_event(run["id"], attempt["attempt"], "adopted", pid=child.pid)
            if run["state"] != "running":
                self._set_state(run["id"], "running", f"re-adopted pid {child.pid} after a daemon restart")
            log.info("run %s: re-adopted pid %s", run["id"], child.pid)
            self._pump(active)
            return
        # The process is gone: what it wrote while no daemon watched decides.
        self._pump(active, final=True)
        if active.decisive_event in ("finished", "oom", "error"):
            status = process.ExitStatus(code=None, signal=None)
            self._finish(active, status, note="ended while the daemon was down", kill_group=False)
            return
        self._w(
            lambda s: s.update_attempt(
                attempt["run_id"],
                attempt["attempt"],
                state="ended",
                ended_at=self.clock(),
                classification="interrupted",
                reason="process gone after a daemon restart",
            )
        )
        self._interrupted(run)

    def _interrupted(self, run: Mapping[str, Any]) -> None:
        spec = run["spec"]
        if run["stop_requested"]:
            self._set_state(
                run["id"], "stopped", "stop was requested; the process was gone after a daemon restart"
            )
            return
        if spec.get("on_interrupt") == "resume":
            self._set_state(run["id"], "interrupted", "process gone after a daemon restart; resuming")
            self._set_state(run["id"], "queued", "resuming after an interruption (on_interrupt: resume)")
        else:
            self._set_state(
                run["id"], "interrupted", "process gone after a daemon restart — `gpuwarden resume` it"
            )

    # -- events ------------------------------------------------------------------------------------

    def _pump(self, active: Active, final: bool = False) -> None:
        """Store new complete lines of events.jsonl with their end offset, in one transaction."""
        while True:
            chunk = active.tail.read(final=final)
            if chunk is None:
                return
            events = [e for e in (decode(line) for line in chunk.lines) if e is not None]
            skipped = len(chunk.lines) - len(events)
            end = chunk.end_offset
            ids = self._store_events(active, events, end, skipped)
            active.tail.commit(chunk.end_offset)
            for event_id, event in zip(ids, events, strict=True):
                if event["type"] in ("oom", "error", "finished"):
                    active.decisive_event = event["type"]
                self.broadcaster.publish(
                    "event",
                    {
                        "run_id": active.run_id,
                        "id": event_id,
                        "attempt": active.attempt,
                        "source": "runner",
                        **event,
                    },
                    active.run_id,
                )
            if not chunk.more:
                return

    def _store_events(
        self, active: Active, events: list[dict[str, Any]], end: int, skipped: int
    ) -> list[int]:
        ids: list[int] = self._w(lambda s: s.add_events(active.run_id, active.attempt, events, end, skipped))
        return ids

    # -- starting ------------------------------------------------------------------------------------

    def _busy(self) -> dict[str, int]:
        busy: dict[str, int] = {}
        held = [a.gpus for a in self.active.values()] + [p.gpus for p in self.tuning.values()]
        for gpus in held:
            for uuid in gpus:
                busy[uuid] = busy.get(uuid, 0) + 1
        return busy

    def _schedule(self) -> None:
        queued = self._w(lambda s: s.list_runs(states=("queued",)))
        for run in reversed(queued):  # oldest first
            if run["id"] in self.active or run["id"] in self.tuning:
                continue
            try:
                spec = spec_from_mapping(run["spec"])
            except UserError as exc:
                self._set_state(run["id"], "failed", str(exc).splitlines()[0])
                continue
            placement = place(spec.resources, self.gpu_states(), self._busy(), self.settings.max_runs_per_gpu)
            if placement is None:
                continue
            # `autotune` is cleared once tuned, so this runs before the first attempt, or once
            # more after `tune_run` asked for it.
            if spec.autotune and self.autotune_hook is not None:
                self._start_autotune(run, spec, placement)
                continue
            self._start_attempt(run, spec, placement)

    def _start_autotune(self, run: Mapping[str, Any], spec: RunSpec, placement: Placement) -> None:
        """Probe on the run's own GPUs (held for it) before its first attempt, off this thread."""
        run_id = str(run["id"])
        self.tuning[run_id] = placement
        where = ", ".join(placement.gpus) or "the CPU"
        self._set_state(run_id, "starting", f"autotune: probing micro-batch sizes on {where}")
        thread = threading.Thread(
            target=self._autotune, args=(run_id, spec, placement), name=f"autotune-{run_id}", daemon=True
        )
        thread.start()

    def _autotune(self, run_id: str, spec: RunSpec, placement: Placement) -> None:
        assert self.autotune_hook is not None
        try:
            document, line = self.autotune_hook(spec, placement.gpus, Path(self._run(run_id)["run_dir"]))
            tuned = spec_from_mapping(document)
        except Exception as exc:  # a failed tune must not cost the run: start as written
            log.warning("autotune failed for run %s: %s", run_id, exc)
            tuned = spec.model_copy(update={"autotune": False})
            line = f"autotune failed ({one_line(exc)}); starting with the spec's own values"
        with self.lock:
            self.tuning.pop(run_id, None)
            current = self._w(lambda s: s.get_run(run_id))
            if current is None or current["state"] != "starting":
                return  # stopped or deleted while probing
            self._w(lambda s: s.update_run(run_id, spec=spec_document(tuned)))
            self._daemon_event(run_id, None, "autotuned", message=line)
            self._start_attempt(self._run(run_id), tuned, placement)
        self.wake()

    def _start_attempt(self, run: Mapping[str, Any], spec: RunSpec, placement: Placement) -> None:
        run_id = run["id"]
        number = int(run["attempt"]) + 1
        run_dir = Path(run["run_dir"])
        attempt_dir = run_dir / "attempts" / str(number)
        attempt_dir.mkdir(parents=True, exist_ok=True)
        stdout_path, stderr_path = attempt_dir / "stdout.log", attempt_dir / "stderr.log"
        events_path = attempt_dir / "events.jsonl"
        resolved = attempt_dir / "resolved.yaml"
        resolved.write_text(yaml.safe_dump(spec_document(spec), sort_keys=False))
        events_path.touch()
        self._w(
            lambda s: s.add_attempt(
                run_id,
                number,
                stdout_path=str(stdout_path),
                stderr_path=str(stderr_path),
                events_path=str(events_path),
                gpus=placement.gpus,
            )
        )
        self._set_state(run_id, "starting", f"attempt {number} on {', '.join(placement.gpus) or 'the CPU'}")
        if placement.warning:
            self._daemon_event(run_id, number, "warning", code="cpu_fallback", message=placement.warning)
        env = dict(os.environ)
        env.update(spec.env)  # retunes put allocator settings here
        cwd: Path | None = run_dir
        try:
            if spec.kind == "command":
                prepared = prepare_attempt(spec, run_id, run_dir, number)
                argv, cwd = prepared.argv, prepared.cwd
                env.update(prepared.env)
                env.update(spec.env)
                if prepared.note:
                    self._daemon_event(run_id, number, "prepared", message=prepared.note)
            else:
                argv = [
                    sys.executable,
                    "-m",
                    "gpuwarden.runners",
                    "--spec",
                    str(resolved),
                    "--run-dir",
                    str(run_dir),
                    "--attempt",
                    str(number),
                ]
            env.update(placement.env())  # placement is the daemon's: nothing overrides it
            limit = spec.resources.memory_limit
            child = process.spawn(
                argv,
                env,
                cwd,
                stdout_path,
                stderr_path,
                int(limit) if limit is not None else None,
                scope_unit=f"gpuwarden-run-{run_id}-{number}",
            )
        except (OSError, UserError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            message = f"cannot start {argv[0] if 'argv' in locals() else 'the run'}: {reason}"
            self._w(
                lambda s: s.update_attempt(
                    run_id,
                    number,
                    state="ended",
                    ended_at=self.clock(),
                    classification="failed",
                    reason=message,
                )
            )
            self._set_state(run_id, "failed", message)
            return
        # children share the daemon's cgroup, so its counter is theirs (and is still readable
        # after the child is gone, unlike /proc/<pid>/cgroup)
        oom_before = read_oom_kill_count()
        self._w(
            lambda s: s.update_attempt(
                run_id,
                number,
                state="running",
                pid=child.pid,
                create_time=child.create_time,
                oom_kill_before=oom_before,
            )
        )
        self.active[run_id] = Active(
            run_id=run_id,
            attempt=number,
            child=child,
            tail=EventsTail(events_path, 0),
            gpus=placement.gpus,
            stderr_path=stderr_path,
            oom_before=oom_before,
        )
        self._set_state(run_id, "running", f"attempt {number}: pid {child.pid}")

    # -- ending --------------------------------------------------------------------------------------

    def _finish(
        self, active: Active, status: process.ExitStatus, note: str | None = None, kill_group: bool = True
    ) -> None:
        """An attempt's process ended: store everything it wrote, classify, move the run on.

        `kill_group` is False for a process that ended while no daemon watched: its pid may have
        been reused since, so its process group is no longer known to be the run's.
        """
        self._pump(active, final=True)
        if kill_group and active.child.pid and active.child.group_alive():
            # The run is over; nothing it started may outlive it.
            active.child.signal_group(signal.SIGKILL)
        self.active.pop(active.run_id, None)
        oom_kill = oom_kill_grew(active.oom_before, read_oom_kill_count())
        verdict = process.classify(
            status,
            stop_requested=active.stop_requested,
            oom_kills_delta=None if oom_kill is None else int(oom_kill),
            last_runner_event=active.decisive_event,
        )
        stderr_tail = _tail(active.stderr_path)
        if verdict.outcome == "failed" and status.known:
            # A program that is not our runner says it ran out of memory only on stderr.
            text = classify_text(stderr_tail, exit_code=status.code, signal=status.signal, oom_kill=oom_kill)
            if text.is_oom:
                verdict = process.Classification(
                    "oom", f"{text.verdict}: {text.reason} ({status.describe()})"
                )
            elif text.verdict == "shape_bug":
                # Looks like an OOM, but no memory setting can satisfy it: fail, and say why.
                verdict = process.Classification("failed", f"shape_bug: {text.reason} ({status.describe()})")
        if verdict.outcome == "failed" and active.decisive_event == "error":
            # The runner said why in its error event: that line, not only an exit code, is the reason.
            error = self._w(lambda s: s.last_event(active.run_id, active.attempt, ("error",)))
            if error and error.get("message"):
                verdict = process.Classification("failed", f"{error['message']} ({status.describe()})")
        reason = f"{verdict.reason}; {note}" if note else verdict.reason
        self._w(
            lambda s: s.update_attempt(
                active.run_id,
                active.attempt,
                state="ended",
                ended_at=self.clock(),
                exit_code=status.code,
                signal=status.signal,
                classification=verdict.outcome,
                reason=reason,
            )
        )
        self._w(lambda s: s.set_retune_outcome(active.run_id, verdict.outcome))
        log.info("run %s attempt %d: %s", active.run_id, active.attempt, reason)
        message = f"attempt {active.attempt}: {reason}"
        if verdict.outcome == "succeeded":
            self._set_state(active.run_id, "succeeded", message)
        elif verdict.outcome in ("stopped", "terminated"):
            self._set_state(active.run_id, "stopped", message)
        elif verdict.outcome == "oom":
            end = AttemptEnd(
                number=active.attempt,
                outcome=verdict.outcome,
                reason=reason,
                exit_code=status.code,
                signal=status.signal,
                oom_kill=oom_kill,
                stderr_tail=stderr_tail,
                gpus=list(active.gpus),
                gpu_capacity=self._gpu_capacity(active.gpus),
                host_capacity=self._host_capacity(active.run_id),
                adopted=active.child.adopted,
                pid=active.child.pid,
            )
            self._start_retune(active.run_id, end, message)
        else:
            self._set_state(active.run_id, "failed", message)
        self.wake()

    def _gpu_capacity(self, gpus: Sequence[str]) -> int | None:
        totals = [g.memory_total for g in self.gpu_states() if g.uuid in gpus and g.memory_total]
        return min(totals) if totals else None

    def _host_capacity(self, run_id: str) -> int | None:
        run = self._run(run_id)
        limit = run["spec"].get("resources", {}).get("memory_limit")
        return int(limit) if limit else int(psutil.virtual_memory().total)

    def _start_retune(self, run_id: str, end: AttemptEnd, message: str) -> None:
        """Mark the run retuning and ask the hook on its own thread: a policy may take a while
        (probe processes), and the supervisor must keep tailing every other run meanwhile."""
        self._set_state(run_id, "retuning", f"{message}; deciding a retune")
        thread = threading.Thread(
            target=self._retune, args=(run_id, end, message), name=f"retune-{run_id}", daemon=True
        )
        thread.start()

    def _retune(self, run_id: str, end: AttemptEnd, message: str) -> None:
        try:
            run = self._run(run_id)
            events = self._w(lambda s: s.events(run_id, limit=100_000))
            decision = self.retune_hook(run, end, events)
        except RetuneGiveUp as exc:
            decision = None
            message = f"{message}; {exc}"
        except Exception as exc:
            log.exception("retune hook failed for run %s", run_id)
            decision = None
            message = f"{message}; retune failed: {exc}"
        with self.lock:
            current = self._w(lambda s: s.get_run(run_id))
            if current is None or current["state"] != "retuning":
                return  # stopped or deleted while the policy thought
            if decision is None:
                self._set_state(run_id, "failed", message)
                return
            try:
                spec = spec_from_mapping(decision.spec)
            except UserError as exc:
                self._set_state(
                    run_id, "failed", f"{message}; the retune gave an invalid spec: {one_line(exc)}"
                )
                return
            self._w(
                lambda s: s.add_retune(
                    run_id,
                    end.number,
                    decision.from_,
                    decision.to,
                    decision.verdict,
                    decision.evidence,
                    decision.prediction,
                )
            )
            changes = ", ".join(f"{k}: {decision.from_.get(k)} → {v}" for k, v in decision.to.items())
            self._w(lambda s: s.update_run(run_id, spec=spec_document(spec)))
            reason = ((decision.evidence or {}).get("decision") or {}).get("reason")
            self._daemon_event(
                run_id, end.number, "retuned", changes=decision.to, verdict=decision.verdict, reason=reason
            )
            placement = place(spec.resources, self.gpu_states(), self._busy(), self.settings.max_runs_per_gpu)
            if placement is None:
                self._set_state(
                    run_id, "queued", f"retuned ({changes or 'no knob changed'}); waiting for GPUs"
                )
            else:
                self._start_attempt(self._run(run_id), spec, placement)
        self.wake()

    # -- API actions ---------------------------------------------------------------------------------

    def submit(
        self,
        spec: RunSpec,
        submitted_text: str | None = None,
        *,
        label: str = "spec",
        check_inputs: bool = True,
    ) -> dict[str, Any]:
        """Validate what waiting cannot fix, persist the run as queued, and wake the scheduler.

        `check_inputs=False` queues a run whose model or data an earlier run is still to create.
        """
        spec = complete_command(spec)  # command runs: preset knobs, config values, placeholders
        if check_inputs:
            require_inputs(
                spec, label, "fix the path, or submit with --no-check-inputs when a run creates it"
            )
        check_feasible(spec.resources, self.gpu_states())
        profile_line = ""
        if self.profile_hook is not None:
            profiled, profile_line = self.profile_hook(spec)
            if profiled is not None:
                spec = spec_from_mapping(profiled)
        run_id = new_run_id()
        run_dir = self.paths.runs_dir / run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        document = spec_document(spec)
        text = submitted_text if submitted_text is not None else yaml.safe_dump(document, sort_keys=False)
        (run_dir / "spec.yaml").write_text(text)
        with self.lock:
            self._w(
                lambda s: s.create_run(
                    run_id, spec.name, spec.kind, document, str(run_dir), "waiting to start"
                )
            )
            if profile_line:
                self._daemon_event(run_id, None, "profile", message=profile_line)
            run = self._run(run_id)
            self.broadcaster.publish("run", run_summary(run), run_id)
        self.wake()
        return run

    def stop_run(self, run_id: str, grace: float | None = None) -> dict[str, Any]:
        """SIGTERM the run's process group now and SIGKILL it after the grace period."""
        with self.lock:
            run = self._run(run_id)
            state = run["state"]
            if state in FINAL_STATES:
                raise Conflict(f"run {run_id} is already {state}")
            if state == "queued":
                self._set_state(run_id, "stopped", "stopped before it started", stop_requested=1)
                return self._run(run_id)
            self._w(lambda s: s.update_run(run_id, stop_requested=1))
            active = self.active.get(run_id)
            if active is None:
                self._set_state(run_id, "stopped", "stopped between attempts", stop_requested=1)
                return self._run(run_id)
            grace = self.settings.stop_grace_seconds if grace is None else grace
            active.stop_requested = True
            active.kill_at = self.clock() + grace
            self._daemon_event(run_id, active.attempt, "stopping", grace_seconds=grace)
            if not active.child.signal_group(signal.SIGTERM):
                active.kill_at = None
            self.wake()
            return self._run(run_id)

    def resume_run(self, run_id: str) -> dict[str, Any]:
        """Queue a new attempt of a run that failed, was stopped or was interrupted."""
        with self.lock:
            run = self._run(run_id)
            if run["state"] not in ("failed", "stopped", "interrupted"):
                raise Conflict(
                    f"run {run_id} is {run['state']}: only failed, stopped or interrupted runs resume"
                )
            self._set_state(run_id, "queued", "resumed", stop_requested=0, ended_at=None)
        self.wake()
        return self._run(run_id)

    def tune_run(self, run_id: str) -> dict[str, Any]:
        """Tune the run before its next attempt: a queued run tunes before it starts; a failed,
        stopped or interrupted one is resumed and tuned first (it continues from its checkpoint
        with the tuned micro-batch, the effective batch kept)."""
        with self.lock:
            run = self._run(run_id)
            state = run["state"]
            if state not in ("queued", "failed", "stopped", "interrupted"):
                raise Conflict(f"run {run_id} is {state}: stop it first, then tune")
            spec = spec_from_mapping(dict(run["spec"]))
            if spec.kind == "command":
                raise UserError(f"run {run_id} is a command run: only train and infer runs can be tuned")
            tuned = spec.model_copy(update={"autotune": True})
            self._w(lambda s: s.update_run(run_id, spec=spec_document(tuned)))
            if state != "queued":
                self._set_state(run_id, "queued", "resumed to tune", stop_requested=0, ended_at=None)
        self.wake()
        return self._run(run_id)

    def edit_run(self, run_id: str, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Change a run that is not running: name, knobs, resources, or any spec key by its
        dotted path (`set`); the result is re-validated as a whole spec. A stopped or failed run
        keeps its state: edit it, then resume it."""
        with self.lock:
            run = self._run(run_id)
            if run["state"] not in ("queued", "failed", "stopped", "interrupted"):
                raise Conflict(f"run {run_id} is {run['state']}: stop it first, then change it")
            document = copy.deepcopy(dict(run["spec"]))
            for key, value in changes.items():
                if key == "set":
                    for dotted, new in (value or {}).items():
                        _set_dotted(document, dotted, new)
                elif value is not None:
                    document[key] = value
            spec = complete_command(spec_from_mapping(document, label="PATCH"))
            check_feasible(spec.resources, self.gpu_states())
            self._w(lambda s: s.update_run(run_id, spec=spec_document(spec), name=spec.name))
            updated = self._run(run_id)
            self.broadcaster.publish("run", run_summary(updated), run_id)
            return updated

    def delete_run(self, run_id: str) -> None:
        """Forget a run that is not active, and remove its directory."""
        with self.lock:
            run = self._run(run_id)
            if run["state"] in ACTIVE_STATES or run_id in self.active:
                raise Conflict(f"run {run_id} is {run['state']} — stop it first (`gpuwarden stop {run_id}`)")
            self._w(lambda s: s.delete_run(run_id))
            shutil.rmtree(run["run_dir"], ignore_errors=True)

    def pid_owners(self) -> dict[int, str]:
        """Process-group id → run id for every watched attempt (a GPU process belongs to the run
        whose group it is in, so dataloader workers and torchrun ranks count too)."""
        with self.lock:
            return {a.child.pid: a.run_id for a in self.active.values() if a.child.pid}


def _tail(path: Path, size: int = STDERR_TAIL_BYTES) -> str:
    """The last `size` bytes of a log as text ("" when unreadable)."""
    try:
        with path.open("rb") as fh:
            fh.seek(max(0, path.stat().st_size - size))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def one_line(exc: Exception) -> str:
    return "; ".join(line for line in str(exc).splitlines() if line.strip())


def new_run_id() -> str:
    """'r' + 10 random hex digits: short to type, and a prefix of it is usually unique."""
    return "r" + os.urandom(5).hex()


def _set_dotted(document: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `a.b.c` in a nested spec document; unknown keys are caught by re-validation."""
    parts = dotted.split(".")
    if not all(parts):
        raise UserError(f"{dotted!r} is not a spec key path — use e.g. train.batch_size")
    node = document
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def owner_of(pid: int, groups: Mapping[int, str]) -> str | None:
    """The run a pid belongs to, by its process group."""
    try:
        pgid = os.getpgid(pid)
    except OSError:
        return None
    return groups.get(pgid)
