"""`RunData`: what doctor, report and compare read about a run, from wherever it is kept.

Two implementations: over a database opened read-only (`DbRunData`, `--db PATH`) and over the
daemon's API (`gpuwarden.client.run_data.ApiRunData`). Everything returned is plain data (dicts,
lists, tuples), so the analysis above it is pure functions that tests feed by hand.
"""

from __future__ import annotations

from typing import Any, Protocol

# (bucket start s, avg, min, max), as TelemetryStore.history returns them.
Point = tuple[float, float, float, float]
Series = dict[str, list[Point]]  # metric → points


class RunData(Protocol):
    """Read access to runs and their telemetry."""

    @property
    def source(self) -> str:
        """Where the data come from, for output ("database /path", "daemon")."""
        ...

    def resolve_run(self, ref: str) -> dict[str, Any]:
        """The run record (id, name, kind, state, spec, submitted_spec, run_dir, created_at,
        started_at, ended_at, …) for an id, name or unique prefix; UserError `not_found` else."""
        ...

    def attempts(self, run_id: str) -> list[dict[str, Any]]:
        """Attempts oldest first: attempt, state, pid, started_at, ended_at, classification,
        exit_code, gpus (UUIDs; [] on the CPU)."""
        ...

    def events(self, run_id: str) -> list[dict[str, Any]]:
        """Every run event oldest first (the stored event plus id, attempt, source)."""
        ...

    def retunes(self, run_id: str) -> list[dict[str, Any]]:
        """Retunes oldest first: attempt, ts, from, to, verdict, evidence, outcome."""
        ...

    def gpu_info(self) -> list[dict[str, Any]]:
        """Static facts of every GPU known (GpuStatic fields: uuid, index, name, memory_total,
        power_limit_default_w, compute_capability, …)."""
        ...

    def gpu_series(self, uuid: str, metrics: list[str], start: float, end: float, points: int) -> Series:
        """History of one GPU over [start, end) in at most `points` buckets."""
        ...

    def host_series(self, metrics: list[str], start: float, end: float, points: int) -> Series:
        """History of the host over [start, end)."""
        ...

    def energy(self, uuid: str, start: float, end: float) -> float | None:
        """Joules GPU `uuid` used in [start, end) by its NVML energy counter; None without data."""
        ...

    def processes(self, uuid: str, start: float, end: float) -> list[dict[str, Any]] | None:
        """Process rows (ts, pid, used_memory, name, cmdline, cpu_percent) seen on the GPU in the
        window; None when this source cannot tell."""
        ...

    def close(self) -> None: ...
