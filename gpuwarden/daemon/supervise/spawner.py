"""Starting one attempt: its folder, its record, its command line and environment, its process.

The attempt is recorded, and the run moved to `starting`, in one transaction before the process
exists; its pid right after. The process carries the attempt's tag (`RUN_TAG` in its
environment), so a daemon that dies in between leaves a record and a process a restarted daemon
can find and adopt.

A run of several processes (`train.world_size` > 1, or `command.launcher: torchrun`) starts as one
`torch.distributed.run` process (`gpuwarden.core.gang.launch`) whose ranks inherit the tag, the
GPUs (by UUID, rank N on the N-th) and the address-space limit: each rank gets the run's
`memory_limit`, as a one-process run does. A run over several machines (`resources.nodes` > 1,
under `gpuwarden exec` on a cluster job's first node) starts this machine's torchrun the same way
and, before it, publishes the attempt for the other machines (`Backends.machines`): the attempt
then ends when every machine's torchrun has.

Every attempt starts through the exit-status recorder (`core/exit_record.py`), which writes how
its process ended to `exit.json` in the attempt's folder: a restarted daemon is not its parent and
learns it from there, as it would have from the exit status (a user's script, a runner killed by
a signal before it could write a final event, torchrun after a rank's failure). The recorder leads
the attempt's process group and session; what it starts (the program, the runner, torchrun) stays
in them, so a signal to the group still reaches it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import yaml

from gpuwarden.core.command.prepare import prepare_attempt
from gpuwarden.core.command.record import mark_started_warm
from gpuwarden.core.command.resume import INEXACT_CODE
from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.errors import UserError
from gpuwarden.core.exit_record import STATUS_FILE
from gpuwarden.core.gang.files import rank_events_path
from gpuwarden.core.gang.launch import (
    NodeRole,
    Program,
    gang_launch,
    gang_size,
    program_from_argv,
    ranks_per_node,
    runner_program,
    uses_torchrun,
)
from gpuwarden.core.gang.nodes import NodePlan, PlannedProgram
from gpuwarden.core.gang.watchdog import step_watch
from gpuwarden.core.run_state import RunState
from gpuwarden.daemon import run_environment
from gpuwarden.daemon.events_tail import EventsTail
from gpuwarden.daemon.process import RUN_TAG, run_tag
from gpuwarden.daemon.supervise.backends import ChildProcess
from gpuwarden.daemon.supervise.context import Active, Batch, Context, Start, spec_document
from gpuwarden.daemon.warm_start import WarmLaunch, per_attempt_names, standby_folder

log = logging.getLogger("gpuwarden.daemon.supervisor")
WARM_MIN_CPUS = 4  # see warm_wanted


@dataclass(frozen=True)
class AttemptFiles:
    """Where one attempt's spec, output and events go."""

    dir: Path

    @property
    def run_dir(self) -> Path:
        """The run's folder (the attempt's is `attempts/<n>` in it)."""
        return self.dir.parent.parent

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

    @property
    def exit_status(self) -> Path:
        return self.dir / STATUS_FILE


