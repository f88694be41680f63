"""`gpuwarden exec`: one run supervised in the foreground, with no daemon — the command a cluster
job runs (a Slurm batch script, a Kubernetes Job, a SkyPilot task, a Ray job).

    gpuwarden exec SPEC.yaml [--runs DIR]          a new run, in a folder of its own under DIR
    gpuwarden exec [OPTIONS] -- CMD ARGS…          the same for your own program (`run`'s options)
    gpuwarden exec --run DIR/RUN_ID                take that run up again (a requeued job)
    gpuwarden exec SPEC.yaml --run DIR --nodes N [--node-rank K]
                                                   one of N machines of a run (one exec on each)

It prints what `gpuwarden run --follow` prints, keeps the run's whole record in its folder
(`gpuwarden ps|show|logs|events --runs DIR` read it), and ends with a code an engine can act on:
0 succeeded, 1 failed, 2 refused (nothing ran), 75 stopped at a checkpoint — start the same
`gpuwarden exec --run` again to go on. SIGTERM, SIGINT and SIGUSR1 (Slurm's warning before the
time limit) stop the run at a checkpoint; a second one stops it at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from gpuwarden.cli.command_spec import command_options
from gpuwarden.cli.runs_cmds import follow_run, printed_so_far
from gpuwarden.cli.spec_input import spec_of
from gpuwarden.client.run_folders import RunFolders
from gpuwarden.core.config.settings import load_settings
from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.errors import UserError
from gpuwarden.core.run_folder import run_store_path
from gpuwarden.job import exit_codes

if TYPE_CHECKING:  # the job's parts are imported when exec runs, not for `--help`
    from gpuwarden.job.host import JobHost
    from gpuwarden.job.leader import LeaderMachines

DEFAULT_RUNS = Path("gpuwarden-runs")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


@click.command("exec")
@click.argument("words", nargs=-1, metavar="SPEC.yaml | -- CMD [ARGS]...")
@click.option(
    "--runs",
    "runs_root",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The folder a new run's folder goes in (default: ./gpuwarden-runs).",
)
@click.option(
    "--run",
    "run_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The run's own folder: started there, or taken up again when it holds the run already.",
)
@click.option(
    "--slurm-requeue",
    "slurm_requeue",
    type=click.IntRange(0, 1000),
    default=None,
    help="In a Slurm job: when SIGUSR1 (the time limit's warning) stopped the run at a checkpoint, "
    "requeue the job (scontrol requeue), up to this many times in all.",
)
@click.option(
    "--nodes",
    type=click.IntRange(1, 1024),
    default=None,
    help="Machines the run spans (its resources.nodes): start one exec on each, with --node-rank "
    "and the same --run folder on a shared file system.",
)
@click.option(
    "--node-rank",
    type=click.IntRange(0, 1023),
    default=None,
    help="This machine's place among them (0 supervises the run; default: Slurm's SLURM_NODEID).",
)
@click.option(
    "--rendezvous-host",
    default=None,
    metavar="HOST",
    help="Node 0: the address the other machines reach it at (default: its host name).",
)
@command_options
def exec_cmd(
    words: tuple[str, ...],
    runs_root: Path | None,
    run_dir: Path | None,
    slurm_requeue: int | None,
    nodes: int | None,
    node_rank: int | None,
    rendezvous_host: str | None,
    **flags: Any,
) -> None:
    """Supervise one run in the foreground, with no daemon (inside a cluster job).

    `--run DIR` with a spec or a command starts the run in DIR, or takes it up again when DIR
    holds it already: the same command every time an engine restarts the job. Exits 0 when the
    run succeeded, 1 when it failed, 75 when it stopped at a checkpoint (a signal: start the same
    command again to go on).
    """
    from gpuwarden.job.host import JobHost, new_run_dir

    if run_dir is not None and runs_root is not None:
        raise UserError("--run names the run's folder and --runs the folder new runs go in: give one")
    if run_dir is None and not words:
        raise UserError(
            "give a spec (gpuwarden exec SPEC.yaml), a command (gpuwarden exec -- CMD ARGS…) or "
            "a run folder to take up again (gpuwarden exec --run DIR)"
        )
    if run_dir is not None and not words and not run_store_path(run_dir).is_file():
        raise UserError(f"--run {run_dir}: no run there (no {run_store_path(run_dir).name}) — check the path")
    rank = _node_rank(nodes, node_rank, run_dir)
    if rank > 0 and run_dir is not None:
        sys.exit(_follow(run_dir.absolute(), rank))
    # Read even when the folder may hold the run: whether it does is known only under its lock.
    spec, text, label = spec_of(words, flags, "exec", nodes) if words else (None, None, "")
    folder = run_dir if run_dir is not None else new_run_dir(runs_root or DEFAULT_RUNS)
    # A run made under --runs is named by its folder, as the daemon's runs are.
    run_id = folder.name if run_dir is None else None
    machines = _machines(folder.absolute(), nodes, rendezvous_host)
    host = JobHost(load_settings(), folder.absolute(), machines=machines)
    code = exit_codes.FAILED
    try:
        host.open()
        code = _supervise(host, spec, text, label, run_id)
    finally:
        host.close()
        if machines is not None:
            machines.end(code)
    # Only the time limit's warning asks this job to queue itself again: a SIGTERM is Slurm's own
    # doing (a preemption it requeues by itself, a scancel that must end the job).
    if code == exit_codes.RESTART and slurm_requeue is not None and host.stopped_for == "SIGUSR1":
        _requeue(slurm_requeue)
    sys.exit(code)


def _node_rank(nodes: int | None, node_rank: int | None, run_dir: Path | None) -> int:
    """This machine's rank among the run's (0 on one machine)."""
    if nodes is None or nodes == 1:
        if node_rank:
            raise UserError(f"--node-rank {node_rank} needs --nodes: how many machines the run spans")
        return 0
    if run_dir is None:
        raise UserError(
            f"--nodes {nodes}: every machine's exec names the same run folder — give --run DIR, "
            "on a file system the machines share"
        )
    rank = node_rank
    if rank is None:
        given = os.environ.get("SLURM_NODEID", "")
        if not given.isdigit():
            raise UserError(f"--nodes {nodes}: say which machine this is with --node-rank (0 … {nodes - 1})")
        rank = int(given)
    if rank >= nodes:
        raise UserError(f"--node-rank {rank}: the run spans {nodes} machines, ranked 0 … {nodes - 1}")
    return rank


def _machines(folder: Path, nodes: int | None, host: str | None) -> LeaderMachines | None:
    """Node 0's reach to the other machines of a run over several."""
    from gpuwarden.job.leader import LeaderMachines

    if nodes is None or nodes == 1:
        return None
    return LeaderMachines(folder, nodes, host or socket.gethostname())


