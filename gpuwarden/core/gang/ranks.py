"""Each rank of a multi-process attempt as `show`, the API and the dashboard present it: its
process, GPU, memory and last step, and which rank holds the others back (the straggler).

Built from the newest events of each type that every rank wrote (the store finds them), and from
the daemon's `hang` event when the watchdog stopped the gang. The straggler is:
- after a hang, the ranks the stack dumps found outside any collective (the others were waiting
  for them in one);
- else, while the ranks' last steps differ, the ranks furthest behind.
Ranks of a data-parallel gang step together, so on a healthy gang no rank is marked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

RANK_EVENT_TYPES = ("started", "progress", "oom", "error", "finished")
_MEMORY_FIELDS = ("mem_allocated", "mem_reserved", "mem_peak", "vm_peak")


def _number(value: Any) -> int | float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def _last_event(latest: Mapping[tuple[int, str], Mapping[str, Any]], rank: int) -> str | None:
    """The type of the rank's newest event among those kept (by time written)."""
    found = [(float(e.get("ts", 0.0)), t) for (r, t), e in latest.items() if r == rank]
    return max(found)[1] if found else None


def _one(
    rank: int, gpus: Sequence[str], latest: Mapping[tuple[int, str], Mapping[str, Any]]
) -> dict[str, Any]:
    started = latest.get((rank, "started"), {})
    progress = latest.get((rank, "progress"), {})
    failure = max(
        (e for t in ("oom", "error") if (e := latest.get((rank, t))) is not None),
        key=lambda e: float(e.get("ts", 0.0)),
        default=None,
    )
    out: dict[str, Any] = {
        "rank": rank,
        "pid": _number(started.get("pid")),
        "gpu": gpus[rank] if rank < len(gpus) else None,
        "device": started.get("device"),
        "step": _number(progress.get("step")),
        "samples_seen": _number(progress.get("samples_seen")),
        "progress_at": _number(progress.get("ts")),
        "last_event": _last_event(latest, rank),
        "failure": None,
        "straggler": False,
        "straggler_reason": None,
    }
    for name in _MEMORY_FIELDS:
        out[name] = _number(progress.get(name))
    if failure is not None:
        what = failure.get("verdict") if failure.get("type") == "oom" else failure.get("code")
        out["failure"] = f"{failure.get('type')}: {what}" if what else str(failure.get("type"))
    return out


def rank_view(
    world_size: int,
    gpus: Sequence[str],
    latest: Mapping[tuple[int, str], Mapping[str, Any]],
    hang: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One entry per rank (0 … world_size-1), from `latest[(rank, type)]` = the rank's newest event
    of each of RANK_EVENT_TYPES; `hang` is the attempt's `hang` daemon event, if any."""
    ranks = [_one(rank, gpus, latest) for rank in range(world_size)]
    suspects = hang.get("suspects") if hang is not None else None
    if isinstance(suspects, list) and suspects:
        for entry in ranks:
            if entry["rank"] in suspects:
                entry["straggler"] = True
                entry["straggler_reason"] = "outside any collective when the gang hung (see the hang dump)"
        return ranks
    if all(r["step"] is None for r in ranks):
        return ranks
    steps = {r["rank"]: r["step"] or 0 for r in ranks}  # no progress yet: behind every rank that has
    low, high = min(steps.values()), max(steps.values())
    if low < high:
        for entry in ranks:
            if steps[entry["rank"]] == low:
                entry["straggler"] = True
                entry["straggler_reason"] = f"at step {low}, others at up to {high}"
    return ranks
