"""NVML truth: every metric the sampler stores, against `nvidia-smi --query-gpu` read just before and
just after it, with the GPU idle and then busy with a steady matrix-product load.

A reading passes when it lies within the tolerance of either nvidia-smi reading or between them;
a metric passes when at least 80 % of its readings do (clocks and power move between two reads
even under a steady load). The energy counter has no nvidia-smi field: its rate over a few
seconds is compared with nvidia-smi's mean power over the same seconds. Capability probing: what
the card answers NotSupported to, and whether nvidia-smi agrees (N/A there too). Energy, power
and the power limit come from one nvmlDeviceGetFieldValues call where the driver offers them (the
step's notes name, per GPU, which readings did), so those are the values compared.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpucheck.result import StepResult, check_row

MIB = 2**20
READINGS = 5
LOAD_START_TIMEOUT_S = 120.0  # torch's import and CUDA's start before the first product
LOAD_SETTLE_S = 3.0  # clocks and power settle once the card is busy
LOAD_SECONDS = 300.0  # longer than the busy phase can take; the load is killed after it
BUSY_UTIL = 90.0
PASS_SHARE = 0.8
_LOAD = (
    "import sys, time, torch\n"
    "a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\n"
    "end = time.time() + float(sys.argv[1])\n"
    "while time.time() < end:\n"
    "    for _ in range(20):\n"
    "        a = (a @ a).clamp_(-1, 1)\n"
    "    torch.cuda.synchronize()\n"
)


def _within(abs_tol: float = 0.0, rel_tol: float = 0.0) -> Callable[[float, float], bool]:
    return lambda ours, ref: abs(ours - ref) <= max(abs_tol, rel_tol * abs(ref))


@dataclass(frozen=True)
class Metric:
    """A stored metric, the nvidia-smi fields it may equal (any of them, scaled), the tolerance."""

    name: str
    fields: tuple[str, ...]
    scale: float
    close: Callable[[float, float], bool]
    tolerance: str
    mask: int | None = None  # bit masks compare only these bits


def _metrics() -> list[Metric]:
    from gpuwarden.core.telemetry.types import THROTTLE_ACTIVE_MASK

    return [
        Metric("util_gpu", ("utilization.gpu",), 1, _within(10), "±10 points"),
        Metric("util_gpu_fine", ("utilization.gpu",), 1, _within(15), "±15 points (sub-second mean vs 1 s)"),
        Metric("util_mem", ("utilization.memory",), 1, _within(10), "±10 points"),
        Metric(
            "mem_used",
            ("memory.used", "memory.used+memory.reserved"),
            MIB,
            _within(64 * MIB, 0.01),
            "±64 MiB or 1 %",
        ),
        Metric(
            "mem_total",
            ("memory.total", "memory.total-memory.reserved"),
            MIB,
            _within(2 * MIB, 0.001),
            "±2 MiB",
        ),
        Metric(
            "power_w",
            ("power.draw", "power.draw.instant", "power.draw.average"),
            1,
            _within(15, 0.10),
            "±15 W or 10 %",
        ),
        Metric("power_limit_w", ("enforced.power.limit", "power.limit"), 1, _within(1), "±1 W"),
        Metric("temperature_c", ("temperature.gpu",), 1, _within(2), "±2 °C"),
        Metric("sm_clock_mhz", ("clocks.sm",), 1, _within(45, 0.05), "±45 MHz or 5 %"),
        Metric("mem_clock_mhz", ("clocks.mem",), 1, _within(45, 0.05), "±45 MHz or 5 %"),
        Metric(
            "throttle_reasons",
            ("clocks_event_reasons.active", "clocks_throttle_reasons.active"),
            1,
            lambda a, b: a == b,
            "same slow-down bits",
            mask=THROTTLE_ACTIVE_MASK,
        ),
        Metric("fan_pct", ("fan.speed",), 1, _within(3), "±3 points"),
        Metric("pstate", ("pstate",), 1, lambda a, b: a == b, "equal"),
    ]


def valid_fields() -> set[str]:
    """The field names this nvidia-smi accepts (`--help-query-gpu` quotes each one)."""
    text = subprocess.run(
        ["nvidia-smi", "--help-query-gpu"], capture_output=True, text=True, timeout=60
    ).stdout
    return set(re.findall(r'"([a-z_.]+)"', text))


def parse(value: str) -> float | None:
    """nvidia-smi's text (nounits) as a number; None for N/A and Not Supported."""
    v = value.strip()
    if not v or v.startswith("[") or v.upper() in ("N/A", "NOT SUPPORTED"):
        return None
    if re.fullmatch(r"P\d+", v):
        return float(v[1:])
    if v.lower().startswith("0x"):
        return float(int(v, 16))
    try:
        return float(v)
    except ValueError:
        return None


