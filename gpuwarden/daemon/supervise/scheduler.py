"""Which queued runs start now, and on which GPUs: oldest first, each where it fits, none
blocking the ones behind it."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwarden.core.config.spec import spec_from_mapping
from gpuwarden.core.errors import UserError
from gpuwarden.core.run_state import RunState
from gpuwarden.daemon.supervise.context import Context, Start


@dataclass(frozen=True)
class Scheduled:
    """A run to start; `tune`: probe for its batch size first (`autotune: true`)."""

    start: Start
    tune: bool


def due(ctx: Context, *, can_tune: bool) -> list[Scheduled]:
    """The queued runs that fit now. A run whose stored spec no longer validates fails here."""
    busy, now = ctx.busy(), ctx.clock()
    out: list[Scheduled] = []
    queued = ctx.store(lambda s: s.list_runs(states=(RunState.QUEUED,)))
    for run in reversed(queued):  # oldest first
        if run["id"] in ctx.active or run["id"] in ctx.held or ctx.not_before.get(run["id"], now) > now:
            continue
        try:
            spec = spec_from_mapping(run["spec"])
        except UserError as exc:
            ctx.set_state(run["id"], RunState.FAILED, str(exc).splitlines()[0])
            continue
        placement = ctx.place(spec.resources, busy)
        if placement is None:
            continue
        ctx.not_before.pop(run["id"], None)
        for uuid in placement.gpus:  # later runs of this pass see these GPUs taken
            busy[uuid] = busy.get(uuid, 0) + 1
        # `autotune` is cleared once tuned: this tunes before the first attempt, or once more
        # after `tune_run` asked for it.
        out.append(Scheduled(Start(run, spec, placement), tune=spec.autotune and can_tune))
    return out
