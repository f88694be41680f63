"""`gpuwarden tui` (and bare `gpuwarden` on a terminal): the dashboard.

Textual and the dashboard load inside the command, so `gpuwarden --help` and the daemon's own
start stay light (tests/test_layers.py imports every CLI module and checks).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from gpuwarden.cli.fleet_option import chosen_hosts, hosts_option
from gpuwarden.core.errors import UserError

if TYPE_CHECKING:
    from gpuwarden.tui.backend import DashboardBackend

# What the user may answer when no daemon runs.
START, BROWSE, QUIT = "s", "b", "q"


def default_db() -> Path:
    from gpuwarden.core.config.settings import load_settings

    return load_settings().resolve_paths().db


def start_daemon() -> None:
    """`gpuwarden up` as a child process; it returns once the daemon answers."""
    # -P: not a gpuwarden/ folder of the current directory instead of the installed package
    code = subprocess.run([sys.executable, "-P", "-m", "gpuwarden", "up"], check=False).returncode
    if code != 0:
        raise UserError(f"`gpuwarden up` failed (exit {code}) — see `gpuwarden status` and the daemon log")


def choose_backend(
    db_path: Path | None,
    *,
    interactive: bool,
    connect: Callable[[], DashboardBackend],
    open_db: Callable[[Path], DashboardBackend],
    ask: Callable[[str, list[str]], str],
    start: Callable[[], None],
    fallback_db: Path | None,
) -> tuple[DashboardBackend, bool]:
    """The backend to show and whether it is read-only.

    With --db: that database, read-only. Otherwise the daemon; when none runs and we are on a
    terminal, offer to start one or to browse the database it left behind.
    """
    if db_path is not None:
        return open_db(db_path), True
    try:
        return connect(), False
    except UserError as exc:
        if exc.code != "not_running" or not interactive:
            raise
        choices = [START, QUIT]
        prompt = f"{exc} \n[s] start it now"
        if fallback_db is not None and fallback_db.exists():
            choices.insert(1, BROWSE)
            prompt += f"   [b] browse {fallback_db} read-only"
        prompt += "   [q] quit"
        answer = ask(prompt, choices)
        if answer == START:
            start()
            return connect(), False
        if answer == BROWSE and fallback_db is not None:
            return open_db(fallback_db), True
        raise click.exceptions.Abort() from None


def _connect() -> DashboardBackend:
    from gpuwarden.client import ApiClient
    from gpuwarden.tui.api_backend import ApiBackend

    client = ApiClient()
    try:
        client.check_version()
    except UserError:
        client.close()
        raise
    return ApiBackend(client)


def _open_db(path: Path) -> DashboardBackend:
    from gpuwarden.tui.db_backend import DbBackend

    return DbBackend(path)


def _open_runs(root: Path) -> DashboardBackend:
    from gpuwarden.tui.runs_backend import RunsBackend

    return RunsBackend(root)


def _open_hosts(names: list[str]) -> DashboardBackend:
    """Every named host's daemon, each reached on its own (the app closes the ssh tunnels)."""
    from gpuwarden.client.hosts import Fleet
    from gpuwarden.client.ssh_forward import SshCommand
    from gpuwarden.core.config.settings import load_settings
    from gpuwarden.tui.fleet_backend import FleetBackend

    settings = load_settings()
    return FleetBackend(Fleet(names, SshCommand.of(settings.ssh), settings.resolve_paths().runtime_dir))


def _ask(prompt: str, choices: list[str]) -> str:
    return str(click.prompt(prompt, type=click.Choice(choices), default=choices[0], err=True))


@click.command()
@click.option(
    "--db",
    "db_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Browse this database read-only instead of connecting to the daemon.",
)
@click.option(
    "--runs",
    "runs_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Browse the run folders in DIR (gpuwarden exec's, in cluster jobs) read-only instead.",
)
@click.option("--readonly", is_flag=True, help="Watch only: no control (stop, submit, …) is offered.")
@hosts_option
@click.option(
    "--log",
    "log_path",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Append what the dashboard told you, its connections and why a live stream ended to this file.",
)
def tui(
    db_path: Path | None,
    runs_dir: Path | None,
    readonly: bool,
    hosts: tuple[str, ...],
    all_hosts: bool,
    log_path: Path | None,
) -> None:
    """Open the dashboard: GPUs, runs and history, live from the daemon (works over SSH); with
    --host, of several hosts' daemons at once."""
    if db_path is not None and runs_dir is not None:
        raise UserError("--db and --runs: give one (--db reads one database, --runs every run folder in DIR)")
    names = chosen_hosts(hosts, all_hosts)
    if names and (db_path is not None or runs_dir is not None):
        raise UserError("--host reads daemons, --db and --runs stored runs: give one of them")
    if log_path is not None:
        from gpuwarden.tui.session_log import open_session_log

        open_session_log(log_path)
    if names:
        backend, forced = _open_hosts(names), False
    elif runs_dir is not None:
        backend, forced = _open_runs(runs_dir), True
    else:
        backend, forced = _daemon_or_db(db_path)
    from gpuwarden.tui.app import GpuwardenApp

    GpuwardenApp(backend, readonly=readonly or forced, cwd=Path.cwd()).run()


def _daemon_or_db(db_path: Path | None) -> tuple[DashboardBackend, bool]:
    """The daemon, or the database `--db` names (or the one the user chose to browse)."""
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    fallback: Path | None = None
    if db_path is None:
        try:
            fallback = default_db()
        except UserError:
            fallback = None  # a broken config: the daemon offer still works, browsing does not
    return choose_backend(
        db_path,
        interactive=interactive,
        connect=_connect,
        open_db=_open_db,
        ask=_ask,
        start=start_daemon,
        fallback_db=fallback,
    )
