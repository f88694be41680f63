"""Suite-wide: tests marked `gpu` run only where an NVIDIA GPU answers NVML (and torch sees CUDA)."""

from __future__ import annotations

import pytest


def _gpu_missing() -> str | None:
    """Why GPU tests cannot run here, or None when they can."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except Exception as exc:  # any NVML failure means "no usable GPU" for this purpose
        return f"needs an NVIDIA GPU: NVML unavailable ({type(exc).__name__})"
    if count == 0:
        return "needs an NVIDIA GPU: NVML sees none"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    reason = _gpu_missing()
    if reason is None:
        return
    for item in gpu_items:
        item.add_marker(pytest.mark.skip(reason=reason))
