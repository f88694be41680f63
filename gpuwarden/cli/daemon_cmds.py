"""`gpuwarden daemon | up | down | status`: run, start, stop and query the daemon.

`daemon` must stay light: it imports the daemon (never httpx, whose CLI extras pull in rich);
the others are clients and import gpuwarden.client lazily.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from gpuwarden.cli.format import print_json
from gpuwarden.core.errors import UserError
from gpuwarden.core.paths import Paths
from gpuwarden.core.private import make_dirs

if TYPE_CHECKING:
    from gpuwarden.core.api import Health
    from gpuwarden.daemon.lock import InstanceLock

UP_TIMEOUT_S = 15.0
# The daemon exits at most this long after a stop was asked for; `down` waits a little longer.
SHUTDOWN_DEADLINE_S = 15.0
DOWN_TIMEOUT_S = 25.0


def _paths() -> Paths:
    from gpuwarden.core.config.settings import load_settings

    return load_settings().resolve_paths()


@click.command()
@click.option(
    "--sample-interval", type=float, default=None, help="Seconds between samples (overrides config)."
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default=None,
    help="Log verbosity.",
)
# The descriptor of the instance lock `gpuwarden up` took for this daemon before starting it.
@click.option("--lock-fd", type=int, default=None, hidden=True)
def daemon(sample_interval: float | None, log_level: str | None, lock_fd: int | None) -> None:
    """Run the daemon in the foreground (logs to stderr; for systemd or a terminal)."""
    from gpuwarden.core.config.settings import load_settings

    settings = load_settings(flags={"sample_interval": sample_interval, "log_level": log_level})
    paths = settings.resolve_paths()
    # Before the server is loaded: a daemon started beside a running one ends at once.
    lock = _instance_lock(paths, lock_fd)
    logging.basicConfig(
        level=settings.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from gpuwarden.daemon.daemon import Daemon

    instance = Daemon(settings, paths, lock=lock)
    threading.Thread(target=_exit_if_stuck, args=(instance,), name="shutdown-deadline", daemon=True).start()
    code = 0
    try:
        instance.run()
    except UserError as exc:
        click.echo(f"gpuwarden: {exc.message}", err=True)
        code = 2
    except Exception:
        logging.getLogger("gpuwarden.daemon").exception("the daemon failed")
        code = 1
    if instance.lost_socket:
        code = 1  # not a stop anyone asked for: a service manager restarts it with a new socket
    _exit_now(code)


def _instance_lock(paths: Paths, inherited: int | None) -> InstanceLock:
    """The daemon's lock, held; or the process ends saying why it cannot be."""
    from gpuwarden.daemon.lock import DaemonRunning, InstanceLock

    lock = InstanceLock(paths.lock_file, paths.pid_file)
    try:
        lock.acquire(inherited)
    except DaemonRunning as exc:
        click.echo(f"gpuwarden: {exc}", err=True)
        _exit_now(1)
    except UserError as exc:
        click.echo(f"gpuwarden: {exc.message}", err=True)
        _exit_now(2)
    return lock


def _exit_now(code: int) -> NoReturn:
    """End the process without waiting for request threads still running: what must persist was
    flushed by the daemon's close, and only the process's exit releases the instance lock."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _exit_if_stuck(instance: Any) -> None:
    """Bound the shutdown: SHUTDOWN_DEADLINE_S after the stop was asked for, exit regardless."""
    while not instance.stopping:
        time.sleep(0.5)
    time.sleep(SHUTDOWN_DEADLINE_S)
    logging.getLogger("gpuwarden.daemon").error(
        "shutdown took longer than %.0f s: exiting now (runs keep running)", SHUTDOWN_DEADLINE_S
    )
    _exit_now(1)


def _health(paths: Paths) -> Health | None:
    from gpuwarden.client import ApiClient

    if not paths.socket.exists():
        return None
    try:
        with ApiClient(paths.socket, timeout=5.0) as client:
            return client.health()
    except UserError as exc:
        if exc.code == "not_running":
            return None
        raise


def _log_tail(path: Path, lines: int = 15) -> str:
    # The log of every daemon this user ran: only its end is read.
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def up(as_json: bool) -> None:
    """Start the daemon in the background unless it runs; wait until it answers."""
    paths = _paths()
    health = _health(paths)
    if health is not None:
        _report_up(health, paths, as_json, started=False)
        return
    deadline = time.monotonic() + UP_TIMEOUT_S
    proc: subprocess.Popen[bytes] | None = None
    while True:
        if proc is None:
            # None while another daemon holds the lock: one starting (another `up`'s), or one
            # that runs without answering yet. Wait for it; start one if it goes away instead.
            proc = _start_unless_locked(paths)
        elif (code := proc.poll()) is not None:
            raise UserError(_why_it_exited(code, _log_tail(paths.daemon_log), paths.daemon_log))
        health = _health(paths)
        if health is not None:
            _report_up(health, paths, as_json, started=proc is not None and health.pid == proc.pid)
            return
        if time.monotonic() > deadline:
            raise UserError(f"the daemon did not answer within {UP_TIMEOUT_S:.0f} s — see {paths.daemon_log}")
        time.sleep(0.05)


def _start_unless_locked(paths: Paths) -> subprocess.Popen[bytes] | None:
    """Take the daemon's lock and start a daemon holding it; None while another process holds
    it. Only the lock's holder starts one, so `up`s typed at once start one daemon between them."""
    from gpuwarden.daemon.lock import take_lock, write_pid

    lock_fd = take_lock(paths.lock_file)
    if lock_fd is None:
        return None
    try:
        log_fd = _open_log(paths)
        try:
            proc = subprocess.Popen(
                # -P: the folder `up` is typed in may hold another gpuwarden checkout; the daemon
                # must be the installed one the CLI is, not whatever `-m` finds there first.
                [sys.executable, "-P", "-m", "gpuwarden", "daemon", "--lock-fd", str(lock_fd)],
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=log_fd,
                start_new_session=True,
                close_fds=True,
                pass_fds=(lock_fd,),
            )
        finally:
            os.close(log_fd)
        # The daemon rewrites it once it runs; until then `down` finds this process, not an old one.
        write_pid(paths.pid_file, proc.pid)
    finally:
        os.close(lock_fd)  # the daemon's copy keeps the lock
    return proc


