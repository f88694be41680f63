"""A run event as one line a person reads (`gpuwarden events`, `run --follow`): sizes in units,
settings as `key=value`, and no payload a terminal cannot show. `--json` prints events whole."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any

from gpuwarden.core.api import RunEvent
from gpuwarden.core.progress_bar import bar_sentence, recorded_bar
from gpuwarden.core.units import compact, named, unit_free

# Bulky or bookkeeping fields a human does not want inline; `--json` has them whole (a hang's
# `stacks` also in the file its `dump` names).
_SKIP = frozenset(
    {
        "v",
        "type",
        "ts",
        "id",
        "attempt",
        "source",
        "run_id",
        "dropped",
        "config",
        "report",
        "fields",
        "stacks",
    }
)
REPORT_KEYS = (
    "steps",
    "samples_seen",
    "items_done",
    "wall_s",
    "samples_per_s",
    "items_per_s",
    "tokens_per_s",
)


def value_text(name: str, value: Any) -> str:
    """A field's value: numbers in the unit the name carries, mappings as `k=v, …`."""
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={value_text(str(k), v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(value_text(name, v) for v in value)
    moment = name == "at" or name.endswith("_at")
    if moment and isinstance(value, int | float) and not isinstance(value, bool):
        return _clock(value)  # not a quantity: 14:05:33 rather than 1.795e+09
    return named(name, value)


def fields_text(fields: Mapping[str, Any], skip: frozenset[str] = _SKIP) -> str:
    return " ".join(
        _field(k, v) if not isinstance(v, Mapping) else f"{k}: {value_text(k, v)};"
        for k, v in fields.items()
        if k not in skip and v is not None
    )


def _field(name: str, value: Any) -> str:
    """`wall=11.48 s`, `samples/s=6.297`: the unit once, with the value or in the name."""
    label, text = unit_once(name, value)
    return f"{label}={text}"


def unit_once(name: str, value: Any) -> tuple[str, str]:
    """(label, value) with the unit said once: (`wall`, `11.48 s`), (`samples/s`, `6.297`)."""
    label = unit_free(name)
    if label.endswith("/s") and isinstance(value, int | float) and not isinstance(value, bool):
        return label, compact(value)
    return label, value_text(name, value)


def _body(event: RunEvent, extra: dict[str, Any], with_message: bool) -> str:
    kind = event.type
    if kind == "state":
        return f"{extra.get('state')}" + (f" — {extra['message']}" if extra.get("message") else "")
    if kind == "oom":
        where = f" in {extra['phase']}" if extra.get("phase") else ""
        rest = fields_text(extra, _SKIP | {"verdict", "phase", "message"})
        line = f"out of memory ({extra.get('verdict', '?')}){where}" + (f": {rest}" if rest else "")
        # With --follow the program's stderr already printed the allocator's message.
        return line + (f"\n    {extra['message']}" if with_message and extra.get("message") else "")
    if kind in _TEXTS:
        return _TEXTS[kind](extra)
    if kind == "prepared" and extra.get("message"):  # its message names the checkpoint already
        return _sentence(extra, {"resume_from"})
    if kind == "warning" and extra.get("message"):  # the code last: what a filter or a search keys on
        return _sentence(extra, {"code"}) + (f" [{extra['code']}]" if extra.get("code") else "")
    if kind == "stopping" and isinstance(extra.get("kill_at"), int | float):
        at = _clock(extra["kill_at"])
        return f"SIGTERM sent; SIGKILL at {at} if still running (grace {extra.get('grace_seconds')} s)"
    if kind in ("probe", "waiting") and extra.get("message"):  # says its numbers already, in their units
        return str(extra["message"])
    report = extra.get("report")
    if kind == "finished" and isinstance(report, Mapping):
        return " ".join(_field(k, report[k]) for k in REPORT_KEYS if report.get(k) is not None)
    return fields_text(extra)


def _sentence(extra: Mapping[str, Any], also_skipped: set[str]) -> str:
    """The event's message as it reads, then any other field as `key=value`."""
    rest = fields_text(extra, _SKIP | {"message", *also_skipped})
    return str(extra["message"]) + (f" ({rest})" if rest else "")


def _progress_text(extra: Mapping[str, Any]) -> str:
    """Its fields with units; `total` here counts samples, where an allocator's `total` is bytes."""
    total = extra.get("total")
    rest = fields_text(extra, _SKIP | {"total"})
    return f"{rest} total={total}" if isinstance(total, int) and not isinstance(total, bool) else rest


def _bar_text(extra: Mapping[str, Any]) -> str:
    """`train: 12/40 it (30 %), 3.92 it/s, 7s left`, as the program's progress bar drew it."""
    reading = recorded_bar(extra)
    return bar_sentence(reading) if reading is not None else fields_text(extra)


def _retuned_text(extra: Mapping[str, Any]) -> str:
    why = extra.get("reason") or value_text("changes", extra.get("changes"))
    return f"({extra.get('verdict') or '?'}) {why}"


def _edited_text(extra: Mapping[str, Any]) -> str:
    changes = extra.get("changes")
    return edit_text(changes) if isinstance(changes, Mapping) else ""


def _fixed_memory_text(extra: Mapping[str, Any]) -> str:
    """`at least 2.2 GiB whatever the batch: 1.1 GiB held, 384 MiB of gradients and 768 MiB of
    optimizer state to come (100.7 M parameters, cpu)`."""
    parts = [
        f"{named('fixed_bytes', extra.get('fixed_bytes'))} whatever the batch:",
        f"{named('held_bytes', extra.get('held_bytes'))} held,",
        f"{named('gradient_bytes', extra.get('gradient_bytes'))} of gradients and",
        f"{named('optimizer_state_bytes', extra.get('optimizer_state_bytes'))} of optimizer state to come",
    ]
    count = extra.get("parameters")
    where = ""
    if isinstance(count, int) and not isinstance(count, bool):
        where = f"{count / 1e6:.4g} M parameters, " if count >= 10**6 else f"{count} parameters, "
    return f"at least {' '.join(parts)} ({where}{extra.get('device', '?')})"


def _restart_text(extra: Mapping[str, Any]) -> str:
    """`restart 1 of 3 after exit code 75, at 14:05:33 (back-off 3 s)`."""
    line = f"restart {extra.get('restart', '?')} of {extra.get('max', '?')} after {extra.get('cause', '?')}"
    if isinstance(extra.get("at"), int | float):
        line += f", at {_clock(extra['at'])}"
        if extra.get("backoff_s"):
            line += f" (back-off {named('backoff_s', extra['backoff_s'])})"
    return line


# Events whose line is a sentence of their own fields.
_TEXTS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "progress": _progress_text,
    "progress_bar": _bar_text,
    "retuned": _retuned_text,
    "edited": _edited_text,
    "restart": _restart_text,
    "fixed_memory": _fixed_memory_text,
}


def _clock(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%H:%M:%S")


def edit_text(changes: Mapping[str, Any]) -> str:
    """`train.batch_size 4 → 8, knobs.lr 0.1 → 0.05` from an `edited` event's changes."""
    parts = []
    for key, pair in changes.items():
        if isinstance(pair, list | tuple) and len(pair) == 2:
            parts.append(f"{key} {value_text(key, pair[0])} → {value_text(key, pair[1])}")
        else:
            parts.append(f"{key} → {value_text(key, pair)}")
    return ", ".join(parts)


def event_line(event: RunEvent, *, with_message: bool = True) -> str:
    """`21:56:21 #6 [1] oom: out of memory (host_oom) in forward: batch_size=64 step=0 …`."""
    when = dt.datetime.fromtimestamp(event.ts).strftime("%H:%M:%S")
    body = _body(event, dict(event.model_extra or {}), with_message)
    return f"{when} #{event.id} [{event.attempt or '-'}] {event.type}: {body}"