@dataclass(frozen=True)
class Launch:
    """An attempt's process as the spawner starts it."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    note: str  # one line for the run's events; "" when there is nothing to say
    world_size: int = 1
    resume_from: str | None = None  # a command run's: the checkpoint its program is handed
    program: Program | None = None  # what a gang's ranks run
    added_env: dict[str, str] = field(default_factory=dict)  # the run's over the machine's
    warning: str = ""  # a command run's: why its resume will differ from an uninterrupted run


def start(ctx: Context, start: Start) -> None:
    """Record, then spawn, the run's next attempt; a program that cannot start fails the run.
    Until the process exists a refused write leaves nothing recorded (the start can be taken
    again); once it exists, what is recorded of it is owed until the store takes it."""
    run_id, spec, placement = str(start.run["id"]), start.spec, start.placement
    number = int(start.run["attempt"]) + 1
    run_dir = Path(start.run["run_dir"])
    files = _prepare(run_dir, number, spec)
    world = gang_size(spec) if uses_torchrun(spec) else 1
    base = run_environment.base(ctx.store(lambda s: s.environment(run_id)))
    record = _recorded(ctx, start, number, files, world)
    try:
        node = _this_node(ctx, spec, run_id, number)
        launch = command_line(spec, run_id, run_dir, number, files, placement.gpus, base, node)
    except UserError as exc:
        _failed_to_start(ctx, record, run_id, number, "the run", exc)
        return
    if launch.note:
        # The path as data, not only in the line: the report finds the samples it resumed at.
        record.event(run_id, number, "prepared", message=launch.note, resume_from=launch.resume_from)
    if launch.warning:
        record.event(run_id, number, "warning", code=INEXACT_CODE, message=launch.warning)
    record.commit()
    env = launch.env
    env.update(placement.env())  # placement and tag are the daemon's: nothing overrides them
    env[RUN_TAG] = run_tag(run_id, number)
    limit = spec.resources.memory_limit
    umask = ctx.backends.user_umask if spec.kind == "command" else None
    warm = _warm_launch(spec, launch, env, int(limit) if limit is not None else None, umask)
    try:
        if node is not None:
            _publish(ctx, start, number, files, launch, node)
        # The attempt's energy starts here, read now rather than at the next sample.
        ctx.energy.read_energy(run_id, number, placement.gpus, "start")
        child = _from_standby(ctx, run_id, number, files, warm, spec)
        started = _started(launch.world_size, warm=child is not None)
        if child is None:
            child = ctx.backends.processes.spawn(
                launch.argv,
                env,
                launch.cwd,
                files.stdout,
                files.stderr,
                int(limit) if limit is not None else None,  # inherited by every rank of a gang
                scope_unit=f"gpuwarden-run-{run_id}-{number}",
                exit_file=files.exit_status,  # see the docstring
                umask=umask,
            )
    except (OSError, UserError) as exc:
        ctx.owe(_failed_to_start(ctx, ctx.batch(), run_id, number, launch.argv[0], exc, commit=False))
        return
    if node is not None and ctx.backends.machines is not None:
        child = ctx.backends.machines.watch(child, files.dir)
    _watch(ctx, run_id, number, child, files, placement.gpus, spec, launch.world_size, started)
    _prepare_standby(ctx, run_id, number, run_dir, warm)


def _warm_launch(
    spec: RunSpec, launch: Launch, env: dict[str, str], limit: int | None, umask: int | None
) -> WarmLaunch | None:
    """The attempt as a standby must match it, for a run whose restarts can start warm: one
    process of a Python script or module named with its interpreter (`[python, train.py, …]`,
    no interpreter options); None for any other."""
    command = spec.command
    if command is None or not warm_wanted(command.warm_restart, _cpus()):
        return None
    if uses_torchrun(spec) or spec.resources.nodes > 1:
        return None
    try:
        program = program_from_argv(launch.argv, sys.executable)
    except UserError:
        return None
    if program.python != launch.argv[0]:
        return None
    return WarmLaunch(list(launch.argv), dict(env), launch.cwd, limit, umask)


def warm_wanted(setting: bool | Literal["auto"], cpus: int) -> bool:
    """Whether a run's restarts start warm: as its spec says, or (auto) where the machine has
    `WARM_MIN_CPUS` or more. On fewer, training keeps every core busy and the standby's imports
    beside the running attempt slow it about as much as they spare the restart (measured on two
    cores: the restart 1.1 s sooner, the run 0.9 s later)."""
    return setting if isinstance(setting, bool) else cpus >= WARM_MIN_CPUS


def _from_standby(
    ctx: Context, run_id: str, number: int, files: AttemptFiles, warm: WarmLaunch | None, spec: RunSpec
) -> ChildProcess | None:
    """The run's standby, handed this attempt; None when it starts cold (any standby ended)."""
    standbys = ctx.backends.warm
    if standbys is None:
        return None
    if warm is None:
        standbys.discard(run_id)
        child = None
    else:
        bound = [b.env for b in spec.command.bind.values() if b.env is not None] if spec.command else []
        child = standbys.take(run_id, number, warm, (files.stdout, files.stderr), per_attempt_names(bound))
    if child is None:
        files.exit_status.unlink(missing_ok=True)  # what an ended standby's recorder wrote there
    else:
        with contextlib.suppress(OSError):  # the record only tells; the attempt runs either way
            mark_started_warm(files.run_dir, number)
    return child


