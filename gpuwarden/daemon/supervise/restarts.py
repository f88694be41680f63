"""The restart policy (`restart:` in the spec): a failed attempt that is not out of memory starts
again from the last checkpoint, after a backoff on the supervisor's clock, at most `max` times.
A gang the hang watchdog stopped restarts when `restart.on` has `hang`.

Each restart is a `restart` event with its cause; the run waits in the queue meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuwarden.core.config.spec import spec_from_mapping
from gpuwarden.core.config.spec_restart import RestartPolicy
from gpuwarden.core.errors import UserError
from gpuwarden.core.run_state import RunState
from gpuwarden.daemon.supervise.context import Context, Ending


@dataclass(frozen=True)
class Restart:
    """A restart to schedule: why, which one of how many, and after how long."""

    cause: str
    number: int
    max: int
    backoff: float


def decide(ctx: Context, ending: Ending) -> tuple[Restart | None, str]:
    """(the restart, or None; the run's message when it is not restarted)."""
    if ending.verdict.outcome not in ("failed", "hang"):
        return None, ending.message
    policy = _policy(ctx, ending.run_id)
    cause = cause_of(ending, policy) if policy is not None else None
    if policy is None or cause is None:
        return None, ending.message
    used = len(ctx.store(lambda s: s.events(ending.run_id, limit=100_000, types=("restart",))))
    if used >= policy.max:
        return None, f"{ending.message}; no restart left ({policy.max} used)"
    return Restart(cause, used + 1, policy.max, policy.backoff), ending.message


def cause_of(ending: Ending, policy: RestartPolicy) -> str | None:
    """Why the policy restarts this failed attempt, or None when it does not."""
    if ending.verdict.outcome == "hang":
        return "hang" if policy.on_hang else None
    status = ending.status
    if status.signal is not None and policy.on_signal:
        return status.describe()
    if not status.known and ending.final_event is None and policy.on_signal:
        # Every attempt's recorder writes its status unless it was killed too (its whole group
        # was), and our runners end with an event: a re-adopted attempt with neither was killed.
        return "died without a final event"
    if status.code is not None and status.code in policy.exit_codes:
        return status.describe()
    return None


def schedule(ctx: Context, ending: Ending, restart: Restart) -> None:
    """Record the restart and queue the run until its backoff has passed."""
    at = ctx.clock() + restart.backoff
    when = f"in {restart.backoff:g} s" if restart.backoff else "now"
    # One commit: a restart counted is a restart queued (the next count reads these events).
    ctx.batch().event(
        ending.run_id,
        ending.attempt,
        "restart",
        cause=restart.cause,
        restart=restart.number,
        max=restart.max,
        backoff_s=restart.backoff,
        at=at,
    ).set_state(
        ending.run_id,
        RunState.QUEUED,
        f"{ending.message}; restart {restart.number} of {restart.max} {when}, from the last checkpoint",
    ).commit()
    ctx.not_before[ending.run_id] = at


def _policy(ctx: Context, run_id: str) -> RestartPolicy | None:
    try:
        return spec_from_mapping(ctx.run(run_id)["spec"]).restart
    except UserError:
        return None  # a spec that no longer validates fails in the queue anyway
