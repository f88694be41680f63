"""A deterministic in-memory dashboard backend for tests, snapshots and benchmarks (`make bench`
imports it from here: it is a test double, not part of the product).

Every reading is a pure function of the time and the GPU's index, so a frozen clock gives the same
screen every time. Controls are recorded in `actions` and change the runs the way the daemon
would, so a test can press keys and then assert what the dashboard asked for.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any, Literal

from gpuwarden.core.api import Attempt, LogChunk, Retune, RunMetric
from gpuwarden.core.api.runs import AttemptRecord, ConfigCopy
from gpuwarden.core.errors import UserError
from gpuwarden.core.run_state import RunState
from gpuwarden.core.telemetry.types import GpuSample, GpuStatic, HostSample
from gpuwarden.tui.backend import (
    DoctorFinding,
    EventFrame,
    Frame,
    HistorySeries,
    HostSeries,
    HostTop,
    Point,
    ProcessInfo,
    RunDetailView,
    RunFrame,
    RunRow,
    SampleFrame,
    Snapshot,
    SourceStatus,
    TimelineEvent,
    TopProcess,
)
from gpuwarden.tui.rerun_spec import rerun_spec

GIB = 1024**3
MAX_LOG_BACK = 1 << 20  # the most bytes a log read may ask for from the end (the API's bound)
# 2025-11-21 02:40:00 UTC: the frozen "now" of tests and snapshots.
FROZEN_TS = 1_763_692_800.0

_CARDS: tuple[tuple[str, int, float, int, int], ...] = (
    # name, memory, power limit W, max SM MHz, max memory MHz
    ("NVIDIA GeForce RTX 4090", 24 * GIB, 450.0, 2520, 10501),
    ("NVIDIA GeForce RTX 3060", 12 * GIB, 170.0, 1777, 7501),
)


CORES = 8
# The host's other heaviest processes: another user's busy job, a large idle one, a process whose
# owner could not be read, one first seen (no CPU share yet).
_OTHERS = (
    TopProcess(3310, "alice", 61.0, 6 * GIB, "python preprocess.py --workers 8 --shard 3 /data/corpus"),
    TopProcess(1888, "me", 12.5, int(1.2 * GIB), "/usr/bin/python3 -m jupyterlab --no-browser", owned=True),
    TopProcess(2101, "postgres", 4.2, 410 * 1024**2, "postgres: checkpointer"),
    TopProcess(1201, "bob", 0.8, 22 * GIB, "java -Xmx24g -jar /opt/spark/spark-shell.jar"),
    TopProcess(955, None, 0.3, 48 * 1024**2, "systemd-journald"),
    TopProcess(4020, "me", None, 9 * 1024**2, "bash", owned=True),
)


def _wave(ts: float, period: float, phase: float) -> float:
    """0..1, smooth and deterministic."""
    return 0.5 + 0.5 * math.sin(2 * math.pi * ts / period + phase)


# Metrics that do not follow the load: (GPU, time) -> value.
_STEADY_METRICS: dict[str, Callable[[GpuStatic, float], float | None]] = {
    "mem_used": lambda g, ts: round(float(g.memory_total or 0) * (0.35 + 0.5 * _wave(ts, 900.0, g.index))),
    "mem_total": lambda g, ts: float(g.memory_total or 0),
    "power_limit_w": lambda g, ts: g.power_limit_default_w,
    "mem_clock_mhz": lambda g, ts: g.max_mem_clock_mhz,
    "pstate": lambda g, ts: 2.0,
}
# Metrics that follow the load: (GPU, busy 0..1) -> value.
_LOAD_METRICS: dict[str, Callable[[GpuStatic, float], float | None]] = {
    "util_gpu": lambda g, busy: round(100 * busy),
    "util_mem": lambda g, busy: round(70 * busy),
    "util_gpu_fine": lambda g, busy: round(100 * busy, 1),
    "power_w": lambda g, busy: round((g.power_limit_default_w or 300.0) * (0.2 + 0.78 * busy), 1),
    "temperature_c": lambda g, busy: round(38 + 40 * busy),
    "sm_clock_mhz": lambda g, busy: round((g.max_sm_clock_mhz or 2000) * (0.5 + 0.45 * busy)),
    "fan_pct": lambda g, busy: round(30 + 50 * busy),
}


class FakeBackend:
    """Two GPUs (or `gpu_count`), a host, processes and six runs in different states."""

    def __init__(
        self,
        gpu_count: int = 2,
        *,
        clock: Callable[[], float] = lambda: FROZEN_TS,
        interval: float | None = None,
        sampling: str | None = None,
        with_runs: bool = True,
        controls: bool = True,
    ) -> None:
        self.clock = clock
        self.interval = interval  # None: no sample frames (static screens); else seconds per tick
        self._sampling = sampling
        self._controls = controls
        self.actions: list[tuple[Any, ...]] = []
        self.refuse_edits: str | None = None  # the daemon's refusal of the next knob change
        self.fault: str | None = None  # what the daemon cannot write now (its health's `fault`)
        self.history_calls: list[tuple[tuple[str, ...], tuple[str, ...], float, float, int]] = []
        self.host_history_calls: list[tuple[tuple[str, ...], float, float, int]] = []
        self._lock = threading.Lock()
        self._pending: deque[Frame] = deque()
        self._event_id = 100
        self._statics = [self._static(i) for i in range(gpu_count)]
        self._runs: dict[str, RunRow] = {}
        self._details: dict[str, RunDetailView] = {}
        self._logs: dict[str, list[str]] = {}
        self._errs: dict[str, list[str]] = {}  # stderr, by run
        # The output of attempts before a run's current one: (run, attempt, stream) → lines.
        self.earlier_logs: dict[tuple[str, int, str], list[str]] = {}
        self._processes: list[ProcessInfo] = []
        if gpu_count and with_runs:
            self._seed_runs()
        self._seed_processes()

    @classmethod
    def no_gpu(cls, **kwargs: Any) -> FakeBackend:
        """A host without a driver: the daemon samples the host only."""
        kwargs.setdefault("sampling", "no NVIDIA driver found: sampling the host only")
        return cls(0, with_runs=False, **kwargs)

    # -- telemetry ---------------------------------------------------------------------------

    @staticmethod
    def _static(i: int) -> GpuStatic:
        name, mem, limit, sm, memclk = _CARDS[i % len(_CARDS)]
        return GpuStatic(
            uuid=f"GPU-{i:08d}-fake-{i:04d}",
            index=i,
            name=name,
            pci_bus_id=f"00000000:{i + 1:02X}:00.0",
            memory_total=mem,
            power_limit_default_w=limit,
            power_limit_min_w=limit / 3,
            power_limit_max_w=limit,
            max_sm_clock_mhz=sm,
            max_mem_clock_mhz=memclk,
            compute_capability="8.9" if i % 2 == 0 else "8.6",
            driver_version="550.54.15",
            cuda_driver_version="12.4",
        )

    def _value(self, static: GpuStatic, metric: str, ts: float) -> float | None:
        """One metric of one GPU at `ts` (computed alone: history asks for thousands of these)."""
        steady = _STEADY_METRICS.get(metric)
        if steady is not None:
            return steady(static, ts)
        by_load = _LOAD_METRICS.get(metric)
        if by_load is None:
            return None
        i = static.index
        # Minutes-long load swings on top of a daily rhythm, so every history window has a shape.
        busy = 0.15 + 0.85 * (0.7 * _wave(ts, 300.0 + 40 * i, i * 1.3) + 0.3 * _wave(ts, 86_400.0, i))
        return by_load(static, busy)

    def _sample(self, static: GpuStatic, ts: float) -> GpuSample:
        v = {m: self._value(static, m, ts) for m in ("util_gpu", "mem_used", "power_w", "temperature_c")}
        power = v["power_w"] or 0.0
        limit = static.power_limit_default_w or 300.0
        # The first card hits its power cap when busy; the second sits idle-clocked when quiet.
        throttle = 0x4 if static.index % 2 == 0 and power > 0.9 * limit else 0
        if static.index % 2 == 1 and (v["util_gpu"] or 0) < 25:
            throttle |= 0x1
        return GpuSample(
            ts=ts,
            uuid=static.uuid,
            util_gpu=v["util_gpu"],
            util_mem=self._value(static, "util_mem", ts),
            mem_used=int(v["mem_used"] or 0),
            mem_total=static.memory_total,
            power_w=power,
            power_limit_w=limit,
            # Energy counter: mean power × time since an arbitrary driver load, monotonic.
            energy_mj=int((ts - FROZEN_TS + 86_400) * limit * 0.6 * 1000),
            temperature_c=v["temperature_c"],
            sm_clock_mhz=int(self._value(static, "sm_clock_mhz", ts) or 0),
            mem_clock_mhz=static.max_mem_clock_mhz,
            throttle_reasons=throttle,
            fan_pct=self._value(static, "fan_pct", ts),
            pstate=2,
        )

    def _host(self, ts: float) -> HostSample:
        return HostSample(
            ts=ts,
            cpu_percent=round(20 + 50 * _wave(ts, 120.0, 0.4), 1),
            mem_used=int((18 + 10 * _wave(ts, 600.0, 0.1)) * GIB),
            mem_total=64 * GIB,
            load1=round(2 + 6 * _wave(ts, 120.0, 0.4), 2),
            load5=3.1,
            load15=2.7,
            swap_used=0,
            swap_total=8 * GIB,
            cpu_cores=[round(100 * _wave(ts, 97.0, 0.9 * i), 1) for i in range(CORES)],
        )

    def _top(self) -> HostTop:
        """Fixed processes of other users and of this one, with each CPU run's own process."""
        with self._lock:
            runs = [r for r in self._runs.values() if r.pid is not None and not r.placed]
        mine = [TopProcess(r.pid or 0, "me", 97.4, 3 * GIB, f"python -m {r.name}", r.id, True) for r in runs]
        return HostTop(sorted([*mine, *_OTHERS], key=lambda p: p.cpu_percent or -1.0, reverse=True))

    def _seed_processes(self) -> None:
        if not self._statics:
            return
        s0 = self._statics[0]
        self._processes = [
            ProcessInfo(
                4242, s0.uuid, 0, "me", 14 * GIB, "python -m gpuwarden.runners.train", "ra1b2c3d4e5", True
            ),
            ProcessInfo(5151, s0.uuid, 0, "me", 900 * 1024**2, "python notebook_kernel.py", None, True),
        ]
        if len(self._statics) > 1:
            s1 = self._statics[1]
            self._processes.append(
                ProcessInfo(6060, s1.uuid, 1, "alice", 3 * GIB, "ollama serve", None, False)
            )

    # -- runs --------------------------------------------------------------------------------

    def _seed_runs(self) -> None:
        t = FROZEN_TS
        runs = [
            _row("ra1b2c3d4e5", "llm-finetune", "train", "running", (0,), 2, 12_800, 50_000, 42.5, 1,
                 "attempt 2 after OOM: batch 8 → 4", t - 3600, t - 3500),
            _row("re5f6a7b8c9", "doc-parse", "infer", "queued", (), 0, None, 1200, None, 0,
                 "waiting for 15 GiB free on one GPU", t - 600),
            _row("rc9d0e1f2a3", "captcha-bf16", "train", "succeeded", (1,), 1, 40_000, 40_000, 210.0, 0,
                 "finished in 3h10m", t - 90_000, t - 89_000, t - 77_600),
            _row("r0a1b2c3d4e", "restore-unet", "train", "failed", (0,), 3, 3_000, 100_000, None, 2,
                 "OOM again at batch 1: the model does not fit", t - 7200, t - 7100, t - 5400),
            _row("r4e5f6a7b8c", "vlm-batch", "infer", "stopped", (1,), 1, 300, 1200, 0.4, 0,
                 "stopped by user", t - 20_000, t - 19_900, t - 19_000),
            _row("r7c8d9e0f1a", "my-script", "command", "stopped", (0,), 2, 96, 160, None, 1,
                 "stopped by user", t - 30_000, t - 29_900, t - 28_000),
        ]  # fmt: skip
        for r in runs:
            self._runs[r.id] = r
            self._details[r.id] = self._detail_for(r)
            self._logs[r.id] = self._log_for(r)
            if r.state == "succeeded":
                self._errs[r.id] = ["UserWarning: the fused AdamW is not available here; using foreach"]

    def _uuid(self, index: int) -> str:
        return self._statics[index % len(self._statics)].uuid

    def _detail_for(self, r: RunRow) -> RunDetailView:
        t0 = r.started_at or r.created_at
        attempts = self._attempts_for(r, t0)
        retunes = _retunes_for(r, t0)
        events = _events_for(r, attempts, retunes, t0)
        metrics = _metrics_for(r, t0)
        spec = _spec_for(r)
        capacity = None
        if r.placed and self._statics:
            capacity = min(self._statics[i % len(self._statics)].memory_total or 0 for i in r.placed)
        gpu_index = {s.uuid: s.index for s in self._statics}
        phases = {rt.attempt: "backward" for rt in retunes}
        report = None
        if r.state == "succeeded":
            report = {"steps": 600, "samples_seen": 40_000, "wall_s": 11_400.0, "samples_per_s": 210.0,
                      "mem_peak": 9 * GIB, "joules_per_sample": 0.52, "samples_per_kwh": 6_923_076.0}  # fmt: skip
        return RunDetailView(r, spec, attempts, retunes, events, metrics, capacity, gpu_index, phases, report)

    def _attempts_for(self, r: RunRow, t0: float) -> list[Attempt]:
        """Ten minutes an attempt; every one but the last ended out of memory."""
        attempts = []
        for n in range(1, r.attempt + 1):
            last = n == r.attempt
            ended = None if last and r.state == "running" else t0 + 600 * n
            classification = None if ended is None else ("oom" if not last else str(r.state))
            folder = f"/fake/runs/{r.id}/attempts/{n}"
            prepared = _prepared(n, folder) if r.kind == "command" else None
            attempts.append(
                Attempt(
                    run_id=r.id, attempt=n, state="running" if ended is None else "ended", pid=4242 + n,
                    create_time=t0, started_at=t0 + 600 * (n - 1) + 5, ended_at=ended,
                    exit_code=None if ended is None else (3 if classification == "oom" else 0), signal=None,
                    classification=classification,
                    reason="CUDA out of memory in backward" if classification == "oom" else None,
                    adopted=False, events_offset=0, events_skipped=0, stdout_path=f"{folder}/stdout.log",
                    stderr_path=f"{folder}/stderr.log", events_path=f"{folder}/events.jsonl",
                    gpus=[self._uuid(i) for i in r.placed], oom_kill_before=None, prepared=prepared,
                    peak_rss=(1288 << 20) if ended is not None and r.kind == "command" else None,
                )
            )  # fmt: skip
        return attempts

    @staticmethod
    def _log_for(r: RunRow) -> list[str]:
        if not r.attempt or r.state == "succeeded":
            return []  # the built-in runners print nothing: they report through events
        return [
            f"step {10 * k:>5}  loss {2.5 * math.exp(-k / 25) + 0.3:.4f}  {40 + k % 7}.0 samples/s"
            for k in range(80)
        ]

    def add_cpu_run(self, run_id: str, name: str, state: str, pid: int | None) -> RunRow:
        """A run on the host's CPU (`resources.gpus: 0`), as on a machine without a GPU."""
        row = _row(
            run_id, name, "train", state, (), 1, 64, 192, 1.5, 0, f"attempt 1: pid {pid}", self.clock()
        )
        row = row.model_copy(update={"gpus": 0, "pid": pid})
        with self._lock:
            self._runs[run_id] = row
            self._details[run_id] = RunDetailView(
                row, {"name": name, "train": {"batch_size": 16}}, [], [], [], []
            )
        return row

    # -- the protocol ------------------------------------------------------------------------

    def status(self) -> SourceStatus:
        return SourceStatus(
            "fake",
            "in-memory fake",
            host="gpu-box",
            sampling=self._sampling,
            version="0.1.0",
            controls=self._controls,
            storage_fault=self.fault,
        )

    def storage_fault(self) -> str | None:
        return self.fault

    def gpus(self) -> list[GpuStatic]:
        return list(self._statics)

    def snapshot(self) -> Snapshot:
        ts = self.clock()
        with self._lock:
            processes = list(self._processes)
        samples = [self._sample(s, ts) for s in self._statics]
        return Snapshot(ts, samples, self._host(ts), processes, self._top())

    def history(
        self, gpus: Sequence[str], metrics: Sequence[str], start: float, end: float, points: int
    ) -> HistorySeries:
        self.history_calls.append((tuple(gpus), tuple(metrics), start, end, points))
        by_uuid = {s.uuid: s for s in self._statics}
        step = (end - start) / max(points, 1)
        out: HistorySeries = {}
        for uuid in gpus:
            static = by_uuid.get(uuid)
            if static is None:
                continue
            out[uuid] = {
                m: [_bucket(partial(self._value, static, m), start + k * step, step) for k in range(points)]
                for m in metrics
            }
        return out

    def host_history(self, metrics: Sequence[str], start: float, end: float, points: int) -> HostSeries:
        self.host_history_calls.append((tuple(metrics), start, end, points))
        step = (end - start) / max(points, 1)
        # One host reading per instant serves every metric (a reading computes them all).
        readings: dict[float, HostSample] = {}

        def value(metric: str, ts: float) -> float | None:
            sample = readings.get(ts)
            if sample is None:
                sample = readings[ts] = self._host(ts)
            raw = getattr(sample, metric)
            return None if raw is None else float(raw)

        return {
            m: [_bucket(partial(value, m), start + k * step, step) for k in range(points)] for m in metrics
        }

    def runs(self) -> list[RunRow]:
        with self._lock:
            return list(self._runs.values())

    def doctor(self, run_id: str) -> list[DoctorFinding]:
        self.actions.append(("doctor", run_id))
        return [
            DoctorFinding(
                "warning",
                "GPU underused: power 52 % of the limit",
                "power_w=300, power_limit_w=575, power_pct=52.2",
                "larger micro-batch, mixed precision",
            ),
            DoctorFinding("info", "compile is off", "train.compile=False", "train.compile: True"),
        ]

    def run_detail(self, run_id: str) -> RunDetailView:
        with self._lock:
            if run_id not in self._details:
                raise UserError(f"no run matches '{run_id}' — see `gpuwarden ps`", code="not_found")
            detail = self._details[run_id]
            run = self._runs[run_id]
        if detail.run is not run:
            detail = dataclasses.replace(detail, run=run)
        return detail

    def logs(
        self,
        run_id: str,
        offset: int,
        stream: Literal["stdout", "stderr"] = "stdout",
        attempt: int | None = None,
    ) -> LogChunk:
        if offset < -MAX_LOG_BACK:  # as the daemon's API bounds it
            raise UserError(f"offset: at least {-MAX_LOG_BACK}", code="invalid_request")
        with self._lock:
            current = self._runs[run_id].attempt if run_id in self._runs else 0
            number = attempt or current
            lines = self._logs.get(run_id, []) if stream == "stdout" else self._errs.get(run_id, [])
            if number != current:  # an attempt that ended: what `earlier_logs` holds of it
                lines = self.earlier_logs.get((run_id, number, stream), [])
            data = "".join(line + "\n" for line in lines).encode()
        start = offset
        if offset < 0:
            start = max(0, len(data) + offset)
            # Start on a line boundary so the first line shown is whole.
            nl = data.find(b"\n", start - 1) if start else -1
            start = nl + 1 if start and nl >= 0 else start
        return LogChunk(
            data=data[start:].decode(), offset=start, next_offset=len(data), overflow=False, size=len(data),
            eof=number != current, attempt=number, stream=stream,
        )  # fmt: skip

    def frames(self, stop: threading.Event) -> Iterator[Frame]:
        next_tick = self.clock()
        while not stop.is_set():
            with self._lock:
                pending = list(self._pending)
                self._pending.clear()
            yield from pending
            if self.interval is None:
                stop.wait(0.05)
                continue
            stop.wait(max(0.0, min(self.interval, next_tick + self.interval - self.clock())))
            if stop.is_set():
                return
            next_tick = self.clock()
            self._grow_logs()
            yield SampleFrame(self.snapshot())

    def _grow_logs(self) -> None:
        with self._lock:
            for run in self._runs.values():
                if run.state == "running":
                    lines = self._logs.setdefault(run.id, [])
                    lines.append(f"step {10 * len(lines):>5}  loss 0.4100  41.0 samples/s")

    # -- controls ----------------------------------------------------------------------------

    def _require(self, run_id: str) -> RunRow:
        with self._lock:
            run = self._runs.get(run_id)
        if run is None:
            raise UserError(f"no run matches '{run_id}' — see `gpuwarden ps`", code="not_found")
        return run

    def _set_state(self, run: RunRow, state: str, message: str) -> None:
        changed = run.model_copy(update={"state": RunState(state), "message": message})
        with self._lock:
            self._runs[run.id] = changed
            self._event_id += 1
            text = f"{state}: {message}"
            event = TimelineEvent(self._event_id, run.id, run.attempt, self.clock(), "state", text, "daemon")
            self._pending.extend([RunFrame(changed), EventFrame(event)])

    def say(
        self,
        run_id: str,
        type_: str,
        text: str,
        *,
        phase: str | None = None,
        state: str | None = None,
        attempt: int | None = None,
    ) -> None:
        """An event of the run's current attempt (or `attempt`), as the daemon streams it
        (`state`: the run moves there first)."""
        run = self._require(run_id)
        if state is not None:
            run = run.model_copy(update={"state": RunState(state)})
        number = run.attempt if attempt is None else attempt
        with self._lock:
            self._event_id += 1
            event = TimelineEvent(self._event_id, run_id, number, self.clock(), type_, text, "daemon", phase)
            detail = self._details[run_id]
            self._runs[run_id] = run
            self._details[run_id] = dataclasses.replace(detail, run=run, events=[*detail.events, event])
            self._pending.extend([RunFrame(run), EventFrame(event)])

    def next_attempt(self, run_id: str) -> None:
        """The run's attempt ends (its output kept as an earlier attempt's) and the next starts."""
        with self._lock:
            run = self._runs[run_id]
            for stream, logs in (("stdout", self._logs), ("stderr", self._errs)):
                self.earlier_logs[(run_id, run.attempt, stream)] = logs.pop(run_id, [])
            run = run.model_copy(update={"attempt": run.attempt + 1})
            self._runs[run_id] = run
            self._pending.append(RunFrame(run))

    def stop_run(self, run_id: str) -> None:
        run = self._require(run_id)
        self.actions.append(("stop", run_id))
        if run.state not in ("running", "starting", "retuning", "queued"):
            raise UserError(f"run {run.name} is {run.state}: nothing to stop", code="conflict")
        self._set_state(run, "stopped", "stopped by user")

    def resume_run(self, run_id: str) -> None:
        run = self._require(run_id)
        self.actions.append(("resume", run_id))
        if run.state not in ("stopped", "failed", "interrupted"):
            raise UserError(
                f"run {run.name} is {run.state}: only stopped or failed runs resume", code="conflict"
            )
        self._set_state(run, "queued", "resumed by user")

    def submit(self, spec_path: str) -> str:
        self.actions.append(("submit", spec_path))
        if not spec_path.endswith((".yaml", ".yml")):
            raise UserError(f"{spec_path}: not a YAML run spec", code="invalid_config")
        run_id = f"r{len(self._runs) + 0xF000000000:010x}"
        name = spec_path.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        run = _row(run_id, name, "train", "queued", (), 0, None, None, None, 0, "submitted", self.clock())
        with self._lock:
            self._runs[run_id] = run
            self._details[run_id] = RunDetailView(run, {"name": name}, [], [], [], [], None)
            self._pending.append(RunFrame(run))
        return run_id

    def rerun(self, run_id: str, typed: dict[str, Any]) -> str:
        """A new queued run from the run's spec with `typed` changed, as the daemon's submit makes it."""
        old = self.run_detail(run_id)
        self.actions.append(("rerun", run_id, dict(typed)))
        if self.refuse_edits:
            raise UserError(self.refuse_edits, code="invalid_config")
        spec = rerun_spec(old.run.kind, old.spec, typed)
        new_id = f"r{len(self._runs) + 0xF000000000:010x}"
        run = _row(
            new_id,
            old.run.name,
            old.run.kind,
            "queued",
            (),
            0,
            None,
            None,
            None,
            0,
            "submitted",
            self.clock(),
        )
        with self._lock:
            self._runs[new_id] = run
            self._details[new_id] = RunDetailView(run, spec, [], [], [], [], None)
            self._pending.append(RunFrame(run))
        return new_id

    def restart_with(self, run_id: str, changes: dict[str, Any]) -> None:
        run = self._require(run_id)
        self.actions.append(("restart_with", run_id, dict(changes)))
        if self.refuse_edits:
            raise UserError(self.refuse_edits, code="invalid_config")
        self._set_state(run, "queued", "restarting with " + ", ".join(f"{k}={v}" for k, v in changes.items()))

    def tune(self, run_id: str) -> None:
        run = self._require(run_id)
        self.actions.append(("tune", run_id))
        self._set_state(run, run.state, "tune-up search queued")

    def kill_process(self, pid: int) -> None:
        self.actions.append(("kill", pid))
        with self._lock:
            proc = next((p for p in self._processes if p.pid == pid), None)
            if proc is None:
                raise UserError(f"no GPU process {pid}", code="not_found")
            if not proc.owned:
                raise UserError(
                    f"process {pid} belongs to {proc.user}: you can only stop your own", code="forbidden"
                )
            self._processes = [p for p in self._processes if p.pid != pid]

    def close(self) -> None:
        self.actions.append(("close",))


