"""A fake of NVIDIA's `pynvml` module, for tests, benchmarks and demos without a GPU.

`FakeNvml` exposes the pynvml functions and constants that `NvmlReader` uses, and raises the
*real* pynvml error types (`pynvml.NVMLError(code)` returns the matching subclass), so the reader
takes exactly the code paths it takes on hardware. Pass an instance where pynvml would go:
`NvmlReader(nvml=FakeNvml("h100x2"))`, or set `GPUWARDEN_FAKE_NVML=h100x2` for a whole daemon.

Scenarios (a name, optionally with a GPU count suffix `xN`, e.g. `h100x8`, `geforce-12gbx2`):

- `h100`, `a100-80gb`: datacenter cards; every reading supported (fan speed too, so that every
  path of the reader is exercised). `h100x8` is an 8-GPU node.
- `geforce-12gb`: RTX 3060 12 GB. NotSupported: `nvmlDeviceGetSamples`, memory info v2, PCIe
  throughput, MIG mode. Energy, enforced power limit and fan are supported; as field values
  (`nvmlDeviceGetFieldValues`) only the energy counter, the power fields answer NotSupported.
- Field values: every other model answers energy, power average/instant and the power limit as
  fields, each with its own return code and a timestamp (µs); unknown ids answer NotSupported.
- `mixed`: GPU 0 an H100, GPU 1 a GeForce 12 GB (one answers what the other cannot).
- `lost`: two H100s; GPU 1 raises `NVMLError_GpuIsLost` from `lost_after` seconds (default 5)
  after the fake starts, until `recover(1)`.
- `old-driver`: an A100 under driver 470: `nvmlDeviceGetMemoryInfo_v2`,
  `nvmlDeviceGetCurrentClocksEventReasons` and `nvmlDeviceGetFieldValues` raise
  `FunctionNotFound`, and the v3 process query raises `NVMLLibraryMismatchError` (the `_v2`
  one works), as the real binding does.
- `old-binding`: an A100 driven by an old nvidia-ml-py: `nvmlDeviceGetCurrentClocksEventReasons`
  and `nvmlMemory_v2` do not exist (AttributeError) and `nvmlDeviceGetMemoryInfo` takes no
  `version`.
- `none` (no library: `NVMLError_LibraryNotFound` from `nvmlInit`), `driver-not-loaded`,
  `mismatch` (`LibRmVersionMismatch`; set `init_error = None` to let a retry succeed),
  `no-gpus` (initialises, zero devices).

Time: without a `clock`, the fake runs on virtual time starting at `FAKE_EPOCH` that moves only
with `advance(seconds)`; with `clock=time.time` (what `GPUWARDEN_FAKE_NVML` uses) it follows the
wall clock. Every series is a function of whole seconds since the fake started, `s`:

- `util_gpu = UTIL_PATTERN[(s + 3 * index) % 10]`, `util_mem = util_gpu // 2`
- power (mW) = idle + (default limit - idle) * util_gpu // 100; energy (mJ) is its exact integral
  (power held constant over each second) plus `10**9 * (index + 1)`
- temperature = 30 + util_gpu // 2; fan = 30 + util_gpu // 4; clocks at max when busy, idle
  clocks when util is 0; pstate 0 when busy else 8; throttle 0x1 (idle) at 0 %, 0x4 (power
  cap) at 100 %, else 0 (`set_throttle(gpu_index, reasons)` sets them until set to None)
- memory used (v2) = 4 MiB + the processes' memory, reserved 512 MiB; v1 used adds reserved
- GetSamples: `SAMPLES_PER_SECOND` samples a second at `start_us + s * 10**6 + k * 166_666` µs,
  value util_gpu of that second, none while idle (NVML records nothing then)
- PCIe (KB/s): tx = 1000 * util_gpu + index, rx = 2 * tx

Topology (pairs of GPUs): the PCIe common ancestor is one switch for GPUs 2k and 2k+1, the NUMA
node within a group of four, and the system (across sockets) beyond; `set_pcie_level(a, b,
level)` changes a pair. H100s hang off NVSwitches (18 links each, so every pair is linked); other
models have no NVLink until `set_nvlink(a, b, links)` bridges a pair. The GeForce answers
NotSupported to NVLink queries.

`add_process(gpu_index, pid, used_bytes)` puts a process on a GPU (its memory counts in
mem_used); `calls[(function_name, gpu_index)]` counts every device call (index -1 for system
calls), so tests can assert that an unsupported getter was probed only once.

A synthetic power curve: `set_load(gpu_index, util, power_w=None)` replaces the pattern from
now on with a steady load — utilisation `util` and `power_w` watts (default: the model's line
from idle to the limit at that utilisation), capped at the GPU's power limit; the energy counter
stays the exact integral across the change. `clear_load` returns to the pattern. The power limit
reads back from `nvmlDeviceGetEnforcedPowerLimit`; `nvmlDeviceSetPowerManagementLimit` changes
it only when `allow_power_limit` is true (NoPermission otherwise, as for a user who is not root).
"""

