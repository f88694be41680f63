"""A retune as one sentence a person reads: where the memory ran out, what changed, and what the
memory model said — built from the record the daemon stores (its `evidence` and `prediction`).

  out of memory in forward (host: tried 128 MiB, limit 1.6 GiB) → micro-batch 64 → 16,
  accumulation 1 → 4, effective batch 64 kept; memory model: 24 fits with 5 % to spare; 16 chosen,
  the largest that divides 64

`gpuwarden show` and the dashboard's run screen both print it; the raw evidence stays in
`gpuwarden show --json` and one key away on the run screen.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuwarden.core.api import Retune, RunEvent
from gpuwarden.core.units import exact_size, size

# How a knob reads in a sentence.
_KNOB_LABELS = {
    "batch_size": "micro-batch",
    "eval_batch_size": "evaluation batch",
    "grad_accum_steps": "accumulation",
    "world_size": "world size",
    "max_length": "max length",
    "max_new_tokens": "max new tokens",
    "max_pixels": "max pixels",
    "gradient_checkpointing": "gradient checkpointing",
    "load_in_8bit": "8-bit weights",
    "device_map": "device map",
    "max_memory": "memory budget",
}
_WHERE = {
    "host_oom": "host",
    "gpu_capacity": "GPU",
    "gpu_fragmentation": "GPU, fragmented",
    "gpu_contention": "GPU, shared",
}
_ACTIONS = {
    "wait_for_memory": "waited for other processes to free memory",
    "move_gpu": "moved to the GPU with the most free memory",
}


def _decision(retune: Retune) -> Mapping[str, Any]:
    decision = (retune.evidence or {}).get("decision")
    return decision if isinstance(decision, Mapping) else {}


def _number(value: Any) -> int | float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def changes_of(retune: Retune) -> dict[str, tuple[Any, Any]]:
    """knob → (before, after): the decision's own record, else the stored from/to (whose keys
    carry the spec section, `train.batch_size`)."""
    recorded = _decision(retune).get("changes")
    if isinstance(recorded, Mapping) and recorded:
        return {
            str(k): (v[0], v[1]) for k, v in recorded.items() if isinstance(v, list | tuple) and len(v) == 2
        }
    keys = dict.fromkeys([*retune.before, *retune.after])
    return {k.rsplit(".", 1)[-1]: (retune.before.get(k), retune.after.get(k)) for k in keys}


def where_text(retune: Retune, phase: str | None = None) -> str:
    """`out of memory in forward (host: tried 128 MiB, limit 1.6 GiB)`."""
    evidence = retune.evidence or {}
    fields = evidence.get("fields") if isinstance(evidence.get("fields"), Mapping) else {}
    assert isinstance(fields, Mapping)
    prediction = retune.prediction or _decision(retune).get("prediction") or {}
    facts: list[str] = []
    requested = _number(fields.get("requested"))
    if requested is not None:
        facts.append(f"tried {size(requested)}")
    limit = (
        _number(prediction.get("capacity")) or _number(fields.get("allowed")) or _number(fields.get("total"))
    )
    if limit is not None:
        facts.append(f"limit {exact_size(limit)}")
    free = _number(fields.get("free"))
    if free is not None and retune.verdict != "host_oom":
        facts.append(f"{size(free)} free")
    others = _number(fields.get("held_by_others"))
    if others:
        facts.append(f"{size(others)} held by other processes")
    where = _WHERE.get(retune.verdict or "", retune.verdict or "")
    if not phase and fields.get("phase") == "evaluation":  # read from the program's traceback
        phase = f"evaluation ({fields.get('frame')})" if fields.get("frame") else "evaluation"
    text = "out of memory" + (f" in {phase}" if phase else "")
    if where and facts:
        return f"{text} ({where}: {', '.join(facts)})"
    inside = where or ", ".join(facts)
    return f"{text} ({inside})" if inside else text


def _knob_text(knob: str, before: Any, after: Any) -> str:
    label = _KNOB_LABELS.get(knob, knob)
    if isinstance(after, bool) and not before:
        return f"{label} on" if after else f"{label} off"
    return f"{label} {_value(before)} → {_value(after)}"


def _value(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {v}" for k, v in value.items()) or "{}"
    return str(value)


def _batch_pairs(retune: Retune) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """((micro before, after), (accumulation before, after)) when both changed by numbers."""
    changes = changes_of(retune)
    micro, accum = changes.get("batch_size"), changes.get("grad_accum_steps")
    if micro is None or accum is None:
        return None
    numbers = [_number(v) for v in (*micro, *accum)]
    if any(n is None for n in numbers):
        return None
    m0, m1, a0, a1 = (float(n or 0) for n in numbers)
    return (m0, m1), (a0, a1)


def change_text(retune: Retune, world_size: int = 1) -> str:
    """`micro-batch 64 → 16, accumulation 1 → 4, effective batch 64 kept` (`world_size`: the
    run's processes, where the retune did not change their number)."""
    parts = [_knob_text(k, a, b) for k, (a, b) in changes_of(retune).items()]
    decision = _decision(retune)
    env = decision.get("env")
    if isinstance(env, Mapping):
        parts += [f"{k}={v}" for k, v in env.items()]
    pairs = _batch_pairs(retune)
    if pairs is not None:
        (m0, m1), (a0, a1) = pairs
        if m0 * a0 == m1 * a1:
            parts.append(f"effective batch {m0 * a0 * _world_size(retune, world_size):g} kept")
    action = str(decision.get("action") or "")
    if action == "reduce_eval_batch":
        parts.append("training unchanged")
    if not parts and action in _ACTIONS:
        parts.append(_ACTIONS[action])
    wait = _number(decision.get("wait_s"))
    if wait and action != "wait_for_memory":
        parts.append(f"after waiting {wait:g} s")
    return ", ".join(parts) or "restarted unchanged"


def _world_size(retune: Retune, unchanged: int) -> float:
    """Ranks training together: the effective batch is micro × accumulation × world size. A
    retune records the number only where it changed it; else it is the run's (`unchanged`)."""
    for record in (retune.after, retune.before):
        world = _number(record.get("train.world_size"))
        if world:
            return float(world)
    return float(unchanged)


def model_text(retune: Retune) -> str:
    """`memory model: 18 fits with 3 % to spare; 16 chosen, the largest that divides 64` ("" without
    a model): the largest micro-batch the model says fits, against the one the retune took."""
    prediction = retune.prediction or _decision(retune).get("prediction")
    if not isinstance(prediction, Mapping):
        return ""
    fits = _number(prediction.get("batch"))
    if fits is None:
        basis = prediction.get("basis")
        return f"memory model: no fit yet, {basis}" if basis else ""
    if fits == 0:
        return "memory model: not even one sample fits under the limit"
    text = f"memory model: {fits:g} fits{_spare_text(prediction, fits)}"
    chosen = _number(changes_of(retune).get("batch_size", (None, None))[1])
    if chosen is None:
        return text
    text += f"; {chosen:g} chosen"
    pairs = _batch_pairs(retune)
    if pairs is not None and chosen < fits:
        (m0, _), (a0, _) = pairs
        text += f", the largest that divides {m0 * a0:g}"
    return text


def _spare_text(prediction: Mapping[str, Any], batch: float) -> str:
    """` with 6 % to spare`: what the modelled peak at `batch` leaves of the capacity."""
    fixed, per_sample = _number(prediction.get("fixed")), _number(prediction.get("per_sample"))
    capacity = _number(prediction.get("capacity"))
    if fixed is None or per_sample is None or not capacity:
        return ""
    spare = (capacity - fixed - per_sample * batch) / capacity
    return f" with {spare * 100:.0f} % to spare"


def retune_sentence(retune: Retune, phase: str | None = None, world_size: int = 1) -> str:
    """The whole sentence: where → what changed; what the memory model said (`world_size`: the
    run's processes, for the effective batch)."""
    sentence = f"{where_text(retune, phase)} → {change_text(retune, world_size)}"
    model = model_text(retune)
    decided = (retune.evidence or {}).get("decided")
    if model and isinstance(decided, str) and decided:
        model += f" ({decided})"  # from what was known, or how many probes it took
    return f"{sentence}; {model}" if model else sentence


def oom_phases(events: Iterable[RunEvent]) -> dict[int, str]:
    """attempt → the phase its `oom` event names (forward, backward, optimizer …)."""
    out: dict[int, str] = {}
    for e in events:
        phase = (e.model_extra or {}).get("phase")
        if e.type == "oom" and e.attempt is not None and isinstance(phase, str) and phase:
            out[e.attempt] = phase
    return out
