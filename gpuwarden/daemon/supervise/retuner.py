"""Out of memory → the retune policy's decision → the next attempt's spec.

The policy may take a while (it waits for GPU memory to be released, runs probe processes), so
it runs on a thread of its own while the run is `retuning` and its GPUs stay held for it; the
decision comes back to the loop, which applies it under the lock.
"""

from __future__ import annotations

import logging
from typing import Any

from gpuwarden.core.config.spec import RunSpec, spec_from_mapping
from gpuwarden.core.errors import UserError, one_line
from gpuwarden.core.run_state import RunState
from gpuwarden.daemon.supervise import help_reader
from gpuwarden.daemon.supervise.context import Context, Start, spec_document
from gpuwarden.daemon.supervise.hooks import AttemptEnd, NextAttempt, RetuneGiveUp, RetuneHook, RetuneNotes

log = logging.getLogger("gpuwarden.daemon.supervisor")


def begin(
    ctx: Context, run_id: str, end: AttemptEnd, message: str, hook: RetuneHook, *, again: bool = False
) -> None:
    """Mark the run retuning and ask `hook` off the loop (`again`: after a daemon restart that
    interrupted the decision)."""
    doing = "deciding the retune again after a daemon restart" if again else "deciding a retune"
    ctx.set_state(run_id, RunState.RETUNING, f"{message}; {doing}")
    ctx.held[run_id] = list(end.gpus)

    def work() -> None:
        help_reader.wait(ctx, run_id)  # the next attempt's argv depends on what the help said
        decision, why = decide(ctx, run_id, end, message, hook)
        ctx.hand_back(run_id, lambda: apply(ctx, run_id, end, decision, why))

    ctx.backends.start_thread(f"retune-{run_id}", work)


def decide(
    ctx: Context, run_id: str, end: AttemptEnd, message: str, hook: RetuneHook
) -> tuple[NextAttempt | None, str]:
    """The hook's decision (None: the run fails) and the message to fail it with."""
    try:
        run = ctx.run(run_id)
        events = ctx.store(lambda s: s.events(run_id, limit=100_000))
        return hook(run, end, events, notes(ctx, run_id, end.number)), message
    except RetuneGiveUp as exc:
        return None, f"{message}; {exc}"
    except Exception as exc:
        log.exception("retune hook failed for run %s", run_id)
        return None, f"{message}; retune failed: {one_line(exc)}"


def notes(ctx: Context, run_id: str, attempt: int) -> RetuneNotes:
    """What the hook says while it decides, as daemon events of the failed attempt. From the
    hook's thread, as its reads are: the writer and the stream take work from any thread."""

    def say(type_: str, /, **payload: Any) -> None:
        try:
            ctx.event(run_id, attempt, type_, **payload)
        except Exception as exc:
            if ctx.health.fault_of(exc) is None:
                raise
            # A note is not worth holding the decision for: the store reports its fault itself.
            log.info("run %s: %s event not recorded: the store refuses writes", run_id, type_)

    return say


def apply(
    ctx: Context, run_id: str, end: AttemptEnd, decision: NextAttempt | None, message: str
) -> Start | None:
    """Record the decision and say where the next attempt starts (None: it fails, or waits). The
    GPUs stay held until it is recorded: a store that refuses it has the decision applied again."""
    if ctx.state_of(run_id) is not RunState.RETUNING:
        ctx.held.pop(run_id, None)
        return None  # stopped or deleted while the policy thought
    spec, failed = _spec_of(decision, message)
    if spec is None or decision is None:
        ctx.set_state(run_id, RunState.FAILED, failed)
        ctx.held.pop(run_id, None)
        return None
    recorded = ctx.batch().write(
        lambda s: s.add_retune(
            run_id,
            end.number,
            decision.from_,
            decision.to,
            decision.verdict,
            decision.evidence,
            decision.prediction,
            spec=spec_document(spec),
        )
    )
    reason = ((decision.evidence or {}).get("decision") or {}).get("reason")
    recorded.event(
        run_id, end.number, "retuned", changes=decision.to, verdict=decision.verdict, reason=reason
    )
    placement = ctx.place(spec.resources, ctx.busy(but=run_id))
    if placement is None:
        changes = ", ".join(f"{k}: {decision.from_.get(k)} → {v}" for k, v in decision.to.items())
        recorded.set_state(
            run_id, RunState.QUEUED, f"retuned ({changes or 'no knob changed'}); waiting for GPUs"
        )
    recorded.commit()
    ctx.held.pop(run_id, None)
    return None if placement is None else Start(ctx.run(run_id), spec, placement)


def _spec_of(decision: NextAttempt | None, message: str) -> tuple[RunSpec | None, str]:
    """The next attempt's spec, or None and the message the run fails with."""
    if decision is None:
        return None, message
    try:
        return spec_from_mapping(decision.spec), message
    except UserError as exc:
        return None, f"{message}; the retune gave an invalid spec: {one_line(exc)}"
