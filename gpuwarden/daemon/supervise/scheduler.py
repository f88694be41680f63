"""Which queued runs start now, and on which GPUs: oldest first, each where it fits, none
blocking the ones behind it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuwarden.core.config.spec import spec_from_mapping
from gpuwarden.core.errors import UserError
from gpuwarden.core.run_state import RunState
from gpuwarden.daemon.supervise import help_reader
from gpuwarden.daemon.supervise.context import Context, Start
from gpuwarden.daemon.supervise.faults import contained


@dataclass(frozen=True)
class Scheduled:
    """A run to start; `tune`: probe for its batch size first (`autotune: true`)."""

    start: Start
    tune: bool


def due(ctx: Context, *, can_tune: bool) -> list[Scheduled]:
    """The queued runs that fit now. A run whose stored spec no longer validates fails here, as
    does one whose placement raised (`faults.py`): the runs behind it are still placed."""
    busy, now = ctx.busy(), ctx.clock()
    out: list[Scheduled] = []
    queued = ctx.store(lambda s: s.list_runs(states=(RunState.QUEUED,)))
    for run in reversed(queued):  # oldest first
        if run["id"] in ctx.active or run["id"] in ctx.held or ctx.not_before.get(run["id"], now) > now:
            continue
        if run["attempt"] and help_reader.pending(ctx, str(run["id"])):
            continue  # a restart's argv depends on what the script's help says: woken when read
        scheduled = contained(ctx, str(run["id"]), _schedule, ctx, run, busy, can_tune)
        if scheduled is not None:
            out.append(scheduled)
    return out


def _schedule(ctx: Context, run: dict[str, Any], busy: dict[str, int], can_tune: bool) -> Scheduled | None:
    """The run, placed (its GPUs counted in `busy`), or None: it waits, or it failed."""
    try:
        spec = spec_from_mapping(run["spec"])
    except UserError as exc:
        ctx.set_state(run["id"], RunState.FAILED, str(exc).splitlines()[0])
        return None
    placement = ctx.place(spec.resources, busy)
    if placement is None:
        _say_why_it_waits(ctx, run, ctx.why_waiting(spec.resources, busy))
        return None
    ctx.not_before.pop(run["id"], None)
    for uuid in placement.gpus:  # later runs of this pass see these GPUs taken
        busy[uuid] = busy.get(uuid, 0) + 1
    # `autotune` is cleared once tuned: this tunes before the first attempt, or once more
    # after `tune_run` asked for it.
    return Scheduled(Start(run, spec, placement), tune=spec.autotune and can_tune)


def _say_why_it_waits(ctx: Context, run: dict[str, Any], why: str) -> None:
    """Put what a queued run waits for in its message, where that message is only a wait (not a
    restart's or a retune's, which say more): written when it changes, not on every pass."""
    message = str(run.get("message") or "")
    if message == why or not message.startswith("waiting"):
        return
    ctx.store(lambda s: s.update_run(run["id"], message=why))
    ctx.publish_run(ctx.run(run["id"]))
