"""Starting one attempt: its folder, its record, its command line and environment, its process.

The attempt is recorded (state `starting`) before the process exists and its pid right after.
The process carries the attempt's tag (`RUN_TAG` in its environment), so a daemon that dies in
between leaves a record and a process a restarted daemon can find and adopt.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpuwarden.core.command.prepare import prepare_attempt
from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.errors import UserError
from gpuwarden.core.run_state import RunState
from gpuwarden.daemon.events_tail import EventsTail
from gpuwarden.daemon.process import RUN_TAG, run_tag
from gpuwarden.daemon.supervise.backends import ChildProcess
from gpuwarden.daemon.supervise.context import Active, Context, Start, spec_document


@dataclass(frozen=True)
class AttemptFiles:
    """Where one attempt's spec, output and events go."""

    dir: Path

    @property
    def stdout(self) -> Path:
        return self.dir / "stdout.log"

    @property
    def stderr(self) -> Path:
        return self.dir / "stderr.log"

    @property
    def events(self) -> Path:
        return self.dir / "events.jsonl"

    @property
    def resolved(self) -> Path:
        return self.dir / "resolved.yaml"


def start(ctx: Context, start: Start) -> None:
    """Record, then spawn, the run's next attempt; a program that cannot start fails the run."""
    run_id, spec, placement = str(start.run["id"]), start.spec, start.placement
    number = int(start.run["attempt"]) + 1
    run_dir = Path(start.run["run_dir"])
    files = _prepare(run_dir, number, spec)
    ctx.store(
        lambda s: s.add_attempt(
            run_id,
            number,
            stdout_path=str(files.stdout),
            stderr_path=str(files.stderr),
            events_path=str(files.events),
            gpus=placement.gpus,
        )
    )
    ctx.set_state(run_id, RunState.STARTING, f"attempt {number} on {', '.join(placement.gpus) or 'the CPU'}")
    if placement.warning:
        ctx.event(run_id, number, "warning", code="cpu_fallback", message=placement.warning)
    try:
        argv, env, cwd, note = command_line(spec, run_id, run_dir, number, files)
    except UserError as exc:
        _failed_to_start(ctx, run_id, number, "the run", exc)
        return
    if note:
        ctx.event(run_id, number, "prepared", message=note)
    env.update(placement.env())  # placement and tag are the daemon's: nothing overrides them
    env[RUN_TAG] = run_tag(run_id, number)
    limit = spec.resources.memory_limit
    try:
        child = ctx.backends.processes.spawn(
            argv,
            env,
            cwd,
            files.stdout,
            files.stderr,
            int(limit) if limit is not None else None,
            scope_unit=f"gpuwarden-run-{run_id}-{number}",
        )
    except (OSError, UserError) as exc:
        _failed_to_start(ctx, run_id, number, argv[0], exc)
        return
    _watch(ctx, run_id, number, child, files, placement.gpus)


def _prepare(run_dir: Path, number: int, spec: RunSpec) -> AttemptFiles:
    files = AttemptFiles(run_dir / "attempts" / str(number))
    files.dir.mkdir(parents=True, exist_ok=True)
    files.resolved.write_text(yaml.safe_dump(spec_document(spec), sort_keys=False))
    files.events.touch()
    return files


def command_line(
    spec: RunSpec, run_id: str, run_dir: Path, number: int, files: AttemptFiles
) -> tuple[list[str], dict[str, str], Path, str]:
    """(argv, environment, working folder, a line for the run's events) of an attempt; UserError
    when a template fails. A command run's attempt is prepared in core (its config copy,
    `{resume_from}`, variables bound to knobs)."""
    env = dict(os.environ)
    env.update(spec.env)  # retunes put allocator settings here
    if spec.kind != "command":
        argv = [sys.executable, "-m", "gpuwarden.runners", "--spec", str(files.resolved)]
        return [*argv, "--run-dir", str(run_dir), "--attempt", str(number)], env, run_dir, ""
    prepared = prepare_attempt(spec, run_id, run_dir, number)
    env.update(prepared.env)
    env.update(spec.env)
    return prepared.argv, env, prepared.cwd, prepared.note


def _failed_to_start(ctx: Context, run_id: str, number: int, program: str, exc: Exception) -> None:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    message = f"cannot start {program}: {reason}"
    ended = ctx.clock()
    ctx.store(
        lambda s: s.update_attempt(
            run_id, number, state="ended", ended_at=ended, classification="failed", reason=message
        )
    )
    ctx.set_state(run_id, RunState.FAILED, message)


def _watch(
    ctx: Context, run_id: str, number: int, child: ChildProcess, files: AttemptFiles, gpus: list[str]
) -> None:
    # Children share the daemon's cgroup, so its counter is theirs (and is still readable after
    # the child is gone, unlike /proc/<pid>/cgroup).
    oom_before = ctx.backends.oom_kills()
    ctx.store(
        lambda s: s.update_attempt(
            run_id,
            number,
            state="running",
            pid=child.pid,
            create_time=child.create_time,
            oom_kill_before=oom_before,
        )
    )
    ctx.active[run_id] = Active(
        run_id=run_id,
        attempt=number,
        child=child,
        tail=EventsTail(files.events, 0),
        gpus=gpus,
        stderr_path=files.stderr,
        oom_before=oom_before,
    )
    ctx.set_state(run_id, RunState.RUNNING, f"attempt {number}: pid {child.pid}")
