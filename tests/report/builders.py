"""Recorded runs for doctor/report/compare tests: a real database written through the stores.

Telemetry goes in through `TelemetryStore.write_tick` one second at a time, runs through
`RunStore`, with every timestamp chosen here so means, ratios and energies are exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwarden.core.store.db import open_db
from gpuwarden.core.store.runs import RunStore
from gpuwarden.core.store.telemetry import TelemetryStore
from gpuwarden.core.telemetry.types import GpuProcess, GpuSample, GpuStatic, HostSample, Tick

GIB = 1 << 30
T0 = 1_800_000_000.0  # a round start time, on a minute boundary

RTX5090 = GpuStatic(
    uuid="GPU-5090",
    index=0,
    name="NVIDIA GeForce RTX 5090",
    memory_total=32 * GIB,
    power_limit_default_w=575.0,
    compute_capability="12.0",
)
RTX3060 = GpuStatic(
    uuid="GPU-3060",
    index=1,
    name="NVIDIA GeForce RTX 3060",
    memory_total=12 * GIB,
    power_limit_default_w=170.0,
    compute_capability="8.6",
)


def captcha_spec(batch: int = 256) -> dict[str, Any]:
    """A CAPTCHA-training spec: fp32 where mixed precision was meant."""
    return {
        "version": 1,
        "name": "captcha",
        "kind": "train",
        "train": {"task": "image", "batch_size": batch, "amp": False, "image": {"mode": "keypoints"}},
    }


def restoration_spec() -> dict[str, Any]:
    """An image-restoration spec: data loading on the training process."""
    return {
        "version": 1,
        "name": "restore",
        "kind": "train",
        "train": {"task": "image", "batch_size": 16, "num_workers": 0},
    }


@dataclass
class Recorder:
    """One database with GPUs, telemetry and runs, written as a test describes them."""

    path: Path
    runs: RunStore = field(init=False)
    telemetry: TelemetryStore = field(init=False)

    def __post_init__(self) -> None:
        db = open_db(self.path)
        self.runs = RunStore(db)
        self.telemetry = TelemetryStore(db)
        self.telemetry.upsert_gpus([RTX5090, RTX3060], T0 - 3600)
        self._energy: dict[str, int] = {}

    def samples(
        self,
        gpu: GpuStatic,
        start: float,
        seconds: int,
        fields: Callable[[int], dict[str, Any]],
        host_cpu: Callable[[int], float] | None = None,
        processes: Callable[[int], list[GpuProcess]] | None = None,
    ) -> None:
        """One tick a second for `seconds`; `fields(i)` gives the GpuSample fields of tick i.
        `energy_w` in fields advances the energy counter by that many joules per second."""
        for i in range(seconds):
            ts = start + i
            values = dict(fields(i))
            watts = values.pop("energy_w", None)
            if watts is not None:
                counter = self._energy.get(gpu.uuid, 10**9) + round(watts * 1000)
                self._energy[gpu.uuid] = counter
                values["energy_mj"] = counter
            sample = GpuSample(ts=ts, uuid=gpu.uuid, mem_total=gpu.memory_total, **values)
            host = HostSample(ts=ts, cpu_percent=host_cpu(i)) if host_cpu else None
            procs = processes(i) if processes else None
            for p in procs or []:
                p.ts, p.uuid = ts, gpu.uuid
            self.telemetry.write_tick(Tick(ts=ts, gpus=[sample], host=host, processes=procs))

    def run(
        self,
        run_id: str,
        spec: dict[str, Any],
        attempts: list[tuple[float, float, list[str], int]],
        events: dict[int, list[dict[str, Any]]],
        kind: str = "train",
        state: str = "succeeded",
    ) -> None:
        """A finished run with (start, end, gpus, pid) attempts and their runner events."""
        self.runs.create_run(run_id, str(spec["name"]), kind, spec, f"/runs/{run_id}")
        for n, (start, end, gpus, pid) in enumerate(attempts, start=1):
            self.runs.add_attempt(run_id, n, stdout_path="o", stderr_path="e", events_path="ev", gpus=gpus)
            self.runs.update_attempt(
                run_id,
                n,
                started_at=start,
                ended_at=end,
                pid=pid,
                state="ended",
                classification="succeeded" if n == len(attempts) else "oom",
                exit_code=0 if n == len(attempts) else 3,
            )
            self.runs.add_events(run_id, n, events.get(n, []), new_offset=1)
        # The store checks every move, so walk the run through the states a daemon would.
        for step in ("starting", "running"):
            if state != "queued":
                self.runs.set_state(run_id, step)
        if state not in ("queued", "running"):
            self.runs.set_state(run_id, state)


def training_events(
    start: float, seconds: int, per_s: int, batch: int, every: int = 10, mem_peak: int = 5 * GIB
) -> list[dict[str, Any]]:
    """started at `start`, progress every `every` s (every step is 1 s: `per_s` = batch),
    finished at the end."""
    events: list[dict[str, Any]] = [
        {
            "type": "started",
            "ts": start,
            "task": "image",
            "config": {},
            "device": "cuda:0",
            "dtype": "fp32",
            "samples_seen": 0,
        }
    ]
    for k in range(1, seconds // every):
        events.append(
            {
                "type": "progress",
                "ts": start + k * every,
                "step": k * every,
                "samples_seen": k * every * per_s,
                "loss": 1.0 / k,
                "samples_per_s": float(per_s),
                "batch_size": batch,
                "mem_peak": mem_peak,
            }
        )
    events.append(
        {"type": "finished", "ts": start + seconds - 0.5, "report": {"loss_first": 1.0, "loss_last": 0.1}}
    )
    return events
