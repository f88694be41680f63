"""Per-tick readings batched into one nvmlDeviceGetFieldValues call, with per-field fallback."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace
from typing import Any

import pynvml
import pytest

from gpuwarden.core.telemetry.fake_nvml import FakeNvml
from gpuwarden.core.telemetry.nvml import NvmlReader
from gpuwarden.core.telemetry.types import GpuProcess

BATCHED_GETTERS = (
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
)


def no_enrich(rows: list[GpuProcess]) -> None:
    """Keep tests independent of what runs on the host."""


def calls_per_tick(fake: FakeNvml, reader: NvmlReader, gpu: int, ticks: int = 5) -> Counter[str]:
    """NVML calls on `gpu` per tick, by function, over `ticks` ticks."""
    before = Counter({fn: n for (fn, i), n in fake.calls.items() if i == gpu})
    for _ in range(ticks):
        fake.advance(1.0)
        reader.sample(fake.time)
    after = Counter({fn: n for (fn, i), n in fake.calls.items() if i == gpu})
    per_tick = after - before
    assert all(n % ticks == 0 for n in per_tick.values())
    return Counter({fn: n // ticks for fn, n in per_tick.items()})


def test_fake_answers_each_field_with_its_own_code_and_timestamp() -> None:
    fake = FakeNvml("geforce-12gb")
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    fake.advance(2.5)
    energy, power, unknown = fake.nvmlDeviceGetFieldValues(
        handle, [pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, pynvml.NVML_FI_DEV_POWER_AVERAGE, 9999]
    )
    assert energy.nvmlReturn == pynvml.NVML_SUCCESS
    assert energy.value.ullVal == fake.energy_mj(0)
    assert energy.timestamp == round(fake.time * 1e6)
    assert power.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert unknown.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_energy_power_and_limit_come_from_one_call_per_gpu_per_tick() -> None:
    fake = FakeNvml("h100x2")
    reader = NvmlReader(fake, enrich=no_enrich)
    per_tick = calls_per_tick(fake, reader, gpu=1)
    assert per_tick["nvmlDeviceGetFieldValues"] == 1
    assert all(per_tick[fn] == 0 for fn in BATCHED_GETTERS)
    assert sum(per_tick.values()) == 10  # 12 getters before, three of them now one batch
    (_, sample) = reader.sample(fake.time)
    assert sample.energy_mj == fake.energy_mj(1)
    assert sample.power_w == fake.power_mw(1) / 1000
    assert sample.power_limit_w == 700.0


def test_a_field_answering_not_supported_falls_back_to_its_getter_once() -> None:
    fake = FakeNvml("mixed")  # GPU 1 (GeForce) has the energy field, not the power ones
    reader = NvmlReader(fake, enrich=no_enrich)
    per_tick = calls_per_tick(fake, reader, gpu=1)
    assert per_tick["nvmlDeviceGetFieldValues"] == 1
    assert per_tick["nvmlDeviceGetTotalEnergyConsumption"] == 0
    assert per_tick["nvmlDeviceGetPowerUsage"] == 1
    assert per_tick["nvmlDeviceGetEnforcedPowerLimit"] == 1
    (_, geforce) = reader.sample(fake.time)
    assert geforce.energy_mj == fake.energy_mj(1)
    assert geforce.power_w == fake.power_mw(1) / 1000
    assert geforce.power_limit_w == 170.0
    assert "power_w" not in reader.gpus()[1].unsupported


def test_a_driver_without_field_values_reads_every_getter() -> None:
    fake = FakeNvml("old-driver")  # nvmlDeviceGetFieldValues: FunctionNotFound
    reader = NvmlReader(fake, enrich=no_enrich)
    per_tick = calls_per_tick(fake, reader, gpu=0)
    assert per_tick["nvmlDeviceGetFieldValues"] == 0
    assert fake.calls["nvmlDeviceGetFieldValues", 0] == 1  # probed once, at discovery
    assert all(per_tick[fn] == 1 for fn in BATCHED_GETTERS)
    (sample,) = reader.sample(fake.time)
    assert sample.energy_mj == fake.energy_mj(0)


def test_a_gpu_without_a_counter_marks_energy_unsupported_through_the_field_path() -> None:
    fake = FakeNvml("h100")
    gpu = fake._gpus[0]
    gpu.model = replace(gpu.model, not_supported=frozenset({"nvmlDeviceGetTotalEnergyConsumption"}))
    reader = NvmlReader(fake, enrich=no_enrich)
    per_tick = calls_per_tick(fake, reader, gpu=0)
    assert per_tick["nvmlDeviceGetFieldValues"] == 1
    assert per_tick["nvmlDeviceGetTotalEnergyConsumption"] == 0
    assert reader.sample(fake.time)[0].energy_mj is None
    assert "energy_mj" in reader.gpus()[0].unsupported


def test_a_gpu_lost_while_reading_fields_is_marked_lost() -> None:
    fake = FakeNvml("lost", lost_after=2.0)
    reader = NvmlReader(fake, enrich=no_enrich)
    fake.advance(3.0)
    samples = reader.sample(fake.time)
    assert [s.lost for s in samples] == [False, True]


@pytest.mark.parametrize("scenario", ["h100", "geforce-12gb", "old-driver"])
def test_energy_read_alone_matches_the_counter(scenario: str) -> None:
    fake = FakeNvml(scenario)
    reader = NvmlReader(fake, enrich=no_enrich)
    fake.advance(2.25)
    assert reader.energy_mj(fake.uuid(0)) == fake.energy_mj(0)


def test_utilisation_samples_are_asked_only_since_the_last_timestamp() -> None:
    fake = FakeNvml("h100x2")  # GPU 1 is busy from the start
    asked: list[tuple[int, list[int]]] = []  # GPU 1: (lastSeenTimeStamp passed, timestamps back)
    real = fake.nvmlDeviceGetSamples

    def spy(handle: Any, kind: int, last_ts: int) -> tuple[int, list[Any]]:
        value_type, samples = real(handle, kind, last_ts)
        if handle.index == 1:
            asked.append((last_ts, [s.timeStamp for s in samples]))
        return value_type, samples

    fake.nvmlDeviceGetSamples = spy  # type: ignore[method-assign, assignment]
    reader = NvmlReader(fake, enrich=no_enrich)
    for _ in range(3):
        fake.advance(1.0)
        reader.sample(fake.time)
    assert len(asked) == 4 and asked[0][0] == 0  # discovery asks for everything
    for (_, before), (last_ts, now) in itertools.pairwise(asked):
        assert last_ts == max(before)  # the newest timestamp seen so far is passed back
        assert now and min(now) > last_ts  # and only newer samples come back