def query(fields: list[str]) -> dict[str, dict[str, float | None]]:
    """{uuid: {field: value}} from one `nvidia-smi --query-gpu` call."""
    done = subprocess.run(
        ["nvidia-smi", f"--query-gpu=uuid,{','.join(fields)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    out: dict[str, dict[str, float | None]] = {}
    for line in done.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        out[parts[0]] = {f: parse(v) for f, v in zip(fields, parts[1:], strict=False)}
    return out


def _reference(m: Metric, smi: dict[str, float | None]) -> list[float]:
    """The values `m` may equal in one nvidia-smi reading (in our units)."""
    refs: list[float] = []
    for f in m.fields:
        base, _, extra = f.partition("+") if "+" in f else f.partition("-")
        value = smi.get(base)
        if value is None:
            continue
        if extra:
            other = smi.get(extra)
            if other is None:
                continue
            value = value + other if "+" in f else value - other
        refs.append(value * m.scale)
    return refs


def _agrees(m: Metric, ours: float, before: list[float], after: list[float]) -> bool:
    if m.mask is not None:
        ours = float(int(ours) & m.mask)
        before = [float(int(v) & m.mask) for v in before]
        after = [float(int(v) & m.mask) for v in after]
    if any(m.close(ours, r) for r in before + after):
        return True
    return any(min(a, b) <= ours <= max(a, b) for a in before for b in after)


def _phase(
    phase: str, metrics: list[Metric], fields: list[str]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Paired readings of every metric; rows per metric and GPU, and the raw readings."""
    from gpuwarden.core.telemetry.nvml import open_gpu_reader

    reader = open_gpu_reader()
    try:
        reader.sample(time.time())  # the first call probes what each GPU supports
        names = {g.uuid: f"GPU {g.index}" for g in reader.gpus()}
        seen: dict[tuple[str, str], list[tuple[float | None, list[float], list[float]]]] = {}
        for _ in range(READINGS):
            before = query(fields)
            samples = reader.sample(time.time())
            after = query(fields)
            for s in samples:
                for m in metrics:
                    value = getattr(s, m.name)
                    refs = (_reference(m, before.get(s.uuid, {})), _reference(m, after.get(s.uuid, {})))
                    seen.setdefault((s.uuid, m.name), []).append((value, *refs))
            time.sleep(0.5)  # spread the readings over a few seconds of the phase
        energy = _energy_check(reader, fields, phase, names)
    finally:
        reader.close()
    rows: list[dict[str, Any]] = []
    for m in metrics:
        for uuid, label in names.items():
            rows.append(_metric_row(m, phase, label, seen.get((uuid, m.name), [])))
    return rows + energy, {f"{names[u]} {n}": v for (u, n), v in seen.items()}


def _metric_row(
    m: Metric, phase: str, gpu: str, readings: list[tuple[float | None, list[float], list[float]]]
) -> dict[str, Any]:
    check = f"{gpu} {m.name} ({phase})"
    ours = [r[0] for r in readings]
    refs = [v for r in readings for v in r[1] + r[2]]
    if all(v is None for v in ours) and not refs:
        return check_row(check, None, "N/A in both", m.tolerance, True)
    if all(v is None for v in ours) or not refs:
        return check_row(check, ours[-1] if ours else None, refs[-1] if refs else "N/A", m.tolerance, False)
    good = sum(1 for v, b, a in readings if v is not None and (b or a) and _agrees(m, v, b, a))
    shown = f"{min(refs):.6g}–{max(refs):.6g} ({' / '.join(m.fields)})"
    known = [v for v in ours if v is not None]
    return check_row(
        check,
        f"{statistics.median(known):.6g} ({good}/{len(readings)} within)",
        shown,
        m.tolerance,
        good >= PASS_SHARE * len(readings),
    )


def _energy_check(reader: Any, fields: list[str], phase: str, names: dict[str, str]) -> list[dict[str, Any]]:
    """The counter's rate over ~5 s against nvidia-smi's mean power over the same seconds."""
    candidates: tuple[str, ...] = ("power.draw", "power.draw.average")
    power_fields = [f for f in candidates if f in fields][:1]
    if not power_fields:
        return []
    start = {u: reader.energy_mj(u) for u in names}
    t0 = time.monotonic()
    powers: dict[str, list[float]] = {u: [] for u in names}
    while time.monotonic() - t0 < 5.0:
        for uuid, row in query(power_fields).items():
            if uuid in powers and row.get(power_fields[0]) is not None:
                powers[uuid].append(float(row[power_fields[0]] or 0))
        time.sleep(0.2)
    elapsed = time.monotonic() - t0
    rows = []
    for uuid, label in names.items():
        end = reader.energy_mj(uuid)
        check = f"{label} energy_mj rate ({phase})"
        if start[uuid] is None or end is None or not powers[uuid]:
            rows.append(check_row(check, None, "no counter or no power reading", "", None))
            continue
        rate = (end - start[uuid]) / 1000 / elapsed
        mean = statistics.fmean(powers[uuid])
        rows.append(
            check_row(
                check,
                f"{rate:.1f} W",
                f"{mean:.1f} W (mean of {power_fields[0]})",
                "±10 %",
                abs(rate - mean) <= 0.10 * max(mean, 1.0),
            )
        )
    return rows


def _capabilities(fields: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """What each GPU answers NotSupported to, and whether nvidia-smi says N/A for it too."""
    from gpuwarden.core.telemetry.nvml import open_gpu_reader

    reader = open_gpu_reader()
    try:
        reader.sample(time.time())
        reader.read_pcie(reader.sample(time.time()))
        reader.processes(time.time())
        gpus = reader.gpus()
        # Which readings the compared samples took from field values rather than getters.
        fields_of = getattr(reader, "field_readings", lambda uuid: ())
        batched = {g.uuid: fields_of(g.uuid) for g in gpus}
    finally:
        reader.close()
    smi = query(fields)
    by_name = {m.name: m for m in _metrics()}
    rows, notes = [], []
    for g in gpus:
        unsupported = sorted(g.unsupported)
        notes.append(f"GPU {g.index} ({g.name}): NotSupported — {', '.join(unsupported) or 'nothing'}")
        notes.append(f"GPU {g.index}: read as field values — {', '.join(batched.get(g.uuid, ())) or 'none'}")
        for field in unsupported:
            m = by_name.get(field)
            if m is None:
                continue
            refs = _reference(m, smi.get(g.uuid, {}))
            rows.append(
                check_row(
                    f"GPU {g.index} {field} unsupported",
                    "None",
                    refs[0] if refs else "N/A",
                    "nvidia-smi N/A too",
                    not refs,
                )
            )
    return rows, notes


def _load(seconds: float) -> list[subprocess.Popen[bytes]]:
    """One steady matrix-product loop per GPU, for `seconds`."""
    from gpuwarden.core.telemetry.nvml import open_gpu_reader

    reader = open_gpu_reader()
    try:
        uuids = [g.uuid for g in reader.gpus()]
    finally:
        reader.close()
    return [
        subprocess.Popen(
            [sys.executable, "-c", _LOAD, str(seconds)],
            env={**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": uuid},
        )
        for uuid in uuids
    ]


def _wait_busy(loads: list[subprocess.Popen[bytes]]) -> None:
    """Until nvidia-smi says every GPU is busy twice in a row: a load process starts in seconds
    on one machine and in tens of seconds on another (torch's import, CUDA's start)."""
    deadline, streak = time.monotonic() + LOAD_START_TIMEOUT_S, 0
    while streak < 2:
        if time.monotonic() > deadline or any(p.poll() is not None for p in loads):
            raise RuntimeError("the matrix-product load did not make the GPUs busy")
        utils = [row.get("utilization.gpu") for row in query(["utilization.gpu"]).values()]
        streak = streak + 1 if utils and all(u is not None and u >= BUSY_UTIL for u in utils) else 0
        time.sleep(0.5)


def run(name: str) -> StepResult:
    valid = valid_fields()
    metrics = _metrics()
    wanted = {part for m in metrics for f in m.fields for part in re.split(r"[+-]", f)}
    fields = sorted(f for f in wanted if f in valid)
    notes = [f"nvidia-smi fields used: {', '.join(fields)}"]
    missing = sorted(wanted - set(fields))
    if missing:
        notes.append(f"fields this nvidia-smi does not know: {', '.join(missing)}")
    idle_rows, idle_raw = _phase("idle", metrics, fields)
    loads = _load(LOAD_SECONDS)
    try:
        _wait_busy(loads)
        time.sleep(LOAD_SETTLE_S)
        busy_rows, busy_raw = _phase("busy", metrics, fields)
    finally:
        for p in loads:
            p.kill()
            p.wait()
    # The paired readings, for reading a disagreement in the step's log.
    print(json.dumps({"idle": idle_raw, "busy": busy_raw}, default=str))
    caps, cap_notes = _capabilities(fields)
    rows = idle_rows + busy_rows + caps
    bad = [r["check"] for r in rows if r["ok"] is False]
    summary = f"{len(rows) - len(bad)} of {len(rows)} comparisons agree" + (
        f"; off: {', '.join(bad)}" if bad else ""
    )
    return StepResult(name, "failed" if bad else "passed", summary, rows, notes + cap_notes)