def _follow(run_dir: Path, rank: int) -> int:
    """Machine `rank` > 0 of a run over several: start its part of each attempt node 0 plans, end
    as the run ends. A signal is node 0's to act on (a job signals every machine)."""
    from gpuwarden.core.private import make_dirs
    from gpuwarden.daemon.process import LocalProcesses
    from gpuwarden.job.follower import NodeFollower
    from gpuwarden.job.lock import RunLock

    make_dirs(run_dir)
    RunLock(run_dir / f"exec.node{rank}.lock", run_dir / f"exec.node{rank}.pid").acquire()

    def say(line: str) -> None:
        click.echo(line, err=True)

    def handler(signum: int, frame: object) -> None:
        say(
            f"node {rank}: {signal.Signals(signum).name} — node 0's exec stops the run, and this part with it"
        )

    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)
    return NodeFollower(run_dir, rank, LocalProcesses(), say).run()


def _requeue(limit: int) -> None:
    """Queue this Slurm job again so the next run of it goes on from the checkpoint, unless its
    requeues are used up (SLURM_RESTART_COUNT) or Slurm is requeueing it already (a preemption)."""
    from gpuwarden.slurm.environment import current_job, requeue

    job = current_job()
    if job is None:
        click.echo("--slurm-requeue: not in a Slurm job (no SLURM_JOB_ID): nothing requeued", err=True)
        return
    if job.restart_count >= limit:
        click.echo(
            f"Slurm job {job.job_id}: requeued {job.restart_count} times already, the most asked", err=True
        )
        return
    try:
        requeue(job.job_id)
    except UserError as exc:  # already being requeued from outside, or the job cannot be
        click.echo(f"Slurm job {job.job_id} not requeued: {exc.message}", err=True)
        return
    done = f"requeued ({job.restart_count + 1} of {limit}): it goes on from the checkpoint"
    click.echo(f"Slurm job {job.job_id} {done}", err=True)


def _supervise(host: JobHost, spec: RunSpec | None, text: str | None, label: str, run_id: str | None) -> int:
    with _stopping_on_signals(host):
        if not host.has_run:
            if spec is None:
                raise UserError(
                    f"{host.run_dir}: holds no run — start one with `gpuwarden exec SPEC.yaml --run DIR`"
                )
            run = host.submit(spec, text, label, run_id)
            since, printed = 0, {}
        else:
            # What the exec before printed (into the same job log) is not printed again.
            reader = RunFolders.one(host.run_dir)
            since, printed = _last_event(reader, host.run_id), printed_so_far(reader, host.run_id)
            run = host.go_on()
        host.note_job()
        click.echo(
            f"{run['id']}  {run['name']}  in {host.run_dir} — take it up again with: "
            f"gpuwarden exec --run {host.run_dir}",
            err=True,
        )
        follow_run(RunFolders.one(host.run_dir), host.run_id, as_json=False, since=since, printed=printed)
    code: int = host.exit_code()
    if host.stopped_for is not None and code != 0:
        click.echo(
            f"stopped at a checkpoint ({host.stopped_for}): exit {code} — start it again to go on", err=True
        )
    return code


def _last_event(reader: RunFolders, run_id: str) -> int:
    """The id of the run's newest event: what an exec taking it up again does not print again."""
    since = 0
    while True:
        page = reader.events(run_id, since=since, limit=10_000)
        if not page.events:
            return since
        since = page.next_since


@contextlib.contextmanager
def _stopping_on_signals(host: JobHost) -> Iterator[None]:
    """SIGTERM, SIGINT and SIGUSR1 stop the run at a checkpoint while this block runs."""

    def handler(signum: int, frame: object) -> None:
        host.stop(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
