"""Checks on a run's recorded telemetry: is the GPU doing useful work, and if not, why.

Power is judged before utilisation (a training run drew 300 W of a 575 W limit while utilisation read high):
a GPU at a small share of its power limit is underused whatever its utilisation says. Windows
start at each attempt's first progress event, so model loading and compilation do not count.
"""

from __future__ import annotations

from typing import Any

from gpuwarden.core.doctor.finding import Finding
from gpuwarden.core.report.performance import util_metric
from gpuwarden.core.report.snapshot import RunSnapshot
from gpuwarden.core.report.stats import mean
from gpuwarden.core.telemetry.types import THROTTLE_ACTIVE_MASK, throttle_names

UNDERUSED_POWER_PCT = 60.0  # same bound as the monitor's verdict
UNDERUSED_UTIL_PCT = 70.0
HEADROOM_PEAK_PCT = 50.0  # peak memory under this share of the card: a bigger batch fits
HEADROOM_TARGET_PCT = 80.0  # grow the batch towards this share, linearly (over-estimates memory)
GAP_UTIL_PCT = 30.0  # a sample this idle is a gap in the GPU's work
GAP_SHARE_PCT = 20.0  # gaps in this share of samples are a pattern, not noise
CPU_BUSY_PCT = 80.0  # host CPU (or the run's process, of one core) this busy: CPU-bound
THROTTLED_SHARE_PCT = 10.0
POWER_REASONS = {"sw_power_cap", "hw_power_brake"}
THERMAL_REASONS = {"sw_thermal", "hw_thermal", "hw_slowdown"}


def _steady_start(snap: RunSnapshot) -> dict[int, float]:
    """Per attempt, where steady work begins: its first progress event, else its start."""
    out: dict[int, float] = {}
    for a in snap.attempts:
        first = snap.first_progress_ts(a.attempt)
        out[a.attempt] = first if first is not None and first < a.end else a.start
    return out


def _points(
    snap: RunSnapshot, metric: str, since: dict[int, float]
) -> list[tuple[float, float, float, float]]:
    out: list[tuple[float, float, float, float]] = []
    for w in snap.gpus:
        lo = since.get(w.attempt, w.start)
        out += [p for p in w.series.get(metric, []) if p[0] >= lo]
    return out


def _host_cpu(snap: RunSnapshot, since: dict[int, float]) -> float | None:
    values = [
        p[1]
        for attempt, series in snap.host.items()
        for p in series.get("cpu_percent", [])
        if p[0] >= since.get(attempt, 0.0)
    ]
    return mean(values)


def _own_pids(snap: RunSnapshot) -> set[int]:
    """The run's processes: each attempt's (its exit-status recorder), and the runners it
    started, which name themselves in their `started` events (every rank of a gang)."""
    started = {e.get("pid") for e in snap.runner_events("started")}
    return {int(a.pid) for a in snap.attempts if a.pid is not None} | {
        pid for pid in started if isinstance(pid, int)
    }


def _process_cpu(snap: RunSnapshot, since: dict[int, float]) -> float | None:
    """Mean CPU % (100 = one core) of the run's own process, from the GPU process scans."""
    own = _own_pids(snap)
    values = [
        float(p["cpu_percent"])
        for w in snap.gpus
        for p in (w.processes or [])
        if p.get("pid") in own
        and p.get("cpu_percent") is not None
        and float(p["ts"]) >= since.get(w.attempt, 0)
    ]
    return mean(values)


def _spec_value(snap: RunSnapshot, section: str, key: str) -> Any:
    body = snap.spec.get(section)
    return body.get(key) if isinstance(body, dict) else None