def _open_log(paths: Paths) -> int:
    try:
        make_dirs(paths.state_dir)
        return os.open(paths.daemon_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    except OSError as exc:  # a file in the way, a read-only mount, a folder of another user
        raise UserError(
            f"paths.state_dir: cannot write {exc.filename} ({exc.strerror or exc}) — "
            "set paths.state_dir to a place you can write"
        ) from None


def _why_it_exited(code: int, tail: str, log: Path) -> str:
    """The daemon's own one-line refusal when it gave one (`gpuwarden: …` as the last line of its
    log's `tail`), else its exit status and the end of its log."""
    last = tail.splitlines()[-1] if tail.strip() else ""
    if last.startswith("gpuwarden: "):
        return last.removeprefix("gpuwarden: ")
    return f"the daemon exited with status {code}; last lines of {log}:\n{tail}"


def _report_up(health: Health, paths: Paths, as_json: bool, started: bool) -> None:
    if as_json:
        print_json({"started": started, "pid": health.pid, "log": str(paths.daemon_log), "health": health})
        return
    verb = "started" if started else "already running"
    click.echo(f"gpuwarden daemon {verb} (pid {health.pid}), logging to {paths.daemon_log}")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def down(as_json: bool) -> None:
    """Stop the daemon cleanly. Runs keep running; the next daemon re-adopts them."""
    from gpuwarden.daemon.lock import lock_holder_alive, read_pid

    paths = _paths()
    pid = read_pid(paths.pid_file)
    if not lock_holder_alive(paths.lock_file):
        if as_json:
            print_json({"stopped": False, "was_running": False})
        else:
            click.echo("gpuwarden daemon is not running")
        return
    try:
        from gpuwarden.client import ApiClient

        with ApiClient(paths.socket, timeout=5.0) as client:
            pid = client.shutdown().pid
    except UserError:
        if pid is None:
            raise UserError(
                f"the daemon holds {paths.lock_file} but has no pid file — stop it by hand"
            ) from None
        os.kill(pid, signal.SIGTERM)
    # The daemon holds its lock until its process exits: a free lock means the process is gone.
    deadline = time.monotonic() + DOWN_TIMEOUT_S
    while lock_holder_alive(paths.lock_file):
        if time.monotonic() > deadline:
            raise UserError(
                f"the daemon (pid {pid}) has not exited {DOWN_TIMEOUT_S:.0f} s after being asked to stop"
                f" — see {paths.daemon_log}; `kill -9 {pid}` ends it (runs keep running)"
            )
        time.sleep(0.05)
    if as_json:
        print_json({"stopped": True, "was_running": True, "exited": True, "pid": pid})
    else:
        click.echo(
            f"gpuwarden daemon stopped (pid {pid} has exited); runs keep running and are re-adopted "
            "by the next daemon"
        )


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "--socket",
    "socket_only",
    is_flag=True,
    help="Print only the API socket's path (works while the daemon is down), for curl --unix-socket.",
)
def status(as_json: bool, socket_only: bool) -> None:
    """The daemon's version, uptime and GPU status, its database and socket, and runs by state."""
    from gpuwarden.client import ApiClient, default_socket

    if socket_only:
        click.echo(str(default_socket()))
        return

    with ApiClient() as client:
        health = client.health()
        runs = client.runs()
    counts: dict[str, int] = {}
    for run in runs:
        counts[str(run.state)] = counts.get(str(run.state), 0) + 1
    if as_json:
        print_json({"daemon": health, "runs": counts})
        return
    click.echo(
        f"gpuwarden daemon {health.version} (API {health.api_version}), pid {health.pid},"
        f" up {_duration(health.uptime_s)}"
    )
    click.echo(f"health: {health.status}" + (f" — {health.fault}" if health.fault else ""))
    click.echo(f"gpus: {health.gpu_status}")
    click.echo(f"db: {health.db}")
    click.echo(f"socket: {health.socket}")
    summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "none"
    click.echo(f"runs: {summary}")


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"
