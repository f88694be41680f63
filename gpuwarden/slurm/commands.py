"""Slurm's command-line tools run with a bound on their time, and their refusals as one line.

Slurm's client commands block while they retry an unreachable slurmctld, so every call has a
timeout; its messages come as several `tool: error: …` lines, which `refusal` joins into one.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from gpuwarden.core.errors import UserError, one_line

# A healthy slurmctld answers in milliseconds; a client retrying an unreachable one gives up
# after about MessageTimeout (10 s by default) times a few tries.
DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Answer:
    """What one call of a Slurm command returned."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def run_tool(argv: Sequence[str], *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Answer:
    """Run Slurm's `argv[0]` (found on PATH) with the rest as arguments; UserError when it is
    missing or does not finish within `timeout_s`."""
    tool = argv[0]
    path = shutil.which(tool)
    if path is None:
        raise UserError(
            f"{tool} not found on PATH: run this where Slurm's client commands are installed"
            " (a login or compute node), or add their directory to PATH",
            code="slurm_missing",
        )
    try:
        done = subprocess.run(
            [path, *argv[1:]],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise UserError(
            f"{tool} did not answer within {timeout_s:g} s: check that slurmctld is up (`scontrol ping`)",
            code="slurm_unreachable",
        ) from None
    return Answer(done.returncode, done.stdout, done.stderr)


def refusal(tool: str, answer: Answer) -> str:
    """Slurm's own words for a failed call, as one line without the `tool: error:` prefixes and
    the `Try "tool --help"` hint (the caller's message says what to do)."""
    lines = []
    for line in (answer.stderr or answer.stdout).splitlines():
        text = line.strip()
        for prefix in (f"{tool}: ", "error: "):
            text = text.removeprefix(prefix)
        if text and not text.startswith("Try "):
            lines.append(text)
    return one_line("\n".join(lines)) if lines else f"exit status {answer.returncode}"


def says_invalid_job(answer: Answer) -> bool:
    """Whether Slurm answered that it knows no such job."""
    return "Invalid job id specified" in answer.stderr
