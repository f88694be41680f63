"""The run supervisor, in parts: a loop (`supervisor`) over parts that share a context and never
import each other. `docs/architecture.md` draws them; what the API and the daemon use is here."""

from gpuwarden.daemon.supervise.backends import Backends, ChildProcess, ProcessLayer
from gpuwarden.daemon.supervise.context import Conflict
from gpuwarden.daemon.supervise.hooks import (
    AttemptEnd,
    Hooks,
    NextAttempt,
    RetuneGiveUp,
    RetuneHook,
    RetuneNotes,
    no_retune,
)
from gpuwarden.daemon.supervise.supervisor import Supervisor, owner_of

__all__ = [
    "AttemptEnd",
    "Backends",
    "ChildProcess",
    "Conflict",
    "Hooks",
    "NextAttempt",
    "ProcessLayer",
    "RetuneGiveUp",
    "RetuneHook",
    "RetuneNotes",
    "Supervisor",
    "no_retune",
    "owner_of",
]
