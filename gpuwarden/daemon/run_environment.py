"""The environment a run's processes start from: the submitter's, stored with the run.

`gpuwarden run` sends the shell's environment (its PATH, its activated virtualenv or conda env,
its tokens), so a run behaves as the program would in that shell even when the daemon was started
elsewhere or runs as a systemd service. A run submitted without one (an older client, a raw API
call) starts from the daemon's environment, as before.

What the daemon sets for each attempt is dropped from what was submitted: a `gpuwarden run` typed
inside a supervised run (or a rank of one) must not hand the outer run's tag, events file,
checkpoint or rank to the new run's processes.

Python writes stdout to a file in 8 KiB blocks: a script's prints would reach its log (and
`--follow`) only when the buffer fills or the program ends, long after the stderr lines printed
beside them. Runs start unbuffered unless the submitter or the spec says otherwise
(`PYTHONUNBUFFERED=""` in the spec's `env` turns it off).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from gpuwarden.core.command.prepare import ENV_ATTEMPT, ENV_EVENTS_FILE, ENV_RESUME_FROM, ENV_RUN_ID
from gpuwarden.daemon.process import RUN_TAG

UNBUFFERED = "PYTHONUNBUFFERED"

# Each names the process it was given to: the daemon's tag and files, torchrun's rank.
PER_PROCESS = frozenset(
    {
        RUN_TAG,
        ENV_EVENTS_FILE,
        ENV_RUN_ID,
        ENV_ATTEMPT,
        ENV_RESUME_FROM,
        "RANK",
        "LOCAL_RANK",
        "GROUP_RANK",
        "ROLE_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_WORLD_SIZE",
        "ROLE_WORLD_SIZE",
        "ROLE_NAME",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_ERROR_FILE",
    }
)


def submitted(environment: Mapping[str, str] | None) -> dict[str, str] | None:
    """What to store of a submitter's environment (None: it sent none)."""
    if environment is None:
        return None
    return {name: value for name, value in environment.items() if name not in PER_PROCESS}


def base(stored: Mapping[str, str] | None) -> dict[str, str]:
    """The environment a run's attempt or probe starts from, before its spec's `env` and the
    daemon's placement go on top."""
    env = dict(os.environ if stored is None else stored)
    env.setdefault(UNBUFFERED, "1")
    return env
