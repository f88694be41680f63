"""The batch script that runs one command as a Slurm job, written to be read.

`sbatch_script(options, command)` is pure: each `#SBATCH` line comes with a comment saying what
it is for, and the last line `exec`s the command, so the USR1 of `--signal=B:USR1@lead` reaches
the command itself (bash runs a trap only after its foreground child returns). On several nodes
the last line `exec`s `srun`, which runs one copy per node and passes the signal on to each.
"""

from __future__ import annotations

import re
import shlex
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from gpuwarden.core.errors import UserError

# sbatch keeps a signal's lead time in 16 bits.
MAX_SIGNAL_LEAD_S = 65535
# slurmctld checks time limits this often, and sends the warning at the first check less than
# lead + this before the limit (docs/decisions.md, Slurm).
TIME_LIMIT_CHECK_S = 30
COMMENT_WIDTH = 96
_LONG_OPTION = re.compile(r"--[A-Za-z][A-Za-z0-9-]*(=.*)?", re.DOTALL)
_SHORT_OPTION = re.compile(r"-[A-Za-z].*", re.DOTALL)


@dataclass(frozen=True)
class SbatchOptions:
    """What the job asks Slurm for. None or False leaves a setting to the cluster's default."""

    job_name: str | None = None
    # Slurm's file name pattern for stdout and stderr (`%j` the job id, `%x` its name).
    output: str | None = None
    time: timedelta | None = None
    nodes: int = 1
    # CPUs are set aside for this many processes on each node; the command starts its own.
    ntasks_per_node: int = 1
    gpus_per_node: int | None = None
    partition: str | None = None
    requeue: bool = False
    open_mode_append: bool = False
    # SIGUSR1 to the batch shell (the command, once exec'd) this many seconds before the limit.
    signal_lead_s: int | None = None
    # Raw sbatch options given after `--`, kept verbatim: a value may be its own token.
    extra: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("nodes", "ntasks_per_node", "gpus_per_node"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UserError(f"{name} is {value}: give 1 or more")
        for name in ("job_name", "output", "partition"):
            value = getattr(self, name)
            if value is not None:
                _directive_value(value, name)
        _check_time(self.time, self.signal_lead_s)
        _extra_lines(self.extra)


def sbatch_script(options: SbatchOptions, command: Sequence[str]) -> str:
    """The batch script that runs `command` (an argv) under `options`."""
    if not command:
        raise UserError("no command for the job to run: give one, e.g. `python train.py`")
    for arg in command:
        if "\0" in arg:
            raise UserError(
                f"command argument {arg!r} holds a NUL character, which bash cannot pass: remove it"
            )
    lines = ["#!/bin/bash", "# A Slurm batch job written by gpuwarden: it runs the one command at the end."]
    for comment, directive in _directives(options):
        lines += [f"# {part}" for part in textwrap.wrap(comment, COMMENT_WIDTH)]
        lines.append(f"#SBATCH {directive}")
    return "\n".join([*lines, "", *_launch(options, command)]) + "\n"


def format_time(limit: timedelta) -> str:
    """A time limit as sbatch reads it: days-hours:minutes:seconds."""
    total = int(limit.total_seconds())
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{seconds:02d}"


def _directives(options: SbatchOptions) -> list[tuple[str, str]]:
    """(comment, option) for each `#SBATCH` line, in the order a reader looks for them."""
    found: list[tuple[str, str]] = []
    if options.job_name is not None:
        found.append(("The name squeue shows.", f"--job-name={_directive_value(options.job_name)}"))
    if options.output is not None:
        found.append(
            ("Where stdout and stderr go (%j: the job id).", f"--output={_directive_value(options.output)}")
        )
    if options.open_mode_append:
        found.append(("A requeued run appends to that file instead of emptying it.", "--open-mode=append"))
    if options.time is not None:
        found.append(
            (
                "Slurm ends the job after this long (days-hours:minutes:seconds).",
                f"--time={format_time(options.time)}",
            )
        )
    found += _resources(options)
    if options.requeue:
        found.append(
            (
                "Slurm may queue the job again: after a node failure, a preemption, or `scontrol requeue`.",
                "--requeue",
            )
        )
    if options.signal_lead_s is not None:
        found.append(
            (
                f"SIGUSR1 to the command {options.signal_lead_s} s before the time limit (up to"
                f" {TIME_LIMIT_CHECK_S} s earlier: Slurm checks time limits that often): it checkpoints,"
                " and may ask to be requeued.",
                f"--signal=B:USR1@{options.signal_lead_s}",
            )
        )
    found += [("Given after `--`, as given.", line) for line in _extra_lines(options.extra)]
    return found


def _resources(options: SbatchOptions) -> list[tuple[str, str]]:
    found = [
        ("Nodes the job runs on.", f"--nodes={options.nodes}"),
        ("Processes on each node Slurm sets CPUs aside for.", f"--ntasks-per-node={options.ntasks_per_node}"),
    ]
    if options.gpus_per_node is not None:
        found.append(("GPUs on each node.", f"--gpus-per-node={options.gpus_per_node}"))
    if options.partition is not None:
        found.append(
            ("The partition (queue) to run in.", f"--partition={_directive_value(options.partition)}")
        )
    return found


def _launch(options: SbatchOptions, command: Sequence[str]) -> list[str]:
    if options.nodes == 1:
        return [
            "# The command replaces this shell: the signals Slurm sends the batch shell reach it, and",
            "# its exit status is the job's.",
            f"exec {shlex.join(command)}",
        ]
    # Without --ntasks, srun would take the job's task count (nodes × ntasks-per-node) and
    # ignore --ntasks-per-node=1.
    return [
        "# One copy of the command on each node (it starts that node's processes). srun replaces this",
        "# shell and passes the signals it gets on to every copy; when one copy fails it ends the others.",
        'exec srun --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --kill-on-bad-exit=1 '
        + shlex.join(command),
    ]


def _check_time(limit: timedelta | None, lead_s: int | None) -> None:
    if limit is not None and limit <= timedelta(0):
        raise UserError(f"time limit {limit} is not positive: give the job's run time, e.g. 4:00:00")
    if lead_s is None:
        return
    if not 1 <= lead_s <= MAX_SIGNAL_LEAD_S:
        raise UserError(f"signal lead {lead_s} s is out of range: give 1 to {MAX_SIGNAL_LEAD_S} seconds")
    if limit is not None and limit.total_seconds() - lead_s <= TIME_LIMIT_CHECK_S:
        raise UserError(
            f"signal lead {lead_s} s leaves {max(0, int(limit.total_seconds()) - lead_s)} s of the time limit"
            f" {format_time(limit)}: Slurm may send the signal up to {TIME_LIMIT_CHECK_S} s early, before the"
            f" command has started; give a time limit over lead + {TIME_LIMIT_CHECK_S} s or a shorter lead"
        )


def _directive_value(value: str, what: str = "value") -> str:
    """`value` as it can stand on an `#SBATCH` line: quoted when it holds a space."""
    if any(char in value for char in '\n\r\0"'):
        raise UserError(
            f"{what} {value!r} holds a line break, NUL or double quote, which an #SBATCH line cannot"
            " carry: remove it"
        )
    if value == "":
        raise UserError(f"{what} is empty: give a value or leave it out")
    return f'"{value}"' if any(char.isspace() for char in value) else value


def _extra_lines(tokens: Sequence[str]) -> list[str]:
    """Raw options as `#SBATCH` lines: an option, and its value when that is the next token."""
    lines: list[list[str]] = []
    for token in tokens:
        quoted = _directive_value(token, "sbatch option")
        if _LONG_OPTION.fullmatch(token) or _SHORT_OPTION.fullmatch(token):
            lines.append([quoted])
        elif lines and len(lines[-1]) == 1 and "=" not in lines[-1][0]:
            lines[-1].append(quoted)
        else:
            raise UserError(
                f"{token!r} is not an sbatch option: options after `--` start with - or --"
                " (a value follows its option, e.g. `--qos high` or `--qos=high`)"
            )
    return [" ".join(line) for line in lines]
