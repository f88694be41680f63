"""Which events are worth a message, and the message each one makes.

The daemon's events reach notifications as its live stream sends them (a run's `state` moves,
`retuned`, `restart`, `hang`); `event_kind` picks the ones `notify.events` can name, and
`compose` writes the title and body from the event and what the store knows of the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuwarden.core.api.runs import Retune
from gpuwarden.core.config.settings import NotifyEvent
from gpuwarden.core.notify.gpu_watch import GpuCondition
from gpuwarden.core.notify.notice import Notice
from gpuwarden.core.oom.explain import retune_sentence

# The daemon's own event types that make a message, and what `notify.events` calls them.
_EVENT_KINDS: dict[str, NotifyEvent] = {"retuned": "retuned", "restart": "restarted", "hang": "hung"}
_STATE_KINDS: dict[str, NotifyEvent] = {"succeeded": "succeeded", "failed": "failed"}
# Event types looked at at all: everything else the stream carries (progress above all) is passed
# over with one set lookup.
WATCHED_TYPES = frozenset({"state", *_EVENT_KINDS})


@dataclass(frozen=True)
class RunFacts:
    """What a message says of its run, read from the store when the message is written."""

    id: str
    name: str
    message: str | None = None  # the run's one-line reason for its state
    log_tail: str = ""  # the last lines of the latest attempt's stderr (else its stdout)
    log_name: str = "stderr"
    retune: Retune | None = None  # the latest retune decision


def event_kind(event: Mapping[str, Any]) -> NotifyEvent | None:
    """The notification an event of the live stream makes, if any."""
    type_ = event.get("type")
    if type_ not in WATCHED_TYPES or event.get("source") != "daemon":
        return None
    if type_ == "state":
        return _STATE_KINDS.get(str(event.get("state")))
    return _EVENT_KINDS[str(type_)]


def compose(kind: NotifyEvent, event: Mapping[str, Any], run: RunFacts, host: str) -> Notice:
    """The message for a run's event."""
    attempt = event.get("attempt")
    who = f"{run.name} ({run.id}) on {host}"
    title, body = _WRITERS[kind](event, run, who)
    details = {k: v for k, v in event.items() if k not in ("v", "run_id")}
    return Notice(
        kind, title, body, host, float(event.get("ts") or 0), run.id, run.name, attempt, details=details
    )


def _succeeded(event: Mapping[str, Any], run: RunFacts, who: str) -> tuple[str, str]:
    attempts = event.get("attempt") or 1
    tries = f" after {attempts} attempts" if attempts > 1 else ""
    return f"{run.name} succeeded", f"Run {who} succeeded{tries}."


def _failed(event: Mapping[str, Any], run: RunFacts, who: str) -> tuple[str, str]:
    body = f"Run {who} failed: {event.get('message') or run.message or 'no reason recorded'}"
    if run.log_tail.strip():
        body += f"\n\nLast lines of attempt {event.get('attempt')}'s {run.log_name}:\n{run.log_tail.rstrip()}"
    return f"{run.name} failed", body


def _retuned(event: Mapping[str, Any], run: RunFacts, who: str) -> tuple[str, str]:
    """The sentence `gpuwarden show` prints (where → what changed; what the memory model said),
    or, without the retune's record, the event's changes and reason."""
    body = f"Run {who} ran out of memory in attempt {event.get('attempt')} and was retuned: "
    if run.retune is not None and run.retune.attempt == event.get("attempt"):
        return f"{run.name} retuned", body + retune_sentence(run.retune)
    what = ", ".join(f"{k} → {v}" for k, v in (event.get("changes") or {}).items()) or "no knob changed"
    reason = event.get("reason")
    return f"{run.name} retuned", body + what + (f". {reason}" if reason else "")


def _restarted(event: Mapping[str, Any], run: RunFacts, who: str) -> tuple[str, str]:
    backoff = event.get("backoff_s") or 0
    when = f"in {backoff:g} s" if backoff else "now"
    return f"{run.name} restarted", (
        f"Run {who}: attempt {event.get('attempt')} ended ({event.get('cause')}); restart "
        f"{event.get('restart')} of {event.get('max')} {when}, from the last checkpoint."
    )


def _hung(event: Mapping[str, Any], run: RunFacts, who: str) -> tuple[str, str]:
    quiet, bound = event.get("quiet_s") or 0, event.get("bound_s") or 0
    body = f"Run {who} made no progress for {quiet:.0f} s (its bound: {bound:.0f} s) and is stopped"
    dump = event.get("dump")
    return f"{run.name} hung", body + (f"; every rank's stack is in {dump}" if dump else "")


_WRITERS = {
    "succeeded": _succeeded,
    "failed": _failed,
    "retuned": _retuned,
    "restarted": _restarted,
    "hung": _hung,
}


def gpu_notice(condition: GpuCondition, gpu: str, run: RunFacts | None, host: str) -> Notice:
    """The message for a GPU condition (`gpu`: "0 (GPU-…)"): one per run that holds the GPU, or
    one without a run for throttling of a GPU no run holds."""
    minutes = f"{condition.minutes:.0f} min"
    who = f"run {run.name} ({run.id}) on {host}" if run is not None else f"no run, on {host}"
    prefix = f"{run.name}: " if run is not None else f"{host}: "
    if condition.kind == "idle":
        title = f"{prefix}GPU {gpu} idle"
        body = f"GPU {gpu}, held by {who}, has been idle (under 5% busy) for {minutes}."
    else:
        title = f"{prefix}GPU {gpu} throttled"
        reasons = ", ".join(condition.reasons)
        body = f"GPU {gpu}, used by {who}, has been throttled ({reasons}) for {minutes}."
    details = {"since": condition.since, "reasons": list(condition.reasons), "uuid": condition.uuid}
    run_id, name = (run.id, run.name) if run is not None else (None, None)
    return Notice(condition.kind, title, body, host, condition.at, run_id, name, None, gpu, details)
