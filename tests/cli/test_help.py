"""`gpuwarden --help` as a newcomer reads it: every command listed once, in full, within 80 columns."""

from __future__ import annotations

import os
import sys

import click
import pytest

from gpuwarden.cli.main import COMMANDS, SECTIONS, LazyGroup, cli
from tests import preloaded


def _help(*args: str) -> str:
    env = {**os.environ, "COLUMNS": "80"}
    done = preloaded.run([sys.executable, "-m", "gpuwarden", *args, "--help"], env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_overview_lists_every_command_once_and_cuts_nothing() -> None:
    text = _help()
    assert "…" not in text and "..." not in text.split("Options:")[1]
    assert all(len(line) <= 80 for line in text.splitlines())
    sections = text.split("Options:")[1].split("\n\n")[1:]
    commands = [line.split()[0] for part in sections for line in part.splitlines()[1:] if line.strip()]
    assert sorted(commands) == sorted(COMMANDS) and len(commands) == len(set(commands))
    for title in SECTIONS:
        assert f"{title}:" in text


def test_every_entry_resolves_to_a_command_with_its_own_help() -> None:
    ctx = click.Context(cli)
    assert isinstance(cli, LazyGroup)
    for name in COMMANDS:
        command = cli.get_command(ctx, name)
        assert command is not None and command.help, name


@pytest.mark.parametrize("command", ["tune", "run", "doctor", "history"])
def test_every_option_of_a_command_says_what_it_does(command: str) -> None:
    ctx = click.Context(cli)
    sub = cli.get_command(ctx, command)
    assert sub is not None
    silent = [p.name for p in sub.params if isinstance(p, click.Option) and not p.help]
    assert silent == [], f"{command}: options without help: {silent}"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["stauts"], "no command 'stauts' — did you mean `gpuwarden status`?"),
        (["frobnicate"], "no command 'frobnicate' — `gpuwarden --help` lists them"),
        (["ps", "--frobnicate"], "no option '--frobnicate' — `gpuwarden ps --help` lists them"),
        (["ps", "--jsn"], "no option '--jsn' — did you mean `--json`?"),
        (["run", "--folow", "--", "true"], "no option '--folow' — did you mean `--follow` or `--role`?"),
        (
            ["monitor", "--interval", "0"],
            "Invalid value for '--interval': 0.0 is not in the range 0.05<=x<=3600",
        ),
        (["show"], "Missing argument 'RUN' — see `gpuwarden show --help`"),
        (
            ["doctor", "spec.yaml", "--fix"],
            "Option '--fix' requires an argument — see `gpuwarden doctor --help`",
        ),
    ],
)
def test_a_usage_mistake_is_one_line_naming_the_help(args: list[str], says: str) -> None:
    done = preloaded.run([sys.executable, "-m", "gpuwarden", *args])
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"gpuwarden: {says}") and done.stderr.count("\n") == 1, done.stderr
