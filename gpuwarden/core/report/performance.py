"""`gpuwarden report`: a performance report for any run, from its recorded data.

Throughput comes from the runner's progress events (samples or items between the first and the
last progress event of each attempt, over the time between them: the loop's rate, without model
loading), with the rate over the attempts' whole wall time beside it. Power, utilisation and
memory come from the telemetry of the GPUs the attempts ran on; energy from NVML's energy counter
over the attempts' windows.
"""

from __future__ import annotations

import itertools
from typing import Any

from gpuwarden.core.report.energy import AttemptEnergy, energy_block
from gpuwarden.core.report.samples import progress_counts, samples_done
from gpuwarden.core.report.snapshot import RunSnapshot
from gpuwarden.core.report.stats import distribution, mean


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _values(snap: RunSnapshot, metric: str, since: dict[int, float] | None = None) -> list[float]:
    """Bucket averages of `metric` over every GPU window (from `since[attempt]` when given)."""
    out: list[float] = []
    for w in snap.gpus:
        lo = since.get(w.attempt, w.start) if since else w.start
        out += [p[1] for p in w.series.get(metric, []) if p[0] >= lo]
    return out


def _maxima(snap: RunSnapshot, metric: str) -> list[float]:
    return [p[3] for w in snap.gpus for p in w.series.get(metric, [])]


def util_metric(snap: RunSnapshot) -> str:
    """Sub-second utilisation where the GPU reports it (it sees gaps a 1 s reading hides)."""
    return "util_gpu_fine" if _values(snap, "util_gpu_fine") else "util_gpu"


def attempt_samples(snap: RunSnapshot) -> dict[int, int]:
    """Samples (items) each attempt did, each counted once across resumes."""
    return samples_done(progress_counts(snap.events), snap.events)


def throughput(snap: RunSnapshot) -> dict[str, Any]:
    """Samples/items and tokens done, and their rates: the loop's and over wall time."""
    done = attempt_samples(snap)
    samples = tokens = 0
    loop_samples = loop_tokens = 0.0
    loop_s = 0.0
    reported: list[int] = []  # attempts with progress
    covered: list[int] = []  # those with an interval between two progress events
    for a in snap.attempts:
        progress = snap.runner_events("progress", a.attempt)
        if not progress:
            continue
        reported.append(a.attempt)
        last = progress[-1]
        samples += done.get(a.attempt, 0)
        tokens += int(last.get("tokens_seen") or 0) - _tokens_base(snap, a.attempt, progress[0])
        if len(progress) >= 2:
            covered.append(a.attempt)
            first = progress[0]
            loop_s += float(last["ts"]) - float(first["ts"])
            loop_samples += int(last.get("samples_seen") or 0) - int(first.get("samples_seen") or 0)
            loop_tokens += int(last.get("tokens_seen") or 0) - int(first.get("tokens_seen") or 0)
    wall = sum(a.wall_s for a in snap.attempts)
    source = "progress"
    rate: float | None = loop_samples / loop_s if loop_s > 0 else None
    token_rate: float | None = loop_tokens / loop_s if loop_s > 0 and loop_tokens else None
    if rate is None:
        # one progress event only: the runner's own figure from its finished report
        reports = [e.get("report") or {} for e in snap.runner_events("finished")]
        rates = [_num(r.get("samples_per_s", r.get("items_per_s"))) for r in reports]
        known = [r for r in rates if r is not None]
        rate = known[-1] if known else None
        source = "finished report" if known else "none"
        token_rates = [t for t in (_num(r.get("tokens_per_s")) for r in reports) if t is not None]
        token_rate = token_rates[-1] if known and token_rates else None
    return {
        "unit": "items" if snap.kind == "infer" else "samples",
        "samples": samples,
        "tokens": tokens or None,
        "samples_per_s": rate,
        "tokens_per_s": token_rate,
        "samples_per_s_wall": samples / wall if wall > 0 and samples else None,
        "source": source,
        "loop_note": _loop_note(reported, covered) if source == "progress" else None,
    }


