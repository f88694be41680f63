"""Suite-wide: tests marked `gpu` run only where an NVIDIA GPU answers NVML (and torch sees CUDA);
the heaviest test modules are collected first."""

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


# A `slow` test (a real training run, a Slurm job) takes about forty times a plain one's time.
SLOW_WEIGHT = 40


def _heaviest_modules_first(items: list[pytest.Item]) -> None:
    """Order the modules by their tests' expected time, heaviest first, each module's own tests
    in their order. The workers take modules in this order (`--dist loadfile`, with xdist's own
    reordering by test count turned off in the Makefile), so a module of four real training runs
    starts at the beginning rather than after hundreds of quick tests, when it would be the tail."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)

    def weight(tests: list[pytest.Item]) -> int:
        return sum(SLOW_WEIGHT if t.get_closest_marker("slow") else 1 for t in tests)

    items[:] = [t for tests in sorted(modules.values(), key=weight, reverse=True) for t in tests]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _heaviest_modules_first(items)
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    reason = _gpu_missing()
    if reason is None:
        return
    for item in gpu_items:
        item.add_marker(pytest.mark.skip(reason=reason))
