"""The inference performance report (the per-run report of batched inference), and the GPU energy meter.

Per attempt: items processed and failed, wall time split into load and work, per-item time,
items/s and tokens/s, counts and mean times per batch size, peak memory, and energy where the
GPU's NVML energy counter is readable. It goes into the `finished` event and `RUN_DIR/report.json`.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwarden.runners.infer.outputs import write_file_atomic


@dataclass
class BatchSizeStats:
    """Batches run at one batch size (the last batch of a run is usually smaller)."""

    batches: int = 0
    items: int = 0
    seconds: float = 0.0
    tokens_out: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "items": self.items,
            "mean_batch_s": round(self.seconds / self.batches, 6) if self.batches else None,
            "mean_item_s": round(self.seconds / self.items, 6) if self.items else None,
            "tokens_out": self.tokens_out,
        }


@dataclass
class InferReport:
    """Accumulates one attempt's figures; `as_dict` is the report written at the end."""

    task: str
    attempt: int
    device: str
    dtype: str
    batch_size: int
    output: str
    items_total: int = 0
    items_done_before: int = 0
    items_processed: int = 0
    items_failed: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    work_seconds: float = 0.0
    load_seconds: float = 0.0
    peak_memory_bytes: int | None = None
    energy_j: float | None = None
    device_map: dict[str, int] | None = None  # module groups per placement, with device_map auto
    started_at: float = field(default_factory=time.monotonic)
    by_batch_size: dict[int, BatchSizeStats] = field(default_factory=dict)

    def record_batch(
        self, size: int, seconds: float, tokens_in: int, tokens_out: int, failed: int = 0
    ) -> None:
        """One batch of `size` items done in `seconds` (`failed` of them produced no output)."""
        stats = self.by_batch_size.setdefault(size, BatchSizeStats())
        stats.batches += 1
        stats.items += size
        stats.seconds += seconds
        stats.tokens_out += tokens_out
        self.items_processed += size - failed
        self.items_failed += failed
        self.tokens_in += tokens_in
        self.tokens_out += tokens_out
        self.work_seconds += seconds

    def record_failed(self, count: int = 1) -> None:
        """Items that failed before reaching a batch (e.g. unreadable images)."""
        self.items_failed += count

    @property
    def batches(self) -> int:
        return sum(s.batches for s in self.by_batch_size.values())

    def rates(self) -> tuple[float | None, float | None]:
        """(items/s, tokens/s) over the time spent in batches, None before the first batch."""
        if self.work_seconds <= 0:
            return None, None
        return self.items_processed / self.work_seconds, self.tokens_out / self.work_seconds

    def as_dict(self) -> dict[str, Any]:
        items_per_s, tokens_per_s = self.rates()
        total = time.monotonic() - self.started_at
        return {
            "task": self.task,
            "attempt": self.attempt,
            "device": self.device,
            "dtype": self.dtype,
            "batch_size": self.batch_size,
            "output": self.output,
            "items_total": self.items_total,
            "items_done_before": self.items_done_before,
            "items_processed": self.items_processed,
            "items_failed": self.items_failed,
            "items_remaining": max(
                0, self.items_total - self.items_done_before - self.items_processed - self.items_failed
            ),
            "total_time_s": round(total, 3),
            "load_time_s": round(self.load_seconds, 3),
            "work_time_s": round(self.work_seconds, 3),
            "per_item_s": round(self.work_seconds / self.items_processed, 6)
            if self.items_processed
            else None,
            "items_per_s": round(items_per_s, 4) if items_per_s is not None else None,
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "tokens_per_s": round(tokens_per_s, 2) if tokens_per_s is not None else None,
            "batches": self.batches,
            "per_batch_size": {str(k): v.as_dict() for k, v in sorted(self.by_batch_size.items())},
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory_kind": "cuda_allocated" if self.device.startswith("cuda") else "host_rss",
            "energy_j": round(self.energy_j, 3) if self.energy_j is not None else None,
            "device_map": self.device_map,
        }

    def write(self, run_dir: Path) -> dict[str, Any]:
        """Write `RUN_DIR/report.json` (atomically) and return the report."""
        report = self.as_dict()
        write_file_atomic(run_dir / "report.json", json.dumps(report, indent=2) + "\n")
        return report


class EnergyMeter:
    """Energy used by the run's GPU, from NVML's cumulative counter (Volta and newer).

    Optional by design: without NVML, without a GPU, or on a GPU that does not report energy,
    `joules()` is None and the report says so rather than guessing from power samples.
    """

    def __init__(self, device_type: str) -> None:
        self._nvml: Any = None
        self._handle: Any = None
        self._start_mj: int | None = None
        if device_type != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = self._find_handle(pynvml)
            self._start_mj = int(pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except Exception:  # NVML raises many error classes; energy is optional
            self._start_mj = None

    @staticmethod
    def _find_handle(pynvml: Any) -> Any:
        """The NVML handle of CUDA device 0 as this process sees it (CUDA_VISIBLE_DEVICES aware)."""
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        if visible.startswith(("GPU-", "MIG-")):
            return pynvml.nvmlDeviceGetHandleByUUID(visible)
        if visible.isdigit():
            return pynvml.nvmlDeviceGetHandleByIndex(int(visible))
        import torch

        uuid = str(torch.cuda.get_device_properties(0).uuid)
        return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")

    def joules(self) -> float | None:
        """Energy since the meter was created, in joules; None when not measurable."""
        if self._start_mj is None:
            return None
        try:
            now = int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except Exception:  # see __init__
            return None
        return (now - self._start_mj) / 1000.0
