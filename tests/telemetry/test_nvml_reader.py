"""NvmlReader against the fake pynvml: unsupported fields, units, fallbacks, lost GPUs."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import pynvml
import pytest

from gpuwarden.core.telemetry.fake_nvml import FAKE_EPOCH, MIB, NOT_AVAILABLE, FakeNvml
from gpuwarden.core.telemetry.nvml import NvmlReader
from gpuwarden.core.telemetry.types import GpuProcess

PATTERN = (0, 0, 35, 80, 100, 100, 95, 60, 20, 0)


def no_enrich(rows: list[GpuProcess]) -> None:
    """Keep process tests independent of what runs on the host."""


def reader_for(scenario: str, lost_after: float = 5.0) -> tuple[FakeNvml, NvmlReader]:
    fake = FakeNvml(scenario, lost_after=lost_after)
    return fake, NvmlReader(fake, enrich=no_enrich)


def test_datacenter_card_reports_everything_in_our_units() -> None:
    fake, reader = reader_for("a100-80gb")
    fake.add_process(0, 4242, 2 * 1024**3)
    fake.advance(4.5)  # second 4 of the pattern: 100 % busy, half-way through the second

    (static,) = reader.gpus()
    assert static.name == "NVIDIA A100-SXM4-80GB"
    assert static.index == 0
    assert static.uuid.startswith("GPU-")
    assert static.pci_bus_id == "00000000:18:00.0"
    assert static.memory_total == 81920 * MIB
    assert (static.power_limit_default_w, static.power_limit_min_w, static.power_limit_max_w) == (
        400.0,
        100.0,
        400.0,
    )
    assert (static.max_sm_clock_mhz, static.max_mem_clock_mhz) == (1410, 1593)
    assert static.compute_capability == "8.0"
    assert static.driver_version == "550.54.15"
    assert static.cuda_driver_version == "12.4"
    assert static.mig_mode is False
    assert static.unsupported == ()

    (s,) = reader.sample(fake.time)
    assert not s.lost
    assert s.uuid == static.uuid
    assert (s.util_gpu, s.util_mem) == (100.0, 50.0)
    assert s.mem_used == 4 * MIB + 2 * 1024**3  # v2: used without the reserved part
    assert s.mem_total == 81920 * MIB
    assert s.power_w == 400.0  # 400000 mW
    assert s.power_limit_w == 400.0
    # 1e9 + 55000 + 55000 + 175750 + 331000 mJ for seconds 0-3, plus half a second at 400 W
    assert s.energy_mj == 1_000_000_000 + 616_750 + 200_000
    assert s.temperature_c == 80.0
    assert (s.sm_clock_mhz, s.mem_clock_mhz) == (1410, 1593)
    assert s.throttle_reasons == 0x4
    assert s.fan_pct == 55.0
    assert s.pstate == 0

    reader.read_pcie([s])
    assert s.pcie_tx_bps == 100_000 * 1024.0  # 100000 KB/s
    assert s.pcie_rx_bps == 200_000 * 1024.0


def test_geforce_unsupported_fields_are_none_and_probed_once() -> None:
    fake, reader = reader_for("geforce-12gb")
    samples = []
    for _ in range(20):
        fake.advance(1.0)
        samples = reader.sample(fake.time)
        reader.read_pcie(samples)

    (s,) = samples
    assert s.util_gpu_fine is None
    assert s.pcie_tx_bps is None and s.pcie_rx_bps is None
    # Supported on this board: energy (Volta+), enforced limit, fan, memory through v1.
    assert s.energy_mj is not None and s.power_limit_w == 170.0 and s.fan_pct is not None
    assert s.mem_used == 4 * MIB + 512 * MIB  # v1 counts the reserved memory as used
    assert fake.calls["nvmlDeviceGetSamples", 0] == 1
    assert fake.calls["nvmlDeviceGetMigMode", 0] == 1
    assert fake.calls["nvmlDeviceGetPcieThroughput", 0] == 1
    assert fake.calls["nvmlDeviceGetMemoryInfo_v2", 0] == 1
    assert fake.calls["nvmlDeviceGetMemoryInfo", 0] >= 20
    (static,) = reader.gpus()
    assert static.mig_mode is None
    assert static.unsupported == ("util_gpu_fine", "pcie_tx_bps", "pcie_rx_bps", "mig_mode")


def test_mixed_node_one_gpu_unsupported_other_reports() -> None:
    fake, reader = reader_for("mixed")
    fake.advance(3.5)
    h100, geforce = reader.sample(fake.time)
    assert h100.util_gpu_fine is not None and geforce.util_gpu_fine is None
    assert [g.unsupported for g in reader.gpus()] == [(), ("util_gpu_fine", "mig_mode")]


@pytest.mark.parametrize("count", [1, 8])
def test_one_and_eight_gpus(count: int) -> None:
    fake, reader = reader_for(f"h100x{count}" if count > 1 else "h100")
    fake.advance(7.0)
    samples = reader.sample(fake.time)
    assert len(samples) == count == len(reader.gpus())
    assert len({s.uuid for s in samples}) == count
    assert [s.uuid for s in samples] == [g.uuid for g in reader.gpus()]
    assert [g.index for g in reader.gpus()] == list(range(count))
    assert [s.util_gpu for s in samples] == [float(PATTERN[(7 + 3 * i) % 10]) for i in range(count)]


def test_fine_utilisation_passes_back_the_last_timestamp() -> None:
    fake, reader = reader_for("h100x2")  # GPU 1 runs 80 % in second 0, 100 % in seconds 1-2
    fake.advance(1.0)
    first = reader.sample(fake.time)[1].util_gpu_fine
    # Samples after the one seen at construction: five at 80 % (second 0), one at 100 % (second 1).
    assert first == pytest.approx((5 * 80 + 100) / 6)
    fake.advance(1.0)
    assert reader.sample(fake.time)[1].util_gpu_fine == 100.0
    # GPU 0 is idle for seconds 0-1: NVML answers NOT_FOUND, which is "no samples", not unsupported.
    assert reader.sample(fake.time)[0].util_gpu_fine is None
    fake.advance(0.5)  # second 2 at 35 %: four samples up to +0.5 s
    assert reader.sample(fake.time)[0].util_gpu_fine == 35.0
    assert "util_gpu_fine" not in reader.gpus()[0].unsupported


def test_lost_gpu_is_marked_and_the_other_keeps_being_sampled() -> None:
    fake, reader = reader_for("lost", lost_after=5.0)
    fake.advance(4.0)
    assert [s.lost for s in reader.sample(fake.time)] == [False, False]
    fake.advance(1.0)
    good, lost = reader.sample(fake.time)
    assert not good.lost and good.util_gpu == float(PATTERN[5])
    assert lost.lost and lost.uuid == fake.uuid(1)
    assert lost.util_gpu is None and lost.mem_used is None
    before = fake.calls.copy()
    for _ in range(29):  # within the retry interval nothing is asked of the lost GPU
        fake.advance(1.0)
        good, lost = reader.sample(fake.time)
        assert lost.lost and not good.lost and good.util_gpu is not None
    assert {k: n for k, n in fake.calls.items() if k[1] == 1} == {
        k: n for k, n in before.items() if k[1] == 1
    }
    assert reader.processes(fake.time) == []  # processes of the lost GPU skipped, no exception

    fake.advance(1.0)  # 30 s after the loss: one retry, still lost
    assert reader.sample(fake.time)[1].lost
    assert fake.calls["nvmlDeviceGetHandleByUUID", 1] == 1
    fake.recover(1)
    fake.advance(29.0)
    assert reader.sample(fake.time)[1].lost  # not retried before the interval
    fake.advance(1.0)
    back = reader.sample(fake.time)[1]
    assert not back.lost and back.util_gpu is not None


def test_unknown_error_marks_only_that_gpu_lost() -> None:
    fake, reader = reader_for("h100x2")
    fake.set_lost(0, pynvml.NVML_ERROR_UNKNOWN)
    first, second = reader.sample(fake.time)
    assert first.lost and not second.lost


def test_gpu_lost_at_discovery_joins_when_it_answers() -> None:
    fake = FakeNvml("h100x2")
    fake.set_lost(1)
    reader = NvmlReader(fake, enrich=no_enrich, retry_interval=30.0)
    assert [g.index for g in reader.gpus()] == [0]
    fake.recover(1)
    assert len(reader.sample(fake.time)) == 2  # the first sample() retries pending GPUs at once
    assert [g.index for g in reader.gpus()] == [0, 1]


@pytest.mark.parametrize("scenario", ["old-driver", "old-binding"])
def test_missing_versioned_functions_fall_back(scenario: str) -> None:
    fake, reader = reader_for(scenario)
    fake.add_process(0, 77, 3 * MIB)
    fake.advance(5.0)
    (s,) = reader.sample(fake.time)
    assert s.throttle_reasons == 0x4  # through nvmlDeviceGetCurrentClocksThrottleReasons
    assert s.mem_used == 4 * MIB + 3 * MIB + 512 * MIB  # through memory info v1
    assert reader.gpus()[0].unsupported == ()
    assert reader.gpus()[0].cuda_driver_version == "11.4"
    rows = reader.processes(fake.time)
    assert [(r.pid, r.used_memory, r.kind) for r in rows] == [(77, 3 * MIB, "compute")]
    for _ in range(5):
        fake.advance(1.0)
        reader.sample(fake.time)
        reader.processes(fake.time)
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons", 0] >= 6
    if scenario == "old-driver":
        assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons", 0] == 1
        assert fake.calls["nvmlDeviceGetMemoryInfo_v2", 0] == 1
        assert fake.calls["nvmlDeviceGetComputeRunningProcesses", 0] == 1
        assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v2", 0] == 6
    else:
        assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons", 0] == 0
        assert fake.calls["nvmlDeviceGetMemoryInfo_v2", 0] == 0


def test_processes_memory_sentinel_and_kinds() -> None:
    fake, reader = reader_for("h100x2")
    fake.add_process(0, 100, 5 * MIB)
    fake.add_process(1, 101, None)
    fake.add_process(1, 102, NOT_AVAILABLE)
    fake.add_process(1, 103, 1 * MIB, kind="graphics")
    rows = reader.processes(fake.time)
    assert [(r.uuid, r.pid, r.used_memory, r.kind, r.ts) for r in rows] == [
        (fake.uuid(0), 100, 5 * MIB, "compute", FAKE_EPOCH),
        (fake.uuid(1), 101, None, "compute", FAKE_EPOCH),
        (fake.uuid(1), 102, None, "compute", FAKE_EPOCH),
        (fake.uuid(1), 103, 1 * MIB, "graphics", FAKE_EPOCH),
    ]
    assert reader.sample(fake.time)[0].mem_used == 4 * MIB + 5 * MIB


def test_vanished_pid_keeps_its_row_with_empty_host_fields() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    fake = FakeNvml("h100")
    fake.add_process(0, gone.pid, 8 * MIB)
    fake.add_process(0, os.getpid(), 16 * MIB)
    reader = NvmlReader(fake)  # the real psutil enricher
    vanished, alive = reader.processes(fake.time)
    assert vanished.pid == gone.pid and vanished.used_memory == 8 * MIB
    assert (vanished.name, vanished.cmdline, vanished.user, vanished.rss) == (None, None, None, None)
    assert alive.name and alive.rss and alive.rss > 0 and alive.user
    assert alive.cmdline and "python" in alive.cmdline.lower()
    assert alive.cpu_percent is None  # first sight: psutil has no interval yet
    _, alive = reader.processes(fake.time)
    assert alive.cpu_percent is not None and alive.cpu_percent >= 0.0


def test_close_shuts_nvml_down_once() -> None:
    fake, reader = reader_for("h100")
    reader.close()
    reader.close()
    assert fake.calls["nvmlShutdown", -1] == 1


def test_one_gpus_energy_counter_and_power_limit_read_alone() -> None:
    fake, reader = reader_for("h100x2")
    uuid = fake.uuid(1)
    fake.advance(3.0)
    assert reader.energy_mj(uuid) == fake.energy_mj(1)
    assert reader.power_limit_w(uuid) == 700.0
    assert reader.energy_mj("GPU-unknown") is None
    assert reader.set_power_limit_w(uuid, 500) == (
        "NVML refuses to change the power limit without root (NoPermission)"
    )
    fake.allow_power_limit = True
    assert reader.set_power_limit_w(uuid, 500) is None
    assert reader.power_limit_w(uuid) == 500.0
    assert reader.set_power_limit_w(uuid, 50) is not None  # under the card's minimum: refused
    reader.close()
    assert reader.energy_mj(uuid) is None


def test_a_gpu_without_an_energy_counter_reads_none() -> None:
    fake = FakeNvml("h100")
    gpu = fake._gpus[0]
    gpu.model = replace(gpu.model, not_supported=frozenset({"nvmlDeviceGetTotalEnergyConsumption"}))
    reader = NvmlReader(fake, enrich=no_enrich)
    assert reader.energy_mj(fake.uuid(0)) is None
    assert "energy_mj" in reader.gpus()[0].unsupported
