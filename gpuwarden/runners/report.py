"""The run report: what a finished (or stopped) training run did, for `report.json` and `finished`.

Counts are for the whole run (they travel in checkpoints from attempt to attempt); wall time and
throughput are for the attempt that wrote the report, since earlier attempts' timings are in the
daemon's records of those attempts. The inference runner builds its own report on top of
`build_report` by adding fields.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def build_report(
    *,
    task: str,
    steps: int,
    samples_seen: int,
    tokens_seen: int | None,
    attempt: int,
    attempt_steps: int,
    attempt_samples: int,
    attempt_tokens: int | None,
    wall_s: float,
    mem_peak: int | None,
    loss_first: float | None,
    loss_last: float | None,
    device: str,
    dtype: str,
    batch_size: int,
    grad_accum_steps: int,
    world_size: int = 1,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A JSON-ready report dict; throughput is per second of this attempt's training loop."""
    wall = max(wall_s, 1e-9)
    report: dict[str, Any] = {
        "task": task,
        "steps": steps,
        "samples_seen": samples_seen,
        "tokens_seen": tokens_seen,
        "attempt": attempt,
        "attempt_steps": attempt_steps,
        "attempt_samples": attempt_samples,
        "wall_s": round(wall_s, 3),
        "samples_per_s": round(attempt_samples / wall, 3) if attempt_steps else None,
        "tokens_per_s": round(attempt_tokens / wall, 3) if attempt_tokens and attempt_steps else None,
        "mem_peak": mem_peak,
        "loss_first": loss_first,
        "loss_last": loss_last,
        "device": device,
        "dtype": dtype,
        "batch_size": batch_size,
        "grad_accum_steps": grad_accum_steps,
        "world_size": world_size,
        "effective_batch": batch_size * grad_accum_steps * world_size,
    }
    if extra:
        report.update(extra)
    return report


def write_report(run_dir: Path, report: dict[str, Any]) -> Path:
    """Write `run_dir/report.json` atomically (temp file + rename)."""
    path = run_dir / "report.json"
    tmp = run_dir / f".report.json.{os.getpid()}"
    tmp.write_text(json.dumps(report, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)
    return path