def _retunes_for(r: RunRow, t0: float) -> list[Retune]:
    """Each retune halves the micro-batch (doubling accumulation) after the attempt's OOM."""
    retunes = []
    batch = 8
    for n in range(1, r.retunes + 1):
        retunes.append(
            Retune(
                id=n,
                run_id=r.id,
                attempt=n,
                ts=t0 + 600 * n + 2,
                before={"train.batch_size": batch, "train.grad_accum": 32 // batch},
                after={"train.batch_size": batch // 2, "train.grad_accum": 64 // batch},
                verdict="gpu_capacity",
                evidence={
                    "message": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
                    "reason": "the card is full",
                    "fields": {"requested": 2 * GIB, "total": 24 * GIB, "free": GIB // 2},
                    "decision": {
                        "action": "reduce_micro_batch",
                        "changes": {
                            "batch_size": [batch, batch // 2],
                            "grad_accum_steps": [32 // batch, 64 // batch],
                        },
                    },
                },
                prediction={"batch": batch // 2 + 1, "capacity": 24 * GIB, "basis": "least-squares fit"},
                outcome="succeeded" if n < r.retunes or r.state == "running" else "oom again",
            )
        )
        batch //= 2
    return retunes


def _events_for(r: RunRow, attempts: list[Attempt], retunes: list[Retune], t0: float) -> list[TimelineEvent]:
    """A start per attempt and an OOM per retune, oldest first."""
    events = [
        TimelineEvent(i + 1, r.id, a.attempt, (a.started_at or t0), "started", f"attempt {a.attempt} on GPU "
                      + ",".join(map(str, r.placed)), "runner")
        for i, a in enumerate(attempts)
    ]  # fmt: skip
    events += [
        TimelineEvent(
            50 + i, r.id, rt.attempt, rt.ts, "oom", f"out of memory ({rt.verdict}): retuned", "daemon"
        )
        for i, rt in enumerate(retunes)
    ]
    events.sort(key=lambda e: e.ts)
    return events


def _metrics_for(r: RunRow, t0: float) -> list[RunMetric]:
    """Half an hour of progress, a falling loss; none before the first attempt."""
    metrics = [
        RunMetric(
            run_id=r.id,
            ts=t0 + 30 * k,
            attempt=min(r.attempt, 1 + k // 20) if r.attempt else 1,
            step=10 * k,
            loss=round(2.5 * math.exp(-k / 25) + 0.3 + 0.05 * math.sin(k), 4),
            samples_per_s=round(40 + 6 * math.sin(k / 3), 2),
            mem_peak=int((20 + 3 * _wave(k, 17, 0)) * GIB),
        )
        for k in range(60 if r.attempt else 0)
    ]
    return metrics


def _spec_for(r: RunRow) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": r.name, "kind": r.kind}
    if r.kind == "command":
        spec["knobs"] = {"batch_size": 8, "grad_accum_steps": 2}
    else:
        spec[r.kind] = {"batch_size": 4, "grad_accum_steps": 8, "precision": "bf16"}
    return spec


def _prepared(attempt: int, folder: str) -> AttemptRecord:
    """What a command run's attempt was handed: the first as written, the next retuned."""
    batch, accum = (16, 1) if attempt == 1 else (8, 2)
    diff = (
        ""
        if attempt == 1
        else "--- config.yaml\n+++ attempts/2/config.yaml\n@@ -2,2 +2,2 @@\n-  batch_size: 16  # per device\n"
        "+  batch_size: 8  # per device\n-  grad_accum: 1\n+  grad_accum: 2\n"
    )
    changes: dict[str, tuple[Any, Any]] = (
        {} if attempt == 1 else {"training.batch_size": (16, 8), "training.grad_accum": (1, 2)}
    )
    return AttemptRecord(
        prepared_at=FROZEN_TS,
        argv=["python", "train.py", "--config", f"{folder}/config.yaml"],
        cwd="/home/me/proj",
        knobs={"batch_size": batch, "grad_accum_steps": accum},
        env={},
        config=ConfigCopy(
            source="/home/me/proj/config.yaml", path=f"{folder}/config.yaml", changes=changes, diff=diff
        ),
        resume_from=None if attempt == 1 else "/home/me/proj/ckpt/checkpoint-3",
        resume_note=None if attempt == 1 else "attempt 2 resumes from checkpoint-3 (step 3)",
    )


def _row(
    run_id: str, name: str, kind: str, state: str, placed: tuple[int, ...], attempt: int,
    samples_seen: int | None, total: int | None, samples_per_s: float | None, retunes: int, message: str,
    created_at: float, started_at: float | None = None, ended_at: float | None = None,
) -> RunRow:  # fmt: skip
    """A run as the runs table shows it (each asks for as many GPUs as it is placed on)."""
    return RunRow.model_validate(
        {
            "id": run_id, "name": name, "kind": kind, "state": state, "attempt": attempt, "message": message,
            "created_at": created_at, "updated_at": ended_at or started_at or created_at,
            "started_at": started_at, "ended_at": ended_at, "gpus": max(1, len(placed)), "placed": placed,
            "pid": 4242 if state == "running" else None,
            "samples_seen": samples_seen, "total": total, "samples_per_s": samples_per_s, "retunes": retunes,
        }
    )  # fmt: skip


def _bucket(value: Callable[[float], float | None], start: float, step: float) -> Point:
    """A bucket's mean and max, as the store's rollups give them: point samples of a wide bucket
    would alias the minutes-long swings; a bucket of a few seconds is one reading anyway."""
    n = 1 if step <= 30 else 8
    values = [value(start + (j + 0.5) * step / n) for j in range(n)]
    present = [v for v in values if v is not None]
    if not present:
        return Point(start + step / 2, None)
    return Point(start + step / 2, sum(present) / len(present), max(present))