def check_power(snap: RunSnapshot, since: dict[int, float]) -> list[Finding]:
    power = [p[1] for p in _points(snap, "power_w", since)]
    limits = [p[1] for p in _points(snap, "power_limit_w", since)]
    metric = util_metric(snap)
    util = mean([p[1] for p in _points(snap, metric, since)])
    power_mean, limit = mean(power), mean(limits)
    if power_mean is None or not limit:
        if util is not None and util < UNDERUSED_UTIL_PCT:
            return [
                Finding(
                    "gpu-underused",
                    "warning",
                    f"GPU utilisation averages {util:.0f} % (this GPU reports no power)",
                    {"util_mean_pct": round(util, 1), "util_metric": metric},
                    "see the spec findings: bigger micro-batch, mixed precision, compile, data workers",
                    "reported for an image-restoration CNN: 20 % → 80–85 % utilisation, 2–5× training speed",
                )
            ]
        return []
    pct = 100.0 * power_mean / limit
    if pct >= UNDERUSED_POWER_PCT:
        return []
    evidence: dict[str, Any] = {
        "power_mean_w": round(power_mean, 1),
        "power_limit_w": round(limit, 1),
        "power_pct": round(pct, 1),
        "samples": len(power),
    }
    if util is not None:
        evidence["util_mean_pct"] = round(util, 1)
        evidence["util_metric"] = metric
    return [
        Finding(
            "gpu-underused",
            "warning",
            f"the GPU drew {power_mean:.0f} W of its {limit:.0f} W limit ({pct:.0f} %): it is underused",
            evidence,
            "see the spec findings: bigger micro-batch, mixed precision, compile, fewer syncs",
            "reported for a small CNN on a 575 W card: 300 W → 450–500 W and ~100 → 200–250 samples/s"
            " after these fixes",
        )
    ]


def check_headroom(snap: RunSnapshot, since: dict[int, float]) -> list[Finding]:
    used = [p[3] for p in _points(snap, "mem_used", since)]
    totals = [p[3] for p in _points(snap, "mem_total", since)]
    if not used or not totals:
        return []
    peak, total = max(used), max(totals)
    pct = 100.0 * peak / total
    if pct >= HEADROOM_PEAK_PCT:
        return []
    evidence: dict[str, Any] = {
        "mem_peak_bytes": int(peak),
        "mem_total_bytes": int(total),
        "peak_pct": round(pct, 1),
    }
    fix: dict[str, Any] | str = "raise the micro-batch (or the model/crop size): memory allows it"
    factor = int(HEADROOM_TARGET_PCT / pct) if pct > 0 else 0
    section = snap.kind
    batch = _spec_value(snap, section, "batch_size")
    if isinstance(batch, int) and factor >= 2:
        # Memory grows less than linearly with the batch (weights and optimizer state are fixed),
        # so scaling the whole peak is a conservative estimate.
        factor = min(factor, 4)
        evidence["batch_size"] = batch
        fix = {f"{section}.batch_size": batch * factor}
    return [
        Finding(
            "memory-headroom",
            "warning" if pct < HEADROOM_PEAK_PCT / 2 else "info",
            f"peak memory {pct:.0f} % of the card: a {'larger batch' if factor >= 2 else 'bigger load'} fits",
            evidence,
            fix,
            "typically +30–50 % samples/s for a 2–4× larger batch",
        )
    ]


def check_data_loading(snap: RunSnapshot, since: dict[int, float]) -> list[Finding]:
    metric = util_metric(snap)
    utils = [p[1] for p in _points(snap, metric, since)]
    if not utils:
        return []
    gaps = sum(1 for u in utils if u < GAP_UTIL_PCT)
    share = 100.0 * gaps / len(utils)
    if share < GAP_SHARE_PCT:
        return []
    host = _host_cpu(snap, since)
    proc = _process_cpu(snap, since)
    busy = (host is not None and host >= CPU_BUSY_PCT) or (proc is not None and proc >= CPU_BUSY_PCT)
    if not busy:
        return []
    evidence: dict[str, Any] = {
        "gap_share_pct": round(share, 1),
        "gap_below_util_pct": GAP_UTIL_PCT,
        "samples": len(utils),
        "util_metric": metric,
        "host_cpu_mean_pct": round(host, 1) if host is not None else None,
        "process_cpu_mean_pct": round(proc, 1) if proc is not None else None,
    }
    workers = _spec_value(snap, "train", "num_workers")
    if snap.kind == "train":
        evidence["num_workers"] = workers
    fix: dict[str, Any] | str = (
        {"train.num_workers": "auto"}
        if workers == 0
        else "give the DataLoader more workers, decode less per sample, or raise prefetch_factor"
    )
    return [
        Finding(
            "data-loading-bound",
            "warning",
            f"the GPU idled in {share:.0f} % of samples while the CPU was busy: data loading holds it back",
            evidence,
            fix,
            "reported for an image-restoration CNN: utilisation 20 % → 80–85 %",
        )
    ]


