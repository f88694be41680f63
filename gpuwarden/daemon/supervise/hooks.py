"""The policies the supervisor calls out to, and what they are given and return.

The daemon plugs in OOM recovery (`gpuwarden.daemon.oom_retune`), autotune and profiles
(`gpuwarden.daemon.autotune`); tests plug in their own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpuwarden.core.config.spec import RunSpec


@dataclass(frozen=True)
class AttemptEnd:
    """How an attempt ended, with the evidence a retune policy needs (maps onto
    gpuwarden.core.oom.recovery.AttemptFacts)."""

    number: int
    outcome: str  # the daemon's verdict: "oom" when the hook is called
    reason: str
    exit_code: int | None
    signal: int | None
    oom_kill: bool | None  # the cgroup's oom_kill counter grew during the attempt
    stderr_tail: str
    gpus: list[str]
    gpu_capacity: int | None  # smallest memory among the attempt's GPUs
    host_capacity: int | None  # the address-space limit, else the host's memory
    adopted: bool
    pid: int | None = None  # the attempt's process (and process group) id
    rank: int | None = None  # a gang: the rank whose failure this is (its stderr and exit status)
    world_size: int = 1
    rank_pids: tuple[int, ...] = ()  # a gang: its ranks' processes (each leads a group of its own)


@dataclass(frozen=True)
class NextAttempt:
    """What a retune hook decides: the spec of the next attempt and the record to store."""

    spec: dict[str, Any]
    from_: dict[str, Any]
    to: dict[str, Any]
    verdict: str | None = None
    evidence: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None


class RetuneNotes(Protocol):
    """How a retune hook tells, while it decides, what it is doing (each probe as it starts, runs
    and ends): an event of the attempt that failed, recorded and streamed at once. Callable from
    any thread; a write the store refuses is dropped, never the decision's failure."""

    def __call__(self, type_: str, /, **payload: Any) -> None: ...


def unheard(type_: str, /, **payload: Any) -> None:
    """Notes nobody records (a hook called outside a supervisor)."""
    return None


class RetuneGiveUp(Exception):
    """Raised by a retune hook when the run must fail; the message says why, in one line."""


class RetuneHook(Protocol):
    """Called (on its own thread) when an attempt ended out of memory, with the run (spec
    included), how the attempt ended, every event of the run, oldest first, and where to tell
    what it does meanwhile. A decision starts the next attempt with its spec; None fails the run."""

    def __call__(
        self,
        run: Mapping[str, Any],
        end: AttemptEnd,
        events: Sequence[Mapping[str, Any]],
        notes: RetuneNotes,
    ) -> NextAttempt | None: ...


def no_retune(
    run: Mapping[str, Any], end: AttemptEnd, events: Sequence[Mapping[str, Any]], notes: RetuneNotes
) -> NextAttempt | None:
    """The hook when OOM recovery is not plugged in: never retune."""
    return None


# (spec, placed GPU UUIDs, run dir) → (the spec document to start with, one line for the log).
AutotuneHook = Callable[[RunSpec, list[str], Path], tuple[dict[str, Any], str]]
# spec → (the spec document with profile values, or None; one line saying what happened).
ProfileHook = Callable[[RunSpec], tuple[dict[str, Any] | None, str]]


@dataclass(frozen=True)
class Hooks:
    """The policies one supervisor uses."""

    retune: RetuneHook = no_retune
    autotune: AutotuneHook | None = None
    profile: ProfileHook | None = None
