"""Is there a GPU to check, and what is this machine (for the report's header)."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import subprocess
import sys
from typing import Any


def nvml_missing() -> str | None:
    """Why NVML cannot read a GPU here, or None when it can."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # every NVML failure means the same here: no GPU to check
        return f"no NVIDIA GPU: NVML unavailable ({type(exc).__name__})"
    return None if count else "no NVIDIA GPU: NVML sees none"


def cuda_missing() -> str | None:
    """Why this Python's torch cannot use a GPU here, or None when it can."""
    missing = nvml_missing()
    if missing is not None:
        return missing
    try:
        import torch
    except ImportError:
        return "torch is not installed for this Python"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} here has no CUDA (a CPU build, or no usable driver)"
    return None


def describe() -> dict[str, Any]:
    """Machine, Python, torch and driver facts, and one entry per GPU; never raises."""
    out: dict[str, Any] = {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "load": _load(),
        "nvidia_smi": shutil.which("nvidia-smi"),
    }
    try:
        import torch

        out["torch"] = torch.__version__
        out["cuda"] = torch.version.cuda
    except ImportError:
        out["torch"] = None
    try:
        from gpuwarden.core.telemetry.nvml import open_gpu_reader

        reader = open_gpu_reader()
        try:
            out["gpu_status"] = reader.status
            out["gpus"] = [g.to_dict() for g in reader.gpus()]
        finally:
            reader.close()
    except Exception as exc:  # the header must not take the report down
        out["gpu_status"] = f"cannot read GPUs: {type(exc).__name__}: {exc}"
    if out["nvidia_smi"]:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out["nvidia_smi_version"] = (
                subprocess.run(["nvidia-smi", "--version"], capture_output=True, text=True, timeout=30)
                .stdout.strip()
                .splitlines()[:3]
            )
    return out


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