def check_throttling(snap: RunSnapshot, since: dict[int, float]) -> list[Finding]:
    masks = [int(p[3]) for p in _points(snap, "throttle_reasons", since)]
    if not masks:
        return []
    counts: dict[str, int] = {}
    throttled = 0
    for m in masks:
        active = m & THROTTLE_ACTIVE_MASK
        if active:
            throttled += 1
            for name in throttle_names(active):
                counts[name] = counts.get(name, 0) + 1
    share = 100.0 * throttled / len(masks)
    if share < THROTTLED_SHARE_PCT:
        return []
    shares = {
        name: round(100.0 * n / len(masks), 1) for name, n in sorted(counts.items(), key=lambda kv: -kv[1])
    }
    thermal = any(name in THERMAL_REASONS for name in counts)
    temps = [p[3] for p in _points(snap, "temperature_c", since)]
    evidence: dict[str, Any] = {
        "throttled_pct": round(share, 1),
        "reasons_pct": shares,
        "samples": len(masks),
    }
    if temps:
        evidence["temperature_max_c"] = max(temps)
    if thermal:
        return [
            Finding(
                "throttled-thermal",
                "warning",
                f"clocks were cut for heat in {share:.0f} % of samples",
                evidence,
                "improve cooling (airflow, fan curve, dust) or lower the power limit a little",
                None,
            )
        ]
    return [
        Finding(
            "throttled-power",
            "info",
            f"the GPU ran at its power limit in {share:.0f} % of samples",
            evidence,
            "the card is fully used; only a higher power limit (nvidia-smi -pl) would go faster",
            None,
        )
    ]


def check_other_processes(snap: RunSnapshot, since: dict[int, float]) -> list[Finding]:
    own = _own_pids(snap)
    others: dict[int, dict[str, Any]] = {}
    for w in snap.gpus:
        for p in w.processes or []:
            pid = p.get("pid")
            if not isinstance(pid, int) or pid in own:
                continue
            slot = others.setdefault(
                pid, {"pid": pid, "name": p.get("name"), "gpus": [], "used_memory_max": 0}
            )
            if w.uuid not in slot["gpus"]:
                slot["gpus"].append(w.uuid)
            slot["used_memory_max"] = max(slot["used_memory_max"], int(p.get("used_memory") or 0))
    if not others:
        return []
    procs = sorted(others.values(), key=lambda p: -int(p["used_memory_max"]))
    return [
        Finding(
            "other-processes",
            "warning",
            f"{len(procs)} other process(es) used the run's GPU(s) during the run",
            {
                "processes": procs[:10],
                "used_memory_total_bytes": sum(int(p["used_memory_max"]) for p in procs),
            },
            "stop them, or place the run on another GPU (resources.gpus with a UUID)",
            None,
        )
    ]


def check_run(snap: RunSnapshot) -> tuple[list[Finding], list[str]]:
    """Telemetry findings for a run, and notes about what could not be checked."""
    notes: list[str] = []
    if not any(a.gpus for a in snap.attempts):
        notes.append("telemetry checks: skipped — the run used no GPU")
        return [], notes
    if not any(w.series.get("power_w") or w.series.get("util_gpu") for w in snap.gpus):
        notes.append("telemetry checks: skipped — no GPU samples recorded in the run's windows")
        return [], notes
    if any(w.processes is None for w in snap.gpus):
        notes.append(
            "other processes: not checked — no process reads are kept for the run's time"
            " (they are kept as long as raw samples, 48 h by default)"
        )
    since = _steady_start(snap)
    findings: list[Finding] = []
    for check in (check_power, check_headroom, check_data_loading, check_throttling, check_other_processes):
        findings += check(snap, since)
    return findings, notes
