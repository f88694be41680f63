"""Where a runner process stands in a gang, read from torchrun's environment, without torch.

The runner's entry point reads this before it loads anything, so a spec or launch error is
reported without paying for torch's import; the process group itself is in
`gpuwarden.runners.gang`.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from gpuwarden.core.errors import UserError

_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class RankEnv:
    """This process's place in the gang, as torchrun describes it."""

    rank: int
    local_rank: int
    world_size: int


def rank_env(environ: Mapping[str, str] | None = None) -> RankEnv | None:
    """RANK/LOCAL_RANK/WORLD_SIZE from torchrun, or None when started alone."""
    env = os.environ if environ is None else environ
    if "WORLD_SIZE" not in env or "RANK" not in env:
        return None
    try:
        world = int(env["WORLD_SIZE"])
        rank = int(env["RANK"])
        local = int(env.get("LOCAL_RANK", env["RANK"]))
    except ValueError:
        raise UserError(
            f"RANK={env.get('RANK')!r} WORLD_SIZE={env.get('WORLD_SIZE')!r} are not numbers — "
            "start multi-process runs through torch.distributed.run",
            code="unsupported",
        ) from None
    return RankEnv(rank, local, world)


def check_world_size(wanted: int, found: RankEnv | None) -> None:
    """The spec's world size must be the number of processes torchrun started."""
    started = found.world_size if found is not None else 1
    if started == wanted:
        return
    if found is None:
        raise UserError(
            f"train.world_size {wanted} needs {wanted} processes started by torchrun — run "
            f"`python -m torch.distributed.run --nproc-per-node {wanted} -m gpuwarden.runners …`, "
            "or set world_size: 1",
            code="unsupported",
        )
    raise UserError(
        f"train.world_size is {wanted} but torchrun started {started} processes — "
        f"use --nproc-per-node {wanted}, or set world_size: {started}",
        code="unsupported",
    )


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent (torchrun) dies.

    torchrun starts every rank in a session of its own, so killing torchrun's process group does
    not reach the ranks; with this, stopping torchrun by SIGKILL stops the whole gang at once, and
    a torchrun that crashed leaves no rank behind. Linux only; elsewhere nothing happens.
    """
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(128 + signal.SIGKILL)
