"""The monitor's one-word verdict per GPU and the numbers it quotes, one case per verdict."""

from __future__ import annotations

from typing import Any

import pytest

from gpuwarden.core.monitor import SummaryAccumulator
from gpuwarden.core.telemetry.types import GpuSample, Tick

GIB = 1 << 30
SW_POWER_CAP, HW_SLOWDOWN, HW_THERMAL = 0x4, 0x8, 0x40


def verdict(**reading: Any) -> tuple[str, list[str]]:
    """Ten one-second ticks of one GPU reading the same each time."""
    acc = SummaryAccumulator()
    for t in range(10):
        acc.add(Tick(ts=float(t), gpus=[GpuSample(ts=float(t), uuid="GPU-0", **reading)]))
    (gpu,) = acc.summary()["gpus"]
    return gpu["verdict"], gpu["reasons"]


BUSY = {"util_gpu": 95.0, "power_w": 270.0, "power_limit_w": 300.0, "mem_total": 10 * GIB}


@pytest.mark.parametrize(
    ("reading", "expected"),
    [
        (
            {"util_gpu": 2.0, "power_w": 30.0, "power_limit_w": 300.0},
            ("idle", ["utilisation 2 %", "power 10 % of limit"]),
        ),
        (
            {**BUSY, "mem_used": 5 * GIB},
            ("good", ["utilisation 95 %", "power 90 % of limit"]),
        ),
        (
            {**BUSY, "mem_used": int(9.8 * GIB)},
            (
                "good",
                ["utilisation 95 %", "power 90 % of limit", "memory peaked at 98 % (close to out of memory)"],
            ),
        ),
        (
            {**BUSY, "util_gpu": 50.0, "power_w": 120.0, "mem_used": 2 * GIB},
            ("underused", ["power 40 % of limit", "utilisation 50 %", "memory 20 % used"]),
        ),
        (
            {**BUSY, "util_gpu": 50.0, "mem_used": int(9.8 * GIB)},
            (
                "underused",
                ["utilisation 50 %", "memory 98 % used", "memory peaked at 98 % (close to out of memory)"],
            ),
        ),
        (
            {**BUSY, "throttle_reasons": HW_THERMAL | HW_SLOWDOWN | SW_POWER_CAP},
            ("throttled", ["throttled 100 % of the time (sw_power_cap, hw_slowdown)"]),
        ),
        (
            {**BUSY, "power_w": 90.0, "throttle_reasons": SW_POWER_CAP},
            ("underused", ["power 30 % of limit", "throttled 100 % of the time (sw_power_cap)"]),
        ),
        (
            {"mem_used": GIB, "mem_total": 10 * GIB},
            ("unknown", ["this GPU reports neither utilisation nor power"]),
        ),
        ({"lost": True}, ("lost", ["the GPU stopped answering NVML for the whole window"])),
    ],
    ids=[
        "idle",
        "good",
        "good-memory-full",
        "underused",
        "underused-memory-full",
        "throttled",
        "underused-throttled",
        "unknown",
        "lost",
    ],
)
def test_each_verdict_quotes_its_numbers(reading: dict[str, Any], expected: tuple[str, list[str]]) -> None:
    assert verdict(**reading) == expected