def _tokens_base(snap: RunSnapshot, attempt: int, first: dict[str, Any]) -> int:
    """The token count attempt `attempt` started from, as `samples_done` finds its samples' base:
    its runner's `started` event says it; an attempt the daemon handed no checkpoint counts from
    0; one handed a checkpoint, or that says it loaded one (whose tokens no event names), is sure
    only of what it did from its first report on; else it started at most where earlier attempts
    got."""
    started = snap.runner_events("started", attempt)
    said = started[-1].get("tokens_seen") if started else None
    if isinstance(said, int) and not isinstance(said, bool):
        return said
    own = _tokens(first)
    if started and started[-1].get("resumed_from"):
        return own  # it counts on from a checkpoint whose tokens no event names
    prepared = [
        e
        for e in snap.events
        if e.get("type") == "prepared" and e.get("source") == "daemon" and e.get("attempt") == attempt
    ]
    if prepared and "resume_from" in prepared[-1]:
        return 0 if prepared[-1]["resume_from"] is None else own
    earlier = [_tokens(e) for e in snap.runner_events("progress") if int(e.get("attempt") or 0) < attempt]
    return min(max(earlier, default=0), own)


def _tokens(event: dict[str, Any]) -> int:
    return int(event.get("tokens_seen") or 0)


def _loop_note(reported: list[int], covered: list[int]) -> str | None:
    """Which attempts the loop rate leaves out, where it leaves any out. An attempt that reported
    progress once has no interval between two reports, and its process's start (imports, model
    and data loading) is no start of its loop: the rate is the other attempts' alone."""
    once = [a for a in reported if a not in covered]
    if not once:
        return None
    return f"the loop rate is {_attempts(covered)}'s only: {_attempts(once)} reported progress once"


def _attempts(numbers: list[int]) -> str:
    return ("attempts " if len(numbers) > 1 else "attempt ") + ", ".join(map(str, numbers))


def per_batch_size(snap: RunSnapshot) -> dict[str, dict[str, Any]]:
    """Steps (optimizer steps; batches for inference) per micro-batch size and their mean time,
    from the intervals between consecutive progress events of an attempt."""
    acc: dict[int, list[float]] = {}  # size → [steps, seconds, samples]
    for a in snap.attempts:
        progress = snap.runner_events("progress", a.attempt)
        for prev, cur in itertools.pairwise(progress):
            size = cur.get("batch_size")
            steps = int(cur.get("step") or 0) - int(prev.get("step") or 0)
            if not isinstance(size, int) or steps <= 0:
                continue
            slot = acc.setdefault(size, [0.0, 0.0, 0.0])
            slot[0] += steps
            slot[1] += float(cur["ts"]) - float(prev["ts"])
            slot[2] += int(cur.get("samples_seen") or 0) - int(prev.get("samples_seen") or 0)
    return {
        str(size): {
            "steps": int(steps),
            "mean_step_s": seconds / steps,
            "samples": int(samples),
            "samples_per_s": samples / seconds if seconds > 0 else None,
        }
        for size, (steps, seconds, samples) in sorted(acc.items())
    }


def _capacity(snap: RunSnapshot) -> int | None:
    sizes = [int(v) for v in _maxima(snap, "mem_total") if v]
    for w in snap.gpus:
        total = snap.gpu_info.get(w.uuid, {}).get("memory_total")
        if total:
            sizes.append(int(total))
    return max(sizes) if sizes else None


def memory(snap: RunSnapshot) -> dict[str, Any]:
    """The runner's peak (allocator on a GPU, resident set on the CPU), NVML's peak, capacity."""
    peaks = [_num(e.get("mem_peak")) for e in snap.runner_events("progress")]
    for e in snap.runner_events("finished"):
        report = e.get("report") or {}
        peaks += [_num(report.get("mem_peak")), _num(report.get("peak_memory_bytes"))]
    known = [p for p in peaks if p is not None]
    runner_peak = int(max(known)) if known else None
    used = _maxima(snap, "mem_used")
    gpu_peak = int(max(used)) if used else None
    capacity = _capacity(snap)
    on_gpu = any(a.gpus for a in snap.attempts)
    basis = gpu_peak if gpu_peak is not None else (runner_peak if on_gpu else None)
    kind = "cuda_allocated" if on_gpu else "host_rss"
    counted = [a.peak_rss for a in snap.attempts if a.peak_rss]
    if runner_peak is None and not on_gpu and counted:
        # A program that reports nothing still had a peak: the kernel's, from its exit record.
        runner_peak, kind = max(counted), "program_rss"
    return {
        "runner_peak_bytes": runner_peak,
        "runner_peak_kind": kind,
        "gpu_used_peak_bytes": gpu_peak,
        "capacity_bytes": capacity,
        "peak_pct": 100.0 * basis / capacity if basis is not None and capacity else None,
    }