from __future__ import annotations

import math
import re
import uuid as uuidlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

FAKE_EPOCH = 1_700_000_000.0
UTIL_PATTERN: tuple[int, ...] = (0, 0, 35, 80, 100, 100, 95, 60, 20, 0)
SAMPLES_PER_SECOND = 6
SAMPLE_STEP_US = 166_666
SAMPLE_BUFFER = 120  # NVML keeps a bounded ring of samples; older ones are gone
MIB = 1024**2
BASE_USED = 4 * MIB
RESERVED = 512 * MIB
# What NVML puts in usedGpuMemory when it cannot tell (the binding may or may not map it to None).
NOT_AVAILABLE = 2**64 - 1

NVSWITCH_BUS_ID = "00000000:C1:00.0"
_NVLINK_CALLS = frozenset(
    {"nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkRemotePciInfo", "nvmlDeviceGetNvLinkRemoteDeviceType"}
)
_OLD_DRIVER_MISSING = frozenset(
    {"nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetFieldValues"}
)
_OLD_BINDING_MISSING = frozenset({"nvmlDeviceGetCurrentClocksEventReasons", "nvmlMemory_v2"})


@dataclass(frozen=True)
class GpuModel:
    """Static facts of one fake GPU model and the getters it answers NotSupported to."""

    name: str
    memory_total: int
    power_default_mw: int
    power_min_mw: int
    power_max_mw: int
    power_idle_mw: int
    max_sm_clock: int
    max_mem_clock: int
    idle_sm_clock: int
    idle_mem_clock: int
    compute_capability: tuple[int, int]
    not_supported: frozenset[str] = frozenset()
    nvswitch_links: int = 0
    # Field ids nvmlDeviceGetFieldValues answers; any other id answers NotSupported in its slot.
    fields: frozenset[int] = frozenset(
        {
            pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
            pynvml.NVML_FI_DEV_POWER_AVERAGE,
            pynvml.NVML_FI_DEV_POWER_INSTANT,
            pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT,
        }
    )  # NVLink links from each GPU to the machine's NVSwitches


MODELS: dict[str, GpuModel] = {
    "h100": GpuModel(
        "NVIDIA H100 80GB HBM3",
        81559 * MIB,
        700_000,
        200_000,
        700_000,
        70_000,
        1980,
        2619,
        345,
        1593,
        (9, 0),
        nvswitch_links=18,
    ),
    "a100-80gb": GpuModel(
        "NVIDIA A100-SXM4-80GB", 81920 * MIB, 400_000, 100_000, 400_000, 55_000, 1410, 1593, 210, 1593, (8, 0)
    ),
    "geforce-12gb": GpuModel(
        "NVIDIA GeForce RTX 3060",
        12288 * MIB,
        170_000,
        100_000,
        170_000,
        15_000,
        2100,
        7501,
        210,
        405,
        (8, 6),
        frozenset(
            {
                "nvmlDeviceGetSamples",
                "nvmlDeviceGetMemoryInfo_v2",
                "nvmlDeviceGetPcieThroughput",
                "nvmlDeviceGetMigMode",
                *_NVLINK_CALLS,
            }
        ),
        fields=frozenset({pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION}),
    ),
}

