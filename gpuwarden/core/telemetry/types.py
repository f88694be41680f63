"""Plain records that telemetry readers produce and the store, API and monitor consume.

Every field a GPU cannot report is None (stored as NULL), never a string such as "N/A".
Units are fixed here so nothing downstream guesses: bytes, watts, millijoules, °C, MHz, percent.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from gpuwarden.core.telemetry.topology import GpuTopology

# Per-tick numeric GPU metrics, in the order the store keeps them. History queries, rollups,
# the monitor summary and the API all use these names.
GPU_METRICS: tuple[str, ...] = (
    "util_gpu",  # % (nvmlDeviceGetUtilizationRates.gpu)
    "util_mem",  # % memory controller busy
    "util_gpu_fine",  # % mean of sub-second samples (nvmlDeviceGetSamples) over the tick
    "mem_used",  # bytes
    "mem_total",  # bytes
    "power_w",  # W
    "power_limit_w",  # W (enforced)
    "energy_mj",  # mJ counter since driver load (monotonic until reset)
    "temperature_c",  # °C
    "sm_clock_mhz",
    "mem_clock_mhz",
    "throttle_reasons",  # bitmask (nvmlDeviceGetCurrentClocksEventReasons); unknown bits kept
    "fan_pct",
    "pstate",  # 0..15
    "pcie_tx_bps",  # bytes/s, refreshed on process ticks
    "pcie_rx_bps",
)

HOST_METRICS: tuple[str, ...] = (
    "cpu_percent",
    "mem_used",
    "mem_total",
    "load1",
    "load5",
    "load15",
    "swap_used",
)

# Throttle (clock-event) reason bits, as NVML defines them.
THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}
# Reasons that mean "slower than it could be" (idle and app-clock settings are not throttling).
THROTTLE_ACTIVE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


def throttle_names(mask: int | None) -> list[str]:
    """Names of the bits set in `mask`; unknown bits appear as hex so nothing is hidden."""
    if not mask:
        return []
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    unknown = mask & ~sum(THROTTLE_REASONS)
    if unknown:
        names.append(f"0x{unknown:x}")
    return names


@dataclass(frozen=True)
class GpuStatic:
    """What does not change while the driver is loaded; read once per GPU UUID."""

    uuid: str
    index: int
    name: str
    pci_bus_id: str | None = None
    memory_total: int | None = None
    power_limit_default_w: float | None = None
    power_limit_min_w: float | None = None
    power_limit_max_w: float | None = None
    max_sm_clock_mhz: int | None = None
    max_mem_clock_mhz: int | None = None
    compute_capability: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    mig_mode: bool | None = None
    # Names of readings this GPU does not support (probed once), for the UI and for doctor.
    unsupported: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["unsupported"] = list(self.unsupported)
        return d


@dataclass
class GpuSample:
    """One tick of one GPU. `lost` marks a GPU that stopped answering (the others go on)."""

    ts: float
    uuid: str
    lost: bool = False
    util_gpu: float | None = None
    util_mem: float | None = None
    util_gpu_fine: float | None = None
    mem_used: int | None = None
    mem_total: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    energy_mj: int | None = None
    temperature_c: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    throttle_reasons: int | None = None
    fan_pct: float | None = None
    pstate: int | None = None
    pcie_tx_bps: float | None = None
    pcie_rx_bps: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GpuProcess:
    """A process holding memory on a GPU (host PID), with host-side CPU/RSS from psutil."""

    ts: float
    uuid: str
    pid: int
    used_memory: int | None = None
    kind: str = "compute"  # compute | graphics
    name: str | None = None
    cmdline: str | None = None
    user: str | None = None
    cpu_percent: float | None = None
    rss: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class HostSample:
    ts: float
    cpu_percent: float | None = None
    mem_used: int | None = None
    mem_total: int | None = None
    load1: float | None = None
    load5: float | None = None
    load15: float | None = None
    swap_used: int | None = None
    swap_total: int | None = None
    # Each logical CPU's share since the previous reading, in the kernel's order (not stored:
    # the dashboard draws it live).
    cpu_cores: list[float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class HostProcess:
    """A process on the host, as the list of the heaviest ones shows it. Fields another user's
    process does not let us read are None."""

    pid: int
    user: str | None = None
    # Share of one core since the previous read (above 100 on several cores); None on the
    # process's first read, where psutil has nothing to measure from.
    cpu_percent: float | None = None
    rss: int | None = None
    name: str | None = None
    cmdline: str | None = None


@dataclass
class Tick:
    """Everything read at one moment. `processes` is None on ticks that did not read processes."""

    ts: float
    gpus: list[GpuSample] = field(default_factory=list)
    host: HostSample | None = None
    processes: list[GpuProcess] | None = None


class GpuReader(Protocol):
    """The narrow interface the sampler needs from a GPU backend (real NVML or a fake)."""

    @property
    def status(self) -> str | None:
        """None when GPUs are being read, else one line saying why not."""
        ...

    def gpus(self) -> list[GpuStatic]: ...

    def sample(self, ts: float) -> list[GpuSample]: ...

    def processes(self, ts: float) -> list[GpuProcess]: ...

    def read_pcie(self, samples: list[GpuSample]) -> None:
        """Fill pcie_tx_bps / pcie_rx_bps on `samples` (slow; called on process ticks)."""
        ...

    def topology(self) -> GpuTopology:
        """NVLink and PCIe links between the GPUs (static; readable from any thread)."""
        ...

    def energy_mj(self, uuid: str) -> int | None:
        """One GPU's energy counter (mJ) read now, alone; None when unsupported or lost."""
        ...

    def close(self) -> None: ...
