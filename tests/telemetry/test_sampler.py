"""Sampler cadence with an injected clock, status pass-through and GPU list refresh."""

from __future__ import annotations

from gpuwarden.core.telemetry.fake_nvml import FakeNvml
from gpuwarden.core.telemetry.nvml import NO_DRIVER_STATUS, NoGpuReader, NvmlReader
from gpuwarden.core.telemetry.sampler import Sampler
from gpuwarden.core.telemetry.types import GpuProcess, HostSample


class CountingHost:
    def __init__(self) -> None:
        self.calls: list[float] = []

    def sample(self, ts: float) -> HostSample:
        self.calls.append(ts)
        return HostSample(ts=ts, cpu_percent=1.0)


def no_enrich(rows: list[GpuProcess]) -> None:
    """Host facts are not the point here."""


def make(scenario: str, interval: float = 5.0) -> tuple[FakeNvml, Sampler, CountingHost]:
    fake = FakeNvml(scenario)
    host = CountingHost()
    sampler = Sampler(
        NvmlReader(fake, enrich=no_enrich), host, process_interval=interval, clock=lambda: fake.time
    )
    return fake, sampler, host


def test_processes_and_pcie_only_every_process_interval() -> None:
    fake, sampler, host = make("h100x2")
    fake.add_process(1, 4321, 1024)
    with_processes = []
    for second in range(12):
        tick = sampler.tick()
        assert tick.ts == fake.time and len(tick.gpus) == 2 and tick.host is not None
        if tick.processes is not None:
            with_processes.append(second)
            assert [p.pid for p in tick.processes] == [4321]
            assert all(g.pcie_tx_bps is not None for g in tick.gpus)
        else:
            assert all(g.pcie_tx_bps is None for g in tick.gpus)
        fake.advance(1.0)
    assert with_processes == [0, 5, 10]
    assert len(host.calls) == 12
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses", 1] == 3
    assert fake.calls["nvmlDeviceGetPcieThroughput", 0] == 6  # tx + rx, three times


def test_slightly_early_tick_still_reads_processes() -> None:
    fake, sampler, _ = make("h100")
    assert sampler.tick().processes is not None
    fake.advance(4.97)
    assert sampler.tick().processes is not None
    fake.advance(4.0)
    assert sampler.tick().processes is None


def test_clock_stepping_back_does_not_stall_process_reads() -> None:
    fake, sampler, _ = make("h100")
    sampler.tick()
    fake.advance(-3600.0)
    assert sampler.tick().processes is not None


def test_status_passes_through() -> None:
    assert Sampler(NoGpuReader(NO_DRIVER_STATUS), None, process_interval=5).status == NO_DRIVER_STATUS
    _, sampler, _ = make("h100")
    assert sampler.status is None


def test_no_gpu_reader_still_samples_the_host() -> None:
    host = CountingHost()
    sampler = Sampler(NoGpuReader(NO_DRIVER_STATUS), host, process_interval=5, clock=lambda: 42.0)
    tick = sampler.tick()
    assert tick.gpus == [] and tick.processes == [] and tick.host is not None and tick.host.ts == 42.0


def test_gpu_list_refreshes_when_support_or_the_gpu_set_changes() -> None:
    fake, sampler, _ = make("geforce-12gb")
    assert sampler.gpus()[0].unsupported == ("util_gpu_fine", "mig_mode")
    sampler.tick()  # first PCIe read finds it unsupported
    assert sampler.gpus_version == 1
    assert sampler.gpus()[0].unsupported == ("util_gpu_fine", "pcie_tx_bps", "pcie_rx_bps", "mig_mode")
    fake.advance(1.0)
    sampler.tick()
    assert sampler.gpus_version == 1

    fake2 = FakeNvml("h100x2")
    fake2.set_lost(1)
    reader = NvmlReader(fake2, enrich=no_enrich)
    sampler2 = Sampler(reader, None, process_interval=5, clock=lambda: fake2.time)
    assert len(sampler2.gpus()) == 1
    fake2.recover(1)
    fake2.advance(1.0)
    assert len(sampler2.tick().gpus) == 2
    assert [g.index for g in sampler2.gpus()] == [0, 1] and sampler2.gpus_version == 1