_SPECIAL = ("none", "driver-not-loaded", "mismatch", "no-gpus", "lost", "mixed", "old-driver", "old-binding")
SCENARIOS: tuple[str, ...] = (*MODELS, *_SPECIAL)


class _Handle:
    """An opaque device handle, like pynvml's c_nvmlDevice_t pointer."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


@dataclass
class _FakeGpu:
    index: int
    model: GpuModel
    uuid: str
    pci_bus_id: str
    handle: _Handle
    period_energy: int
    prefix_energy: tuple[int, ...]
    lost_at: float | None = None
    lost_code: int = pynvml.NVML_ERROR_GPU_IS_LOST
    processes: dict[tuple[int, str], int | None] = field(default_factory=dict)
    power_limit_mw: int = 0
    # A steady load set by `set_load`: (since, util %, requested power mW), and the energy (mJ)
    # loads added beyond the pattern's integral before `since`.
    load: tuple[float, int, int] | None = None
    extra_energy_mj: float = 0.0
    throttle: int | None = None  # clock-event reasons set by `set_throttle`


def _nvml_error(code: int) -> Exception:
    err: Exception = pynvml.NVMLError(code)
    return err


class FakeNvml:
    """A stand-in for the `pynvml` module, selected by a scenario string (see module docstring)."""

    # The real module's error classes; every other NVML_* / NVMLError_* name is copied below.
    NVMLError = pynvml.NVMLError
    NVMLLibraryMismatchError = pynvml.NVMLLibraryMismatchError
    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def __new__(cls, scenario: str = "h100", *args: Any, **kwargs: Any) -> FakeNvml:
        # An old binding lacks module attributes, which only a different class can express.
        if cls is FakeNvml and _parse(scenario)[0] == "old-binding":
            cls = _OldBindingFakeNvml
        return super().__new__(cls)

    def __init__(
        self, scenario: str = "h100", *, clock: Callable[[], float] | None = None, lost_after: float = 5.0
    ) -> None:
        self.scenario = scenario
        self._clock = clock
        self._now = FAKE_EPOCH
        self.start = clock() if clock is not None else FAKE_EPOCH
        self._start_us = round(self.start * 1e6)
        self.calls: Counter[tuple[str, int]] = Counter()
        self.init_error: int | None = None
        self.initialised = False
        self.driver_version = "550.54.15"
        self.cuda_driver_version = 12040
        self._missing: frozenset[str] = frozenset()
        self.process_v3_missing = False
        self.memory_takes_version = True
        self.allow_power_limit = False
        self._gpus: list[_FakeGpu] = []
        self._pcie_levels: dict[frozenset[int], int] = {}
        self._nvlinks: dict[frozenset[int], int] = {}

        base, count = _parse(scenario)
        models: list[GpuModel] = []
        if base in MODELS:
            models = [MODELS[base]] * count
        elif base == "none":
            self.init_error = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
        elif base == "driver-not-loaded":
            self.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
        elif base == "mismatch":
            self.init_error = pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
            models = [MODELS["h100"]] * count
        elif base == "lost":
            models = [MODELS["h100"]] * max(count, 2)
        elif base == "mixed":
            models = [MODELS["h100"], MODELS["geforce-12gb"]]
        elif base in ("old-driver", "old-binding"):
            models = [MODELS["a100-80gb"]] * count
            self.driver_version = "470.182.03"
            self.cuda_driver_version = 11040
            self._missing = _OLD_DRIVER_MISSING if base == "old-driver" else frozenset()
            self.process_v3_missing = base == "old-driver"
            self.memory_takes_version = base == "old-driver"
        for i, model in enumerate(models):
            self._gpus.append(self._make_gpu(i, model))
        if base == "lost":
            self._gpus[1].lost_at = self.start + lost_after

    def _make_gpu(self, index: int, model: GpuModel) -> _FakeGpu:
        powers = [self._power_for(model, UTIL_PATTERN[(k + 3 * index) % 10]) for k in range(10)]
        prefix = [0]
        for p in powers:
            prefix.append(prefix[-1] + p)
        return _FakeGpu(
            index=index,
            model=model,
            uuid="GPU-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"gpuwarden-fake/{model.name}/{index}")),
            pci_bus_id=f"00000000:{0x18 + 0x10 * index:02X}:00.0",
            handle=_Handle(index),
            period_energy=prefix[-1],
            prefix_energy=tuple(prefix),
            power_limit_mw=model.power_default_mw,
        )

    @staticmethod
    def _power_for(model: GpuModel, util: int) -> int:
        return model.power_idle_mw + (model.power_default_mw - model.power_idle_mw) * util // 100

    # ---- driving the fake -------------------------------------------------------------------

    @property
    def time(self) -> float:
        """The fake's current time (virtual unless a clock was given)."""
        return self._clock() if self._clock is not None else self._now

    def advance(self, seconds: float) -> None:
        """Move virtual time forward (only without an injected clock)."""
        self._now += seconds

    @property
    def gpu_count(self) -> int:
        """Number of devices the fake reports."""
        return len(self._gpus)

    def uuid(self, index: int) -> str:
        """UUID of the fake GPU at `index`."""
        return self._gpus[index].uuid

    def add_process(self, gpu_index: int, pid: int, used_bytes: int | None, kind: str = "compute") -> None:
        """Put a process holding `used_bytes` on a GPU; None (or NOT_AVAILABLE) means unknown."""
        self._gpus[gpu_index].processes[(pid, kind)] = used_bytes

    def remove_process(self, gpu_index: int, pid: int, kind: str = "compute") -> None:
        """Take a process off a GPU."""
        self._gpus[gpu_index].processes.pop((pid, kind), None)

    def set_lost(self, gpu_index: int, code: int = pynvml.NVML_ERROR_GPU_IS_LOST) -> None:
        """Make every call on this GPU raise `code` from now on (GpuIsLost, Unknown, ...)."""
        gpu = self._gpus[gpu_index]
        gpu.lost_at = self.time
        gpu.lost_code = code

    def recover(self, gpu_index: int) -> None:
        """Bring a lost GPU back."""
        self._gpus[gpu_index].lost_at = None

    def set_pcie_level(self, a: int, b: int, level: int) -> None:
        """The closest PCIe ancestor GPUs `a` and `b` share (an NVML_TOPOLOGY_* value)."""
        self._pcie_levels[frozenset((a, b))] = level

    def set_nvlink(self, a: int, b: int, links: int) -> None:
        """Bridge GPUs `a` and `b` with `links` NVLink links (0 removes the bridge)."""
        self._nvlinks[frozenset((a, b))] = links

    def pcie_level(self, a: int, b: int) -> int:
        """The pair's PCIe level: as set, else switch pairs, NUMA quads, then the system."""
        if a == b:
            return int(pynvml.NVML_TOPOLOGY_INTERNAL)
        if (level := self._pcie_levels.get(frozenset((a, b)))) is not None:
            return level
        if a // 2 == b // 2:
            return int(pynvml.NVML_TOPOLOGY_SINGLE)
        return int(pynvml.NVML_TOPOLOGY_NODE if a // 4 == b // 4 else pynvml.NVML_TOPOLOGY_SYSTEM)

    def _link_ends(self, index: int) -> list[int | None]:
        """What each active NVLink of GPU `index` reaches: a GPU index, or None (an NVSwitch)."""
        ends: list[int | None] = [None] * self._gpus[index].model.nvswitch_links
        for pair, links in sorted(self._nvlinks.items(), key=lambda kv: sorted(kv[0])):
            if index in pair:
                (peer,) = pair - {index}
                ends += [peer] * links
        return ends

    def set_load(self, gpu_index: int, util: int, power_w: float | None = None) -> None:
        """From now on, a steady `util` % drawing `power_w` W (default: the model's line at that
        utilisation), capped at the power limit; the energy counter follows it exactly."""
        gpu = self._gpus[gpu_index]
        self._close_load(gpu)
        model = gpu.model
        mw = self._power_for(model, util) if power_w is None else round(power_w * 1000)
        gpu.load = (self.time, util, mw)

    def set_throttle(self, gpu_index: int, reasons: int | None) -> None:
        """From now on the GPU's clock-event reasons are `reasons` (None: the pattern's again)."""
        self._gpus[gpu_index].throttle = reasons

    def clear_load(self, gpu_index: int) -> None:
        """Back to the deterministic pattern."""
        gpu = self._gpus[gpu_index]
        self._close_load(gpu)
        gpu.load = None

    def _close_load(self, gpu: _FakeGpu) -> None:
        """Fold the running load's energy (beyond the pattern's) into `extra_energy_mj`."""
        if gpu.load is None:
            return
        since, _, _ = gpu.load
        now = self.time
        pattern = self._pattern_energy(gpu, now) - self._pattern_energy(gpu, since)
        gpu.extra_energy_mj += self._load_power(gpu) * (now - since) - pattern
        gpu.load = (now, gpu.load[1], gpu.load[2])

    def _load_power(self, gpu: _FakeGpu) -> int:
        assert gpu.load is not None
        return min(gpu.load[2], gpu.power_limit_mw)

    # ---- the deterministic series (tests compute expectations from these) --------------------

    def second(self, t: float | None = None) -> int:
        """Whole seconds since the fake started, at `t` (default: now)."""
        return math.floor((self.time if t is None else t) - self.start)

    def util_gpu(self, index: int, t: float | None = None) -> int:
        """Coarse GPU utilisation (%) at time `t` (a set load's, while one is set)."""
        load = self._gpus[index].load
        if load is not None:
            return load[1]
        return UTIL_PATTERN[(self.second(t) + 3 * index) % 10]

    def power_mw(self, index: int, t: float | None = None) -> int:
        """Power draw (mW) at time `t`."""
        gpu = self._gpus[index]
        if gpu.load is not None:
            return self._load_power(gpu)
        return self._power_for(gpu.model, UTIL_PATTERN[(self.second(t) + 3 * index) % 10])

    def _pattern_energy(self, gpu: _FakeGpu, t: float) -> float:
        s = self.second(t)
        frac = (t - self.start) - s
        full, part = divmod(s, 10)
        power = self._power_for(gpu.model, UTIL_PATTERN[(s + 3 * gpu.index) % 10])
        return full * gpu.period_energy + gpu.prefix_energy[part] + power * frac

    def energy_mj(self, index: int, t: float | None = None) -> int:
        """Energy counter (mJ) at time `t`: the integral of power since the fake started."""
        gpu = self._gpus[index]
        t = self.time if t is None else t
        energy = 10**9 * (index + 1) + self._pattern_energy(gpu, t) + gpu.extra_energy_mj
        if gpu.load is not None:
            since = gpu.load[0]
            energy += self._load_power(gpu) * (t - since) - (
                self._pattern_energy(gpu, t) - self._pattern_energy(gpu, since)
            )
        return int(energy)

    def mem_used(self, index: int) -> int:
        """Used memory as memory info v2 reports it (bytes, without the reserved part)."""
        procs = self._gpus[index].processes.values()
        return BASE_USED + sum(b for b in procs if b is not None and b != NOT_AVAILABLE)

    # ---- pynvml: library and system ----------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls["nvmlInit", -1] += 1
        if self.init_error is not None:
            raise _nvml_error(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.calls["nvmlShutdown", -1] += 1
        self.initialised = False

    def _system(self, fn: str) -> None:
        self.calls[fn, -1] += 1
        if not self.initialised:
            raise _nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)

    def nvmlSystemGetDriverVersion(self) -> str:
        self._system("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._system("nvmlSystemGetCudaDriverVersion")
        return self.cuda_driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._system("nvmlDeviceGetCount")
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._system("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self._gpus):
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._device("nvmlDeviceGetHandleByIndex", self._gpus[index].handle).handle

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> _Handle:
        self._system("nvmlDeviceGetHandleByUUID")
        for gpu in self._gpus:
            if gpu.uuid == uuid:
                return self._device("nvmlDeviceGetHandleByUUID", gpu.handle).handle
        raise _nvml_error(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str) -> _Handle:
        self._system("nvmlDeviceGetHandleByPciBusId")
        for gpu in self._gpus:
            if gpu.pci_bus_id == bus_id:
                return self._device("nvmlDeviceGetHandleByPciBusId", gpu.handle).handle
        raise _nvml_error(pynvml.NVML_ERROR_NOT_FOUND)

    # ---- pynvml: devices ---------------------------------------------------------------------

    def _device(self, fn: str, handle: _Handle) -> _FakeGpu:
        gpu = self._gpus[handle.index]
        self.calls[fn, gpu.index] += 1
        if not self.initialised:
            raise _nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
        if gpu.lost_at is not None and self.time >= gpu.lost_at:
            raise _nvml_error(gpu.lost_code)
        if fn in self._missing:
            raise _nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if fn in gpu.model.not_supported:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return self._device("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return self._device("nvmlDeviceGetName", handle).model.name

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> Any:
        gpu = self._device("nvmlDeviceGetPciInfo", handle)
        info = pynvml.nvmlPciInfo_t()
        info.busId = gpu.pci_bus_id.encode()
        info.bus = 0x18 + 0x10 * gpu.index
        return info

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> Any:
        if version and not self.memory_takes_version:
            raise TypeError("nvmlDeviceGetMemoryInfo() got an unexpected keyword argument 'version'")
        fn = "nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo"
        gpu = self._device(fn, handle)
        used = self.mem_used(gpu.index)
        if version:
            mem = pynvml.c_nvmlMemory_v2_t()
            mem.version = version
            mem.reserved = RESERVED
            mem.used = used
        else:
            mem = pynvml.c_nvmlMemory_t()
            mem.used = used + RESERVED
        mem.total = gpu.model.memory_total
        mem.free = gpu.model.memory_total - used - RESERVED
        return mem

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> Any:
        gpu = self._device("nvmlDeviceGetUtilizationRates", handle)
        util = pynvml.c_nvmlUtilization_t()
        util.gpu = self.util_gpu(gpu.index)
        util.memory = util.gpu // 2
        return util

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        return self.power_mw(self._device("nvmlDeviceGetPowerUsage", handle).index)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:
        return self._device("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def nvmlDeviceGetPowerManagementLimit(self, handle: _Handle) -> int:
        return self._device("nvmlDeviceGetPowerManagementLimit", handle).power_limit_mw

    def nvmlDeviceSetPowerManagementLimit(self, handle: _Handle, limit_mw: int) -> None:
        gpu = self._device("nvmlDeviceSetPowerManagementLimit", handle)
        if not self.allow_power_limit:
            raise _nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)
        if not gpu.model.power_min_mw <= limit_mw <= gpu.model.power_max_mw:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._close_load(gpu)
        gpu.power_limit_mw = int(limit_mw)

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: _Handle) -> int:
        return self._device("nvmlDeviceGetPowerManagementDefaultLimit", handle).model.power_default_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: _Handle) -> list[int]:
        model = self._device("nvmlDeviceGetPowerManagementLimitConstraints", handle).model
        return [model.power_min_mw, model.power_max_mw]

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: _Handle) -> int:
        return self.energy_mj(self._device("nvmlDeviceGetTotalEnergyConsumption", handle).index)

    def nvmlDeviceGetFieldValues(self, handle: _Handle, field_ids: list[int]) -> list[Any]:
        """One c_nvmlFieldValue_t per id, each with its own return code and timestamp (µs)."""
        gpu = self._device("nvmlDeviceGetFieldValues", handle)
        now_us = round(self.time * 1e6)
        # Each field: (value type, union member, its getter — a GPU without the getter's
        # reading has no field for it either —, the reading).
        readers: dict[int, tuple[int, str, str, Callable[[], int]]] = {
            pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: (
                3,
                "ullVal",
                "nvmlDeviceGetTotalEnergyConsumption",
                lambda: self.energy_mj(gpu.index),
            ),
            pynvml.NVML_FI_DEV_POWER_AVERAGE: (
                1,
                "uiVal",
                "nvmlDeviceGetPowerUsage",
                lambda: self.power_mw(gpu.index),
            ),
            pynvml.NVML_FI_DEV_POWER_INSTANT: (
                1,
                "uiVal",
                "nvmlDeviceGetPowerUsage",
                lambda: self.power_mw(gpu.index),
            ),
            pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT: (
                1,
                "uiVal",
                "nvmlDeviceGetEnforcedPowerLimit",
                lambda: gpu.power_limit_mw,
            ),
        }
        # One ctypes array, as the binding returns.
        out = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for value, field_id in zip(out, field_ids, strict=True):
            value.fieldId = field_id
            value.timestamp = now_us
            entry = readers.get(field_id)
            if field_id in gpu.model.fields and entry is not None and entry[2] not in gpu.model.not_supported:
                value.valueType, member, _, read = entry
                setattr(value.value, member, read())
                value.nvmlReturn = pynvml.NVML_SUCCESS
            else:
                value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return list(out)

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        gpu = self._device("nvmlDeviceGetTemperature", handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 30 + self.util_gpu(gpu.index) // 2

    def nvmlDeviceGetClockInfo(self, handle: _Handle, clock_type: int) -> int:
        gpu = self._device("nvmlDeviceGetClockInfo", handle)
        busy = self.util_gpu(gpu.index) > 0
        if clock_type == pynvml.NVML_CLOCK_SM:
            return gpu.model.max_sm_clock if busy else gpu.model.idle_sm_clock
        if clock_type == pynvml.NVML_CLOCK_MEM:
            return gpu.model.max_mem_clock if busy else gpu.model.idle_mem_clock
        raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetMaxClockInfo(self, handle: _Handle, clock_type: int) -> int:
        model = self._device("nvmlDeviceGetMaxClockInfo", handle).model
        if clock_type == pynvml.NVML_CLOCK_SM:
            return model.max_sm_clock
        if clock_type == pynvml.NVML_CLOCK_MEM:
            return model.max_mem_clock
        raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _throttle(self, fn: str, handle: _Handle) -> int:
        gpu = self._device(fn, handle)
        if gpu.throttle is not None:
            return gpu.throttle
        util = self.util_gpu(gpu.index)
        return 0x1 if util == 0 else 0x4 if util == 100 else 0

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        return self._throttle("nvmlDeviceGetCurrentClocksEventReasons", handle)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: _Handle) -> int:
        return self._throttle("nvmlDeviceGetCurrentClocksThrottleReasons", handle)

    def nvmlDeviceGetFanSpeed(self, handle: _Handle) -> int:
        return 30 + self.util_gpu(self._device("nvmlDeviceGetFanSpeed", handle).index) // 4

    def nvmlDeviceGetPerformanceState(self, handle: _Handle) -> int:
        return 0 if self.util_gpu(self._device("nvmlDeviceGetPerformanceState", handle).index) else 8

    def nvmlDeviceGetCudaComputeCapability(self, handle: _Handle) -> tuple[int, int]:
        return self._device("nvmlDeviceGetCudaComputeCapability", handle).model.compute_capability

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        self._device("nvmlDeviceGetMigMode", handle)
        return [pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_DISABLE]

    def nvmlDeviceGetSamples(
        self, handle: _Handle, sampling_type: int, last_ts: int
    ) -> tuple[int, list[Any]]:
        gpu = self._device("nvmlDeviceGetSamples", handle)
        if sampling_type != pynvml.NVML_GPU_UTILIZATION_SAMPLES:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        now_us = round(self.time * 1e6)
        lo = max(last_ts, now_us - SAMPLE_BUFFER // SAMPLES_PER_SECOND * 1_000_000)
        first_s = max(0, (lo - self._start_us) // 1_000_000)
        last_s = (now_us - self._start_us) // 1_000_000
        samples: list[Any] = []
        for s in range(first_s, last_s + 1):
            value = UTIL_PATTERN[(s + 3 * gpu.index) % 10]
            if value == 0:
                continue
            base = self._start_us + s * 1_000_000
            for k in range(SAMPLES_PER_SECOND):
                ts = base + k * SAMPLE_STEP_US
                if lo < ts <= now_us:
                    sample = pynvml.c_nvmlSample_t()
                    sample.timeStamp = ts
                    sample.sampleValue.uiVal = value
                    samples.append(sample)
        if not samples:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, samples[-SAMPLE_BUFFER:]

    def nvmlDeviceGetTopologyCommonAncestor(self, handle1: _Handle, handle2: _Handle) -> int:
        a = self._device("nvmlDeviceGetTopologyCommonAncestor", handle1)
        b = self._device("nvmlDeviceGetTopologyCommonAncestor", handle2)
        return self.pcie_level(a.index, b.index)

    def _link_end(self, fn: str, handle: _Handle, link: int) -> tuple[bool, int | None]:
        """(whether the link exists, the GPU it reaches or None for a switch)."""
        gpu = self._device(fn, handle)
        ends = self._link_ends(gpu.index)
        if not 0 <= link < len(ends):
            raise _nvml_error(
                pynvml.NVML_ERROR_NOT_SUPPORTED if not ends else pynvml.NVML_ERROR_INVALID_ARGUMENT
            )
        return True, ends[link]

    def nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int) -> int:
        self._link_end("nvmlDeviceGetNvLinkState", handle, link)
        return int(pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: _Handle, link: int) -> Any:
        _, peer = self._link_end("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        info = pynvml.nvmlPciInfo_t()
        info.busId = (self._gpus[peer].pci_bus_id if peer is not None else NVSWITCH_BUS_ID).encode()
        return info

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: _Handle, link: int) -> int:
        _, peer = self._link_end("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        return int(
            pynvml.NVML_NVLINK_DEVICE_TYPE_GPU if peer is not None else pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
        )

    def nvmlDeviceGetPcieThroughput(self, handle: _Handle, counter: int) -> int:
        gpu = self._device("nvmlDeviceGetPcieThroughput", handle)
        tx = 1000 * self.util_gpu(gpu.index) + gpu.index
        return tx if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else 2 * tx

    def _processes(self, fn: str, handle: _Handle, kind: str) -> list[Any]:
        gpu = self._device(fn, handle)
        return [
            pynvml.nvmlFriendlyObject(
                {
                    "pid": pid,
                    "usedGpuMemory": used,
                    "gpuInstanceId": 0xFFFFFFFF,
                    "computeInstanceId": 0xFFFFFFFF,
                }
            )
            for (pid, k), used in gpu.processes.items()
            if k == kind
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[Any]:
        if self.process_v3_missing:
            self.calls["nvmlDeviceGetComputeRunningProcesses", handle.index] += 1
            raise pynvml.NVMLLibraryMismatchError(
                "Unversioned function called and the pyNVML version does not match the NVML lib version."
            )
        return self._processes("nvmlDeviceGetComputeRunningProcesses", handle, "compute")

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: _Handle) -> list[Any]:
        return self._processes("nvmlDeviceGetComputeRunningProcesses_v2", handle, "compute")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: _Handle) -> list[Any]:
        if self.process_v3_missing:
            self.calls["nvmlDeviceGetGraphicsRunningProcesses", handle.index] += 1
            raise pynvml.NVMLLibraryMismatchError(
                "Unversioned function called and the pyNVML version does not match the NVML lib version."
            )
        return self._processes("nvmlDeviceGetGraphicsRunningProcesses", handle, "graphics")

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle: _Handle) -> list[Any]:
        return self._processes("nvmlDeviceGetGraphicsRunningProcesses_v2", handle, "graphics")


class _OldBindingFakeNvml(FakeNvml):
    """An old nvidia-ml-py: newer symbols are simply absent from the module."""

    def __getattribute__(self, name: str) -> Any:
        if name in _OLD_BINDING_MISSING:
            raise AttributeError(f"module 'pynvml' has no attribute '{name}'")
        return super().__getattribute__(name)


# The constants and error classes of the real module, so the fake can stand in for it whole.
for _name in dir(pynvml):
    if _name.startswith(("NVML_", "NVMLError")) or _name in ("NVMLLibraryMismatchError", "nvmlMemory_v2"):
        setattr(FakeNvml, _name, getattr(pynvml, _name))


def _parse(scenario: str) -> tuple[str, int]:
    if scenario in SCENARIOS:
        return scenario, 1
    match = re.fullmatch(r"(?P<base>[a-z0-9-]+?)x(?P<count>[1-9][0-9]*)", scenario)
    if match and match["base"] in SCENARIOS and match["base"] not in ("none", "driver-not-loaded"):
        return match["base"], int(match["count"])
    raise ValueError(
        f"unknown fake NVML scenario {scenario!r}: use one of {', '.join(SCENARIOS)}, optionally with xN"
    )