def _prepare_standby(ctx: Context, run_id: str, number: int, run_dir: Path, warm: WarmLaunch | None) -> None:
    """Start the standby the run's next attempt can start from (a failure costs only the warm start)."""
    standbys = ctx.backends.warm
    if warm is None or standbys is None:
        return
    after = number + 1
    launch = replace(warm, env={**warm.env, RUN_TAG: run_tag(run_id, after)})
    exit_file = AttemptFiles(run_dir / "attempts" / str(after)).exit_status
    try:
        standbys.prepare(
            run_id,
            after,
            launch,
            standby_folder(run_dir, after),
            exit_file,
            scope_unit=f"gpuwarden-run-{run_id}-{after}-warm",
        )
    except OSError as exc:
        log.info("run %s: no standby for attempt %d: %s", run_id, after, exc)


def _this_node(ctx: Context, spec: RunSpec, run_id: str, number: int) -> NodeRole | None:
    """This machine's part in a run over several; None for a run on this machine alone."""
    nodes = spec.resources.nodes
    if nodes == 1:
        return None
    machines = ctx.backends.machines
    if machines is None or machines.count != nodes:
        have = "one machine" if machines is None else f"{machines.count} machines"
        raise UserError(
            f"resources.nodes is {nodes} and this supervisor has {have}: start one "
            f"`gpuwarden exec --nodes {nodes} --node-rank K` on each machine (or `gpuwarden slurm "
            f"submit --nodes {nodes}`)"
        )
    return machines.rendezvous(run_id, number)


def _publish(
    ctx: Context, start: Start, number: int, files: AttemptFiles, launch: Launch, node: NodeRole
) -> None:
    """The attempt as the other machines start it, before this machine's part starts."""
    machines, program, spec = ctx.backends.machines, launch.program, start.spec
    if machines is None or program is None:
        raise UserError("a run over several machines starts through torchrun: nothing to publish")
    limit = spec.resources.memory_limit
    plan = NodePlan(
        leader="",  # the machines' own token
        attempt=number,
        nodes=node.nodes,
        ranks_per_node=ranks_per_node(spec),
        endpoint=node.endpoint,
        rendezvous_id=node.rendezvous_id,
        program=PlannedProgram(
            target=program.target, args=list(program.args), python=program.python, module=program.module
        ),
        leader_python=sys.executable,
        env=launch.added_env,
        cwd=str(launch.cwd),
        memory_limit=int(limit) if limit is not None else None,
        cpu_ranks=not start.placement.gpus,
        run_id=str(start.run["id"]),
    )
    machines.publish(plan, files.dir)


def _recorded(ctx: Context, start: Start, number: int, files: AttemptFiles, world: int) -> Batch:
    """The attempt's record (state `starting`), not yet committed."""
    run_id, placement = str(start.run["id"]), start.placement
    where = ", ".join(placement.gpus) or "the CPU"
    ranks = f" ({world} ranks through torchrun)" if world > 1 else ""
    record = ctx.batch().moved(
        run_id,
        lambda s: s.add_attempt(
            run_id,
            number,
            stdout_path=str(files.stdout),
            stderr_path=str(files.stderr),
            events_path=str(files.events),
            gpus=placement.gpus,
            world_size=world,
            message=f"attempt {number} on {where}{ranks}",
        ),
    )
    if placement.warning and not _fell_back_before(ctx, run_id, number):
        record.event(run_id, number, "warning", code="cpu_fallback", message=placement.warning)
    return record


def _fell_back_before(ctx: Context, run_id: str, number: int) -> bool:
    """Whether the attempt before `number` also ran on the CPU (this run asks for a GPU, so for
    want of one): the run was told so then, and a restart is the same run going on."""
    if number <= 1:
        return False
    earlier = ctx.store(lambda s: s.attempt(run_id, number - 1))
    return earlier is not None and not earlier.get("gpus")


def _prepare(run_dir: Path, number: int, spec: RunSpec) -> AttemptFiles:
    files = AttemptFiles(run_dir / "attempts" / str(number))
    files.dir.mkdir(parents=True, exist_ok=True)
    files.resolved.write_text(yaml.safe_dump(spec_document(spec), sort_keys=False))
    files.events.touch()
    files.exit_status.unlink(missing_ok=True)  # never another process's status (no stale record)
    return files


