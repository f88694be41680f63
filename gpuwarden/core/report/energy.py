"""Energy per sample of a run and of each attempt: joules over the attempts' windows over the
samples each attempt did. Each GPU's joules are its energy counter's difference between the
readings taken as the attempt started and ended, exact whatever the sampling interval; without
both readings, the sum of the sampled counter's deltas over the attempt's window.

Shared by `gpuwarden report` / `compare` (from a run's recorded data) and the run detail of the
API (from the daemon's store), so the figures agree wherever they are read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuwarden.core.store.runs import RunStore
from gpuwarden.core.store.telemetry import TelemetryStore
from gpuwarden.core.tune.objective import samples_per_kwh


@dataclass(frozen=True)
class AttemptEnergy:
    """One attempt: joules its GPUs used over its window (None without a counter), samples done."""

    attempt: int
    joules: float | None
    samples: int

    def to_dict(self) -> dict[str, Any]:
        per_sample = self.joules / self.samples if self.joules is not None and self.samples else None
        return {
            "attempt": self.attempt,
            "joules": self.joules,
            "samples": self.samples,
            "per_sample_j": per_sample,
            "samples_per_kwh": samples_per_kwh(per_sample),
        }


def energy_block(attempts: list[AttemptEnergy], tokens: int | None = None) -> dict[str, Any]:
    """The run's joules, J/sample and samples/kWh (over the attempts with a reading), J/token, and
    the same per attempt."""
    measured = [a for a in attempts if a.joules is not None]
    joules = sum(a.joules for a in measured if a.joules is not None) if measured else None
    samples = sum(a.samples for a in measured)
    per_sample = joules / samples if joules is not None and samples else None
    return {
        "joules": joules,
        "samples": samples if measured else None,
        "per_sample_j": per_sample,
        "samples_per_kwh": samples_per_kwh(per_sample),
        "per_token_j": joules / tokens if joules is not None and tokens else None,
        "per_attempt": [a.to_dict() for a in attempts],
    }


def stored_energy(runs: RunStore, telemetry: TelemetryStore, run_id: str, now: float) -> dict[str, Any]:
    """`energy_block` of a run straight from the daemon's store: cheap enough for every run
    detail (one energy sum per attempt and GPU, no series)."""
    known = {g["uuid"] for g in telemetry.gpus()}
    done = runs.samples_done(run_id)
    attempts = []
    for row in runs.attempts(run_id):
        start, end = row.get("started_at"), row.get("ended_at") or now
        counted: dict[str, float] = row.get("gpu_energy_j") or {}
        readings = [
            j
            for uuid in row.get("gpus") or []
            for j in [counted[uuid] if uuid in counted else _sampled(telemetry, known, uuid, start, end)]
            if j is not None
        ]
        number = int(row["attempt"])
        attempts.append(AttemptEnergy(number, sum(readings) if readings else None, done.get(number, 0)))
    return energy_block(attempts)


def _sampled(
    telemetry: TelemetryStore, known: set[str], uuid: str, start: float | None, end: float
) -> float | None:
    """A GPU's joules over an attempt's window from the samples: what an attempt without both
    counter readings (one still running, one a previous daemon left) has."""
    if uuid not in known or start is None or end <= start:
        return None
    return telemetry.energy_between(uuid, float(start), float(end))
