"""Helpers of the GPU tests: the card's size, and a run environment that caps its CUDA memory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

# The daemon fixtures live beside the daemon's tests; the GPU tests start real daemons too.
from tests.daemon.conftest import daemon_factory, short_tmp  # noqa: F401

GIB = 1 << 30
REPO = Path(__file__).resolve().parents[2]
MEMCAP = Path(__file__).resolve().parent / "memcap"


def card_total() -> int:
    """Memory of GPU 0 as NVML reports it."""
    from gpuwarden.core.telemetry.nvml import open_gpu_reader

    reader = open_gpu_reader()
    try:
        total = reader.gpus()[0].memory_total
        assert total is not None
        return total
    finally:
        reader.close()


def capped_env(gib: float) -> dict[str, str]:
    """Spec `env:` that caps every process of the run at `gib` GiB of the card (memcap/)."""
    path = [str(MEMCAP), str(REPO), os.environ.get("PYTHONPATH", "")]
    return {
        "GPUCHECK_MEMORY_FRACTION": f"{min(0.99, gib * GIB / card_total()):.4f}",
        "PYTHONPATH": os.pathsep.join(p for p in path if p),
    }


def require_cuda() -> Any:
    """torch, or the test is skipped (with the reason) where it has no CUDA."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip(f"torch {torch.__version__} here has no CUDA")
    return torch