def command_line(
    spec: RunSpec,
    run_id: str,
    run_dir: Path,
    number: int,
    files: AttemptFiles,
    gpus: list[str],
    base: Mapping[str, str],
    node: NodeRole | None = None,
) -> Launch:
    """An attempt's command line, environment (`base`, the run's stored one, under the spec's),
    working folder and a line for the run's events; UserError when a template fails or torchrun
    cannot take the program. A command run's attempt is prepared in core (its config copy,
    `{resume_from}`, variables bound to knobs); a run of several processes goes through torchrun
    on `gpus`."""
    env = dict(base)
    env.update(spec.env)  # retunes put allocator settings here
    resume_from: str | None = None
    warning = ""
    if spec.kind != "command":
        program = runner_program(sys.executable, files.resolved, run_dir, number)
        argv = [sys.executable, "-m", program.target, *program.args]
        cwd, note = run_dir, ""
    else:
        prepared = prepare_attempt(spec, run_id, run_dir, number)
        env.update(prepared.env)
        env.update(spec.env)
        argv, cwd, note = prepared.argv, prepared.cwd, prepared.note
        resume_from, warning = prepared.record.resume_from, prepared.warning
        if uses_torchrun(spec):
            program = program_from_argv(argv, sys.executable)
    if not uses_torchrun(spec):
        return Launch(argv, env, cwd, note, resume_from=resume_from, warning=warning)
    # What the other machines of a run over several add to their own environment.
    added = {name: value for name, value in env.items() if base.get(name) != value or name in spec.env}
    gang = gang_launch(
        spec, program, gpus, attempt_dir=files.dir, python=sys.executable, cpu_count=_cpus(), node=node
    )
    env.update(gang.env)
    return Launch(gang.argv, env, cwd, note, gang.world_size, resume_from, program, added, warning)


def _cpus() -> int:
    """The CPUs this daemon may run on (its affinity), which its children inherit."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _failed_to_start(
    ctx: Context,
    record: Batch,
    run_id: str,
    number: int,
    program: str,
    exc: Exception,
    *,
    commit: bool = True,
) -> Batch:
    """`record` with the attempt ended and the run failed (committed unless `commit` is False)."""
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    message = f"cannot start {program}: {reason}"
    ended = ctx.clock()
    record.write(
        lambda s: s.update_attempt(
            run_id, number, state="ended", ended_at=ended, classification="failed", reason=message
        )
    ).set_state(run_id, RunState.FAILED, message)
    if commit:
        record.commit()
    return record


def _started(world_size: int, *, warm: bool = False) -> str:
    # The attempt's process is the exit-status recorder; the program's own pid (torchrun's, for a
    # gang) is in the attempt's detail, and each runner's in its `started` event.
    if world_size > 1:
        return f"started through torchrun, {world_size} ranks"
    return "started warm: its libraries were imported while the last attempt ran" if warm else "started"


def _watch(
    ctx: Context,
    run_id: str,
    number: int,
    child: ChildProcess,
    files: AttemptFiles,
    gpus: list[str],
    spec: RunSpec,
    world_size: int,
    started: str,
) -> None:
    # Children share the daemon's cgroup, so its counter is theirs (and is still readable after
    # the child is gone, unlike /proc/<pid>/cgroup).
    oom_before = ctx.backends.oom_kills()
    ctx.active[run_id] = Active(
        run_id=run_id,
        attempt=number,
        child=child,
        tail=EventsTail(files.events, 0),
        gpus=gpus,
        stderr_path=files.stderr,
        oom_before=oom_before,
        world_size=world_size,
        nodes=spec.resources.nodes,
        rank_tails={r: EventsTail(rank_events_path(files.events, r), 0) for r in range(1, world_size)},
        steps=step_watch(spec, world_size),
    )
    ctx.backends.processes.on_exit(child, ctx.wake)  # its end is seen at once, not at the next pass
    running = ctx.batch().write(
        lambda s: s.update_attempt(
            run_id,
            number,
            state="running",
            pid=child.pid,
            create_time=child.create_time,
            oom_kill_before=oom_before,
        )
    )
    ctx.owe(running.set_state(run_id, RunState.RUNNING, f"attempt {number}: {started}"))
