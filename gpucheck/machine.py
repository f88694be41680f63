"""Is there a GPU to check, and what is this machine (for the report's header)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
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
    out.update(_torch_build())
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


def _torch_build() -> dict[str, Any]:
    """torch's version and the CUDA it was built for, read from its generated `torch/version.py`
    alone: importing torch costs seconds of CPU for two strings. `torch` is None when it is not
    installed (or its version module will not load)."""
    try:
        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.submodule_search_locations:
            return {"torch": None}
        path = Path(next(iter(spec.submodule_search_locations))) / "version.py"
        version = importlib.util.spec_from_file_location("_gpucheck_torch_version", path)
        if version is None or version.loader is None:
            return {"torch": None}
        module = importlib.util.module_from_spec(version)
        version.loader.exec_module(module)
        return {"torch": str(module.__version__), "cuda": module.cuda}
    except Exception:  # the header must not take the report down
        return {"torch": None}


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
