"""`gpuwarden` command group. Subcommands live in their own modules and load on first use."""

from __future__ import annotations

import difflib
import importlib
import re
import sqlite3
import sys
from dataclasses import dataclass
from typing import Any

import click

from gpuwarden import __version__
from gpuwarden.core.errors import UserError


@dataclass(frozen=True)
class Entry:
    """A subcommand: where it lives ("module:attribute") and the one line `gpuwarden --help` shows."""

    target: str
    summary: str


# Sections in the order `gpuwarden --help` lists them. A module is imported only when its command
# runs (the summaries are here so the overview does not import every command to describe it).
SECTIONS: dict[str, dict[str, Entry]] = {
    "Runs": {
        "run": Entry("gpuwarden.cli.runs_cmds:run_cmd", "Submit a run spec (or a command) to the daemon"),
        "ps": Entry("gpuwarden.cli.runs_cmds:ps", "List runs with their state and attempt"),
        "show": Entry("gpuwarden.cli.show:show", "A run's spec, attempts, retunes and report"),
        "logs": Entry("gpuwarden.cli.runs_cmds:logs", "Print a run's output; -f follows it"),
        "events": Entry("gpuwarden.cli.runs_cmds:events", "A run's events: states, progress, retunes"),
        "stop": Entry("gpuwarden.cli.runs_cmds:stop", "Stop a run (it checkpoints first)"),
        "resume": Entry("gpuwarden.cli.runs_cmds:resume", "Resume a failed, stopped or interrupted run"),
        "rerun": Entry("gpuwarden.cli.rerun:rerun", "A new run from a run's spec, with knobs changed"),
        "rm": Entry("gpuwarden.cli.runs_cmds:rm", "Forget finished runs and delete their files"),
    },
    "Inside a cluster job": {
        "exec": Entry("gpuwarden.cli.exec_cmd:exec_cmd", "Supervise one run in the foreground, no daemon"),
        "slurm": Entry("gpuwarden.cli.slurm_cmds:slurm", "Submit a run as a Slurm job that requeues itself"),
    },
    "Tuning and diagnosis": {
        "tune": Entry("gpuwarden.cli.tune:tune", "Probe for the fastest settings that fit"),
        "doctor": Entry("gpuwarden.cli.doctor:doctor", "Find what slows a spec or a run, and fix it"),
        "report": Entry("gpuwarden.cli.report:report", "A run's performance report"),
        "compare": Entry("gpuwarden.cli.compare:compare", "Two runs side by side, with ratios"),
    },
    "GPUs": {
        "tui": Entry("gpuwarden.cli.tui:tui", "Open the dashboard (bare `gpuwarden` does too)"),
        "monitor": Entry("gpuwarden.cli.monitor:monitor", "Watch GPUs live, then a summary and verdict"),
        "gpus": Entry("gpuwarden.cli.gpus:gpus", "List GPUs with a reading each"),
        "history": Entry("gpuwarden.cli.runs_cmds:history", "Stored metric history of GPUs or the host"),
        "clean": Entry("gpuwarden.cli.clean:clean", "Terminate your own stray GPU processes"),
    },
    "The daemon": {
        "up": Entry("gpuwarden.cli.daemon_cmds:up", "Start the daemon in the background"),
        "down": Entry("gpuwarden.cli.daemon_cmds:down", "Stop the daemon (runs keep running)"),
        "status": Entry("gpuwarden.cli.daemon_cmds:status", "The daemon's health, GPUs, database, socket"),
        "hosts": Entry("gpuwarden.cli.hosts_cmds:hosts", "Check the hosts --host/--all-hosts reach over ssh"),
        "daemon": Entry("gpuwarden.cli.daemon_cmds:daemon", "Run the daemon in the foreground"),
        "service": Entry("gpuwarden.cli.service:service", "Install or remove the systemd user unit"),
        "notify": Entry("gpuwarden.cli.notify_cmds:notify", "Test the notifications the daemon sends"),
        "example-models": Entry(
            "gpuwarden.cli.examples:example_models", "Build the tiny local models the examples use"
        ),
    },
}
COMMANDS: dict[str, Entry] = {name: entry for section in SECTIONS.values() for name, entry in section.items()}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS:
            module_name, attr = COMMANDS[cmd_name].target.split(":")
            command = getattr(importlib.import_module(module_name), attr)
            assert isinstance(command, click.Command)
            return command
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        for title, entries in SECTIONS.items():
            with formatter.section(title):
                formatter.write_dl([(name, entry.summary) for name, entry in entries.items()])


@click.group(
    cls=LazyGroup, invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(__version__, prog_name="gpuwarden")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Watch NVIDIA GPUs, keep their history, and supervise runs that retune themselves."""
    if ctx.invoked_subcommand is None:
        # Bare `gpuwarden`: the dashboard on a terminal, the help text anywhere else (pipes, scripts).
        if sys.stdin.isatty() and sys.stdout.isatty():
            dashboard = cli.get_command(ctx, "tui")
            assert dashboard is not None
            ctx.invoke(dashboard)
        else:
            click.echo(ctx.get_help())


def _command_path(exc: click.UsageError, args: list[str]) -> str:
    """The command a usage error belongs to. Click's parser raises some (an option given without
    its value) before it knows the command: the first word naming one says it."""
    if exc.ctx is not None:
        return exc.ctx.command_path
    named = next((word for word in args if not word.startswith("-")), None)
    return f"gpuwarden {named}" if named in COMMANDS else "gpuwarden"


def usage_line(exc: click.UsageError, args: list[str] | None = None) -> str:
    """Click's usage error as one line, with where the help is (click prints four lines)."""
    where = _command_path(exc, sys.argv[1:] if args is None else args)
    if isinstance(exc, click.NoSuchOption):
        close = [f"`{name}`" for name in (exc.possibilities or [])[:3]]
        hint = f"did you mean {' or '.join(close)}?" if close else f"`{where} --help` lists them"
        return f"no option '{exc.option_name}' — {hint}"
    message = exc.format_message().rstrip(".")
    unknown = re.fullmatch(r"No such command '(.+)'", message)
    if unknown:
        close = difflib.get_close_matches(unknown[1], list(COMMANDS), n=1, cutoff=0.7)
        hint = f"did you mean `gpuwarden {close[0]}`?" if close else "`gpuwarden --help` lists them"
        return f"no command '{unknown[1]}' — {hint}"
    for click_words, plain in _TYPE_WORDS:
        message = message.replace(click_words, plain)
    return f"{message} — see `{where} --help`"


# Click names its parameter types ("'abc' is not a valid float range"); a person reads a number.
_TYPE_WORDS = (
    ("is not a valid float range", "is not a number"),
    ("is not a valid integer range", "is not a whole number"),
    ("is not a valid float", "is not a number"),
    ("is not a valid integer", "is not a whole number"),
)


_DAMAGED = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}


def main(argv: list[str] | None = None) -> Any:
    """Console entry point: user errors are one line on stderr (exit 2), never a traceback."""
    try:
        return cli.main(args=argv, prog_name="gpuwarden", standalone_mode=False)
    except UserError as exc:
        for line in str(exc).splitlines() or ["error"]:
            click.echo(f"gpuwarden: {line}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.UsageError as exc:
        click.echo(f"gpuwarden: {usage_line(exc, argv)}", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorcode", None) not in _DAMAGED:
            raise
        # A file given with --db that opened but is damaged further in: the disk's fault, not ours.
        click.echo(
            f"gpuwarden: the database is damaged ({exc}) — `sqlite3 FILE .recover` saves what still "
            "reads; give --db another copy",
            err=True,
        )
        sys.exit(2)