def energy(snap: RunSnapshot, tokens: int | None) -> dict[str, Any]:
    """Joules over the attempts' windows, per sample, per kWh and per token, for the run and for
    each attempt; None without a GPU counter."""
    done = attempt_samples(snap)
    attempts = []
    for a in snap.attempts:
        readings = [w.energy_j for w in snap.gpus if w.attempt == a.attempt and w.energy_j is not None]
        joules = sum(readings) if readings else None
        attempts.append(AttemptEnergy(a.attempt, joules, done.get(a.attempt, 0)))
    return energy_block(attempts, tokens)


def power(snap: RunSnapshot) -> dict[str, Any]:
    values = _values(snap, "power_w")
    limits = _values(snap, "power_limit_w")
    limit = mean(limits)
    dist = distribution(values)
    return {
        **{f"{k}_w" if k != "n" else k: v for k, v in dist.items()},
        "limit_w": limit,
        "mean_pct": 100.0 * dist["mean"] / limit if dist["mean"] is not None and limit else None,
    }


def utilisation(snap: RunSnapshot) -> dict[str, Any]:
    metric = util_metric(snap)
    return {"metric": metric, **distribution(_values(snap, metric))}


def loss(snap: RunSnapshot, last_report: dict[str, Any]) -> dict[str, Any]:
    """First and last loss: the runner's finished report's, else (a user's script reports its
    loss only in progress) the run's first and last progress event's."""
    first, last = _num(last_report.get("loss_first")), _num(last_report.get("loss_last"))
    if first is None and last is None:
        losses = [v for e in snap.runner_events("progress") if (v := _num(e.get("loss"))) is not None]
        if losses:
            first, last = losses[0], losses[-1]
    return {"first": first, "last": last}


def retunes(snap: RunSnapshot) -> list[dict[str, Any]]:
    return [
        {
            "attempt": r.get("attempt"),
            "from": r.get("from"),
            "to": r.get("to"),
            "verdict": r.get("verdict"),
            "outcome": r.get("outcome"),
        }
        for r in snap.retunes
    ]


def build_report(snap: RunSnapshot) -> dict[str, Any]:
    """The whole report as JSON-ready data."""
    run = snap.run
    tp = throughput(snap)
    started = [s for a in snap.attempts if (s := snap.started(a.attempt)) is not None]
    last_started = started[-1] if started else {}
    finished = snap.runner_events("finished")
    last_report = finished[-1].get("report") or {} if finished else {}
    spec = snap.spec
    section = spec.get(snap.kind) if isinstance(spec.get(snap.kind), dict) else {}
    starts = [a.start for a in snap.attempts]
    ends = [a.end for a in snap.attempts]
    return {
        "run": {
            "id": run.get("id"),
            "name": run.get("name"),
            "kind": run.get("kind"),
            "task": (section or {}).get("task"),
            "state": run.get("state"),
            "device": last_started.get("device") or _placed_on(snap),
            "dtype": last_started.get("dtype"),
        },
        "source": snap.source,
        "wall_s": sum(a.wall_s for a in snap.attempts),
        "span_s": max(ends) - min(starts) if starts else 0.0,
        "throughput": tp,
        "per_batch_size": per_batch_size(snap),
        "memory": memory(snap),
        "energy": energy(snap, tp["tokens"]),
        "power": power(snap),
        "utilisation": utilisation(snap),
        "loss": loss(snap, last_report),
        "gpus": [
            {
                "uuid": uuid,
                "name": snap.gpu_info.get(uuid, {}).get("name"),
                "memory_total": snap.gpu_info.get(uuid, {}).get("memory_total"),
            }
            for uuid in dict.fromkeys(w.uuid for w in snap.gpus)
        ],
        "attempts": [a.to_dict() for a in snap.attempts],
        "retunes": retunes(snap),
        "telemetry_tier_s": _step(snap),
    }


def _placed_on(snap: RunSnapshot) -> str | None:
    """Where the last attempt ran, for a program that did not say (a command run without the
    SDK): `cpu`, or `cuda` on the GPUs it was given."""
    if not snap.attempts:
        return None
    return "cuda" if snap.attempts[-1].gpus else "cpu"


def _step(snap: RunSnapshot) -> float | None:
    """Seconds between telemetry points used (1 while raw samples exist)."""
    steps: list[float] = []
    for w in snap.gpus:
        pts = w.series.get("power_w") or w.series.get("util_gpu") or []
        if len(pts) >= 2:
            steps.append(min(b[0] - a[0] for a, b in itertools.pairwise(pts)))
    return min(steps) if steps else None
