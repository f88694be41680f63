"""The fake pynvml itself: scenarios, real error types, deterministic series."""

from __future__ import annotations

import pynvml
import pytest

from gpuwarden.core.telemetry.fake_nvml import FAKE_EPOCH, SCENARIOS, FakeNvml


def test_raises_the_real_pynvml_error_types() -> None:
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        FakeNvml("none").nvmlInit()
    fake = FakeNvml("geforce-12gb")
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetHandleByIndex(0)
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetHandleByIndex(1)


@pytest.mark.parametrize(("scenario", "count"), [("h100", 1), ("h100x8", 8), ("a100-80gbx2", 2), ("lost", 2)])
def test_scenario_gpu_counts(scenario: str, count: int) -> None:
    fake = FakeNvml(scenario)
    fake.nvmlInit()
    assert fake.nvmlDeviceGetCount() == count
    assert len({fake.uuid(i) for i in range(count)}) == count


@pytest.mark.parametrize("bad", ["h200", "h100x0", "nonex2", "x2", ""])
def test_unknown_scenarios(bad: str) -> None:
    with pytest.raises(ValueError, match="unknown fake NVML scenario"):
        FakeNvml(bad)


def test_every_named_scenario_builds() -> None:
    for name in SCENARIOS:
        FakeNvml(name)


def test_energy_is_the_integral_of_power() -> None:
    fake = FakeNvml("h100x2")
    for index in range(2):
        total = sum(fake.power_mw(index, FAKE_EPOCH + s) for s in range(37))
        assert fake.energy_mj(index, FAKE_EPOCH + 37) - fake.energy_mj(index, FAKE_EPOCH) == total
        assert (
            fake.energy_mj(index, FAKE_EPOCH + 2.5)
            == 10**9 * (index + 1)
            + sum(fake.power_mw(index, FAKE_EPOCH + s) for s in range(2))
            + fake.power_mw(index, FAKE_EPOCH + 2) // 2
        )


def test_wall_clock_mode_follows_the_clock() -> None:
    now = [500.0]
    fake = FakeNvml("h100", clock=lambda: now[0])
    assert fake.second() == 0
    now[0] += 3.2
    assert fake.second() == 3
    assert fake.util_gpu(0) == 80


def test_lost_scenario_raises_gpu_is_lost_after_the_delay() -> None:
    fake = FakeNvml("lost", lost_after=2.0)
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(1)
    fake.nvmlDeviceGetPowerUsage(handle)
    fake.advance(2.0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetPowerUsage(handle)
    fake.nvmlDeviceGetPowerUsage(fake.nvmlDeviceGetHandleByIndex(0))


def test_a_set_load_draws_its_power_and_the_counter_integrates_it_exactly() -> None:
    fake = FakeNvml("h100")
    fake.advance(2.5)
    before = fake.energy_mj(0)
    fake.set_load(0, util=90, power_w=400)
    fake.advance(2.0)
    assert fake.power_mw(0) == 400_000 and fake.util_gpu(0) == 90
    assert fake.energy_mj(0) - before == 800_000  # 400 W for 2 s
    fake.set_load(0, util=30)  # the model's line from idle to the limit
    fake.advance(1.0)
    assert fake.power_mw(0) == 70_000 + (700_000 - 70_000) * 30 // 100
    assert fake.energy_mj(0) - before == 800_000 + 259_000
    fake.clear_load(0)
    middle = fake.energy_mj(0)
    fake.advance(10.0)  # one whole period of the pattern
    assert fake.energy_mj(0) - middle == fake._gpus[0].period_energy


def test_the_power_limit_caps_a_load_and_changes_only_with_permission() -> None:
    fake = FakeNvml("h100")
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NoPermission):
        fake.nvmlDeviceSetPowerManagementLimit(handle, 400_000)
    fake.allow_power_limit = True
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceSetPowerManagementLimit(handle, 100_000)  # under the card's minimum
    fake.set_load(0, util=100, power_w=650)
    fake.advance(1.0)
    start = fake.energy_mj(0)
    fake.nvmlDeviceSetPowerManagementLimit(handle, 400_000)
    assert fake.nvmlDeviceGetEnforcedPowerLimit(handle) == 400_000
    fake.advance(1.0)
    assert fake.power_mw(0) == 400_000
    assert fake.energy_mj(0) - start == 400_000
