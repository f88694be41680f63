"""`gpuwarden` command group. Subcommands live in their own modules and load on first use."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from gpuwarden import __version__
from gpuwarden.core.errors import UserError

# name → "module:attribute"; a module is imported only when its command runs or is listed in help.
COMMANDS: dict[str, str] = {
    "monitor": "gpuwarden.cli.monitor:monitor",
    "gpus": "gpuwarden.cli.gpus:gpus",
    "tui": "gpuwarden.cli.tui:tui",
    "service": "gpuwarden.cli.service:service",
    "tune": "gpuwarden.cli.tune:tune",
    "example-models": "gpuwarden.cli.examples:example_models",
    # daemon and runs
    "daemon": "gpuwarden.cli.daemon_cmds:daemon",
    "up": "gpuwarden.cli.daemon_cmds:up",
    "down": "gpuwarden.cli.daemon_cmds:down",
    "status": "gpuwarden.cli.daemon_cmds:status",
    "ps": "gpuwarden.cli.runs_cmds:ps",
    "run": "gpuwarden.cli.runs_cmds:run_cmd",
    "show": "gpuwarden.cli.runs_cmds:show",
    "stop": "gpuwarden.cli.runs_cmds:stop",
    "resume": "gpuwarden.cli.runs_cmds:resume",
    "logs": "gpuwarden.cli.runs_cmds:logs",
    "events": "gpuwarden.cli.runs_cmds:events",
    "rm": "gpuwarden.cli.runs_cmds:rm",
    "history": "gpuwarden.cli.runs_cmds:history",
    "clean": "gpuwarden.cli.clean:clean",
    # diagnosis and reports
    "doctor": "gpuwarden.cli.doctor:doctor",
    "report": "gpuwarden.cli.report:report",
    "compare": "gpuwarden.cli.compare:compare",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS:
            module_name, attr = COMMANDS[cmd_name].split(":")
            command = getattr(importlib.import_module(module_name), attr)
            assert isinstance(command, click.Command)
            return command
        return super().get_command(ctx, cmd_name)


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
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
