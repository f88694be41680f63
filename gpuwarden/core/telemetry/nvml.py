"""Read NVIDIA GPUs through NVML (nvidia-ml-py's `pynvml`, injected so tests can pass a fake).

Each GPU's capabilities are probed once per UUID: the first time a getter answers NotSupported,
FunctionNotFound or NoPermission (or the binding lacks the symbol), the reading is recorded in
`GpuStatic.unsupported`, logged once, and never called again; its value is None. Versioned
getters fall back to older ones (memory info v2 → v1, clock-event → throttle reasons, process
query v3 → v2). A GPU that raises GpuIsLost / Unknown is reported as `lost` while the others go
on, and is looked up again by UUID (then PCI bus id) at most every `retry_interval` seconds.

Not thread-safe: one sampler thread owns a reader. `nvmlInit` can take seconds on a machine
without persistence mode, so build readers off any UI thread.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

from gpuwarden.core.errors import UserError
from gpuwarden.core.telemetry.host import ProcessEnricher
from gpuwarden.core.telemetry.nvml_topology import TopologyGpu, read_topology
from gpuwarden.core.telemetry.topology import NO_TOPOLOGY, GpuTopology
from gpuwarden.core.telemetry.types import GpuProcess, GpuReader, GpuSample, GpuStatic

log = logging.getLogger(__name__)

FAKE_ENV = "GPUWARDEN_FAKE_NVML"
NO_DRIVER_STATUS = "no NVIDIA driver found: sampling the host only"
MISMATCH_STATUS = (
    "NVIDIA driver/library version mismatch (driver upgraded?): restart or reboot — sampling the host only"
)
DRIVER_NOT_LOADED_STATUS = (
    "NVIDIA kernel driver not loaded (check `nvidia-smi`, load the module): sampling the host only"
)
NO_PERMISSION_STATUS = "no permission to open the NVIDIA devices (/dev/nvidia*): sampling the host only"
NO_GPUS_STATUS = "the NVIDIA driver reports no GPUs: sampling the host only"
NOT_INSTALLED_STATUS = "nvidia-ml-py is not installed (pip install nvidia-ml-py): sampling the host only"
BROKEN_MODULE_STATUS = (
    "the installed `pynvml` module is not NVIDIA's (no {missing}; another package such as nvidia-ml-py3 "
    "or py3nvml replaced it): pip uninstall it and reinstall nvidia-ml-py — sampling the host only"
)

# NVML return codes and enum values (nvml.h); part of the C ABI, so stable across driver releases.
_ERR_NOT_SUPPORTED = 3
_ERR_NO_PERMISSION = 4
_ERR_NOT_FOUND = 6
_ERR_DRIVER_NOT_LOADED = 9
_ERR_LIBRARY_NOT_FOUND = 12
_ERR_FUNCTION_NOT_FOUND = 13
_ERR_GPU_IS_LOST = 15
_ERR_RESET_REQUIRED = 16
_ERR_LIB_RM_VERSION_MISMATCH = 18
_ERR_ARGUMENT_VERSION_MISMATCH = 25
_ERR_UNKNOWN = 999
# A driver older than the binding answers a versioned struct with ARGUMENT_VERSION_MISMATCH.
_UNSUPPORTED_CODES = frozenset(
    {_ERR_NOT_SUPPORTED, _ERR_FUNCTION_NOT_FOUND, _ERR_NO_PERMISSION, _ERR_ARGUMENT_VERSION_MISMATCH}
)
_LOST_CODES = frozenset({_ERR_GPU_IS_LOST, _ERR_UNKNOWN, _ERR_RESET_REQUIRED})
_CLOCK_SM = 1
_CLOCK_MEM = 2
_TEMPERATURE_GPU = 0
_GPU_UTILIZATION_SAMPLES = 1
_PCIE_TX_BYTES = 0
_PCIE_RX_BYTES = 1
_MIG_ENABLE = 1
_NOT_AVAILABLE = 2**64 - 1
# Per-tick readings NVML also offers as field values (nvml.h NVML_FI_*), read together in one
# nvmlDeviceGetFieldValues call: on an H100 the energy getter alone costs milliseconds a call.
# POWER_AVERAGE is what nvmlDeviceGetPowerUsage reports on current GPUs (a 1-s average).
FIELD_IDS: dict[str, int] = {
    "energy": 83,
    "power": 185,
    "power_limit": 190,
}  # usedGpuMemory when NVML cannot tell (older bindings pass it through)
# nvmlValueType_t → the member of the c_nvmlValue_t union that holds the sample.
_VALUE_MEMBER = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")

# Each reading a GPU may not support, and the GpuSample / GpuStatic fields it fills.
_FIELDS: dict[str, tuple[str, ...]] = {
    "utilization": ("util_gpu", "util_mem"),
    "samples": ("util_gpu_fine",),
    "memory": ("mem_used", "mem_total"),
    "power": ("power_w",),
    "power_limit": ("power_limit_w",),
    "energy": ("energy_mj",),
    "temperature": ("temperature_c",),
    "sm_clock": ("sm_clock_mhz",),
    "mem_clock": ("mem_clock_mhz",),
    "throttle": ("throttle_reasons",),
    "fan": ("fan_pct",),
    "pstate": ("pstate",),
    "pcie": ("pcie_tx_bps", "pcie_rx_bps"),
    "processes": ("processes",),
    "graphics_processes": ("graphics_processes",),
    "pci": ("pci_bus_id",),
    "power_limit_default": ("power_limit_default_w",),
    "power_limit_range": ("power_limit_min_w", "power_limit_max_w"),
    "max_sm_clock": ("max_sm_clock_mhz",),
    "max_mem_clock": ("max_mem_clock_mhz",),
    "compute_capability": ("compute_capability",),
    "mig": ("mig_mode",),
}
# Per-tick readings, probed when a GPU is discovered so `unsupported` is complete from the start
# (PCIe and processes are probed on their first, slower, call).
_TICK_READINGS = (
    "utilization",
    "samples",
    "memory",
    "power",
    "power_limit",
    "energy",
    "temperature",
    "sm_clock",
    "mem_clock",
    "throttle",
    "fan",
    "pstate",
)

Getter = Callable[..., Any]


class _Unavailable(Exception):
    """A getter the binding has but cannot call this way (e.g. no `version` argument)."""


class _GpuLost(Exception):
    """A GPU stopped answering (GpuIsLost, Unknown, ResetRequired)."""


@dataclass
class _Gpu:
    """Per-GPU reader state: handle, getters known to work, readings known not to."""

    index: int
    uuid: str
    handle: Any
    static: GpuStatic | None = None
    pci_bus_id: str | None = None
    ready: dict[str, Getter] = field(default_factory=dict)
    tried: dict[str, int] = field(default_factory=dict)  # reading → candidates ruled out
    unsupported: set[str] = field(default_factory=set)
    last_sample_us: int = 0
    fields: dict[str, int] = field(default_factory=dict)  # reading → field id still asked as one
    lost: bool = False
    retry_at: float = 0.0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def cuda_version_text(version: int) -> str:
    """NVML's CUDA driver version integer as text: 12040 → "12.4"."""
    return f"{version // 1000}.{version % 1000 // 10}"


def _code(err: BaseException) -> int | None:
    value = getattr(err, "value", None)
    return value if isinstance(value, int) else None


def _init_failure_status(code: int | None) -> tuple[str, bool]:
    """One-line status for a failed nvmlInit and whether retrying later can help."""
    if code == _ERR_LIBRARY_NOT_FOUND:
        return NO_DRIVER_STATUS, False
    if code == _ERR_LIB_RM_VERSION_MISMATCH:
        return MISMATCH_STATUS, True
    if code == _ERR_DRIVER_NOT_LOADED:
        return DRIVER_NOT_LOADED_STATUS, True
    if code == _ERR_NO_PERMISSION:
        return NO_PERMISSION_STATUS, False
    return f"NVML could not start (error {code}): sampling the host only", True


class NoGpuReader:
    """The GPU reader when there is nothing to read: empty results and a one-line reason."""

    def __init__(self, status: str) -> None:
        self._status = status

    @property
    def status(self) -> str | None:
        """Why no GPU is read."""
        return self._status

    def gpus(self) -> list[GpuStatic]:
        """No GPUs."""
        return []

    def sample(self, ts: float) -> list[GpuSample]:
        """No samples."""
        return []

    def processes(self, ts: float) -> list[GpuProcess]:
        """No processes."""
        return []

    def read_pcie(self, samples: list[GpuSample]) -> None:
        """Nothing to fill."""

    def topology(self) -> GpuTopology:
        """Nothing is connected."""
        return NO_TOPOLOGY

    def energy_mj(self, uuid: str) -> int | None:
        """No counter."""
        return None

    def close(self) -> None:
        """Nothing to release."""


class NvmlReader:
    """`GpuReader` over an injected pynvml module (the real one by default)."""

    def __init__(
        self,
        nvml: ModuleType | Any = None,
        *,
        enrich: Callable[[list[GpuProcess]], None] | None = None,
        retry_interval: float = 30.0,
    ) -> None:
        self._retry_interval = retry_interval
        self._enrich = enrich if enrich is not None else ProcessEnricher()
        self._gpus: list[_Gpu] = []
        self._by_uuid: dict[str, _Gpu] = {}
        self._pending: list[int] = []  # indices whose handle could not be read yet
        self._pending_retry_at = 0.0
        self._static_cache: list[GpuStatic] | None = None
        self._logged: set[tuple[str, int | str | None]] = set()
        self._initialised = False
        self._topology = NO_TOPOLOGY
        self._status: str | None = None
        self._retryable = False
        self._init_backoff = 5.0
        self._init_retry_at = 0.0
        self.driver_version: str | None = None
        self.cuda_driver_version: str | None = None
        if nvml is None:
            try:
                import pynvml

                nvml = pynvml
            except ImportError:
                self._status = NOT_INSTALLED_STATUS
                return
        self._nvml = nvml
        missing = next(
            (n for n in ("nvmlInit", "nvmlDeviceGetCount", "NVMLError") if not hasattr(nvml, n)), None
        )
        if missing is not None:
            self._status = BROKEN_MODULE_STATUS.format(missing=missing)
            return
        self._error: type[BaseException] = nvml.NVMLError
        # Raised by the binding's unversioned wrappers when the driver lacks the newer symbol.
        mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)
        self._version_errors: tuple[type[BaseException], ...] = (_Unavailable,) + (
            (mismatch,) if isinstance(mismatch, type) else ()
        )
        self._candidates = self._build_candidates(nvml)
        self._start()

    # ---- setup ------------------------------------------------------------------------------

    @staticmethod
    def _build_candidates(nvml: Any) -> dict[str, list[tuple[str, Getter]]]:
        """Getters for each reading, newest first; symbols the binding lacks are left out."""

        def get(name: str) -> Getter | None:
            fn = getattr(nvml, name, None)
            return fn if callable(fn) else None

        def arg(name: str, *args: Any) -> Getter | None:
            fn = get(name)
            if fn is None:
                return None
            return lambda h: fn(h, *args)

        mem = get("nvmlDeviceGetMemoryInfo")
        samples = get("nvmlDeviceGetSamples")
        samples_getter: Getter | None = None
        if samples is not None:
            samples_getter = lambda h, last_ts: samples(h, _GPU_UTILIZATION_SAMPLES, last_ts)  # noqa: E731
        pairs: dict[str, list[tuple[str, Getter | None]]] = {
            "utilization": [("nvmlDeviceGetUtilizationRates", get("nvmlDeviceGetUtilizationRates"))],
            "samples": [("nvmlDeviceGetSamples", samples_getter)],
            "memory": [
                ("nvmlDeviceGetMemoryInfo_v2", _memory_v2_getter(mem, getattr(nvml, "nvmlMemory_v2", None))),
                ("nvmlDeviceGetMemoryInfo", mem),
            ],
            "power": [("nvmlDeviceGetPowerUsage", get("nvmlDeviceGetPowerUsage"))],
            "power_limit": [("nvmlDeviceGetEnforcedPowerLimit", get("nvmlDeviceGetEnforcedPowerLimit"))],
            "energy": [("nvmlDeviceGetTotalEnergyConsumption", get("nvmlDeviceGetTotalEnergyConsumption"))],
            "temperature": [("nvmlDeviceGetTemperature", arg("nvmlDeviceGetTemperature", _TEMPERATURE_GPU))],
            "sm_clock": [("nvmlDeviceGetClockInfo", arg("nvmlDeviceGetClockInfo", _CLOCK_SM))],
            "mem_clock": [("nvmlDeviceGetClockInfo", arg("nvmlDeviceGetClockInfo", _CLOCK_MEM))],
            "throttle": [
                ("nvmlDeviceGetCurrentClocksEventReasons", get("nvmlDeviceGetCurrentClocksEventReasons")),
                (
                    "nvmlDeviceGetCurrentClocksThrottleReasons",
                    get("nvmlDeviceGetCurrentClocksThrottleReasons"),
                ),
            ],
            "fan": [("nvmlDeviceGetFanSpeed", get("nvmlDeviceGetFanSpeed"))],
            "pstate": [("nvmlDeviceGetPerformanceState", get("nvmlDeviceGetPerformanceState"))],
            "pcie": [("nvmlDeviceGetPcieThroughput", get("nvmlDeviceGetPcieThroughput"))],
            "processes": [
                ("nvmlDeviceGetComputeRunningProcesses", get("nvmlDeviceGetComputeRunningProcesses")),
                ("nvmlDeviceGetComputeRunningProcesses_v2", get("nvmlDeviceGetComputeRunningProcesses_v2")),
            ],
            "graphics_processes": [
                ("nvmlDeviceGetGraphicsRunningProcesses", get("nvmlDeviceGetGraphicsRunningProcesses")),
                (
                    "nvmlDeviceGetGraphicsRunningProcesses_v2",
                    get("nvmlDeviceGetGraphicsRunningProcesses_v2"),
                ),
            ],
            **_property_getters(get, arg),
        }
        return {key: [(name, fn) for name, fn in cands if fn is not None] for key, cands in pairs.items()}

    def _start(self) -> bool:
        """nvmlInit and discover GPUs; on failure set the status line. True when GPUs are read."""
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except self._error as err:
            self._status, self._retryable = _init_failure_status(_code(err))
            return False
        except (AttributeError, OSError) as err:
            self._status = BROKEN_MODULE_STATUS.format(missing=f"working nvmlInit ({err})")
            self._retryable = False
            return False
        self._initialised = True
        self.driver_version = self._system("nvmlSystemGetDriverVersion", _text)
        self.cuda_driver_version = self._system("nvmlSystemGetCudaDriverVersion", cuda_version_text)
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except self._error as err:
            self._status, self._retryable = _init_failure_status(_code(err))
            self.close()
            return False
        except AttributeError:
            self._status = BROKEN_MODULE_STATUS.format(missing="nvmlDeviceGetCount")
            return False
        if count == 0:
            self._status = NO_GPUS_STATUS
            return False
        for index in range(count):
            self._discover(index)
        self._read_topology()
        self._status = None
        return True

    def _system(self, name: str, convert: Callable[[Any], str]) -> str | None:
        try:
            return convert(getattr(self._nvml, name)())
        except (self._error, AttributeError, TypeError, ValueError) as err:
            log.info("NVML %s unavailable (%s)", name, err)
            return None

    def _discover(self, index: int) -> None:
        """Read a GPU's static facts and probe its per-tick readings, once per UUID."""
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            name = _text(nvml.nvmlDeviceGetName(handle))
        except self._error as err:
            log.warning(
                "GPU %d does not answer (%s); retrying every %.0f s", index, err, self._retry_interval
            )
            if index not in self._pending:
                self._pending.append(index)
            return
        gpu = _Gpu(index=index, uuid=uuid, handle=handle)
        if callable(getattr(nvml, "nvmlDeviceGetFieldValues", None)):
            gpu.fields = dict(FIELD_IDS)
        try:
            pci = self._call(gpu, "pci")
            gpu.pci_bus_id = _text(pci.busId) if pci is not None else None
            memory = self._call(gpu, "memory")
            default_limit = self._call(gpu, "power_limit_default")
            limits = self._call(gpu, "power_limit_range")
            cc = self._call(gpu, "compute_capability")
            mig = self._call(gpu, "mig")
            gpu.static = GpuStatic(
                uuid=uuid,
                index=index,
                name=name,
                pci_bus_id=gpu.pci_bus_id,
                memory_total=int(memory.total) if memory is not None else None,
                power_limit_default_w=default_limit / 1000 if default_limit is not None else None,
                power_limit_min_w=limits[0] / 1000 if limits is not None else None,
                power_limit_max_w=limits[1] / 1000 if limits is not None else None,
                max_sm_clock_mhz=self._call(gpu, "max_sm_clock"),
                max_mem_clock_mhz=self._call(gpu, "max_mem_clock"),
                compute_capability=f"{cc[0]}.{cc[1]}" if cc is not None else None,
                driver_version=self.driver_version,
                cuda_driver_version=self.cuda_driver_version,
                mig_mode=mig[0] == _MIG_ENABLE if mig is not None else None,
            )
            batched = self._read_fields(gpu)
            for key in _TICK_READINGS:
                if key in batched:
                    continue
                value = self._call(gpu, key, *((0,) if key == "samples" else ()))
                if key == "samples" and value is not None:
                    self._fine_util(gpu, value)
        except _GpuLost as err:
            log.warning("GPU %d (%s) lost during discovery (%s); retrying later", index, uuid, err)
            if index not in self._pending:
                self._pending.append(index)
            return
        if index in self._pending:
            self._pending.remove(index)
        self._gpus.append(gpu)
        self._gpus.sort(key=lambda g: g.index)
        self._by_uuid[uuid] = gpu
        self._static_cache = None

    # ---- the guarded call -------------------------------------------------------------------

    def _call(self, gpu: _Gpu, key: str, *args: Any) -> Any:
        """Value of one reading, or None (unsupported, or a transient error); raises _GpuLost."""
        fn = gpu.ready.get(key)
        if fn is None:
            return self._probe(gpu, key, args)
        try:
            return fn(gpu.handle, *args)
        except self._error as err:
            code = _code(err)
            if code in _LOST_CODES:
                raise _GpuLost(str(err)) from err
            if code in _UNSUPPORTED_CODES:
                # Worked before, refuses now (e.g. MIG enabled): try the remaining candidates.
                del gpu.ready[key]
                gpu.tried[key] = gpu.tried.get(key, 0) + 1
                return self._probe(gpu, key, args)
            self._note_transient(key, code, err)
            return None

    def _probe(self, gpu: _Gpu, key: str, args: tuple[Any, ...]) -> Any:
        """First call of a reading on a GPU: find the getter that works, or mark it unsupported."""
        if key in gpu.unsupported:
            return None
        candidates = self._candidates[key]
        start = gpu.tried.get(key, 0)
        reason = "not in this nvidia-ml-py"
        for pos in range(start, len(candidates)):
            name, fn = candidates[pos]
            try:
                value = fn(gpu.handle, *args)
            except self._error as err:
                code = _code(err)
                if code in _LOST_CODES:
                    raise _GpuLost(str(err)) from err
                if code in _UNSUPPORTED_CODES:
                    reason = f"{name}: {err}"
                    gpu.tried[key] = pos + 1
                    continue
                # The getter exists and answered: this error is about now, not about support.
                gpu.ready[key] = fn
                self._note_transient(key, code, err)
                return None
            except self._version_errors as err:
                reason = f"{name}: {type(err).__name__}: {err}"
                gpu.tried[key] = pos + 1
                continue
            gpu.ready[key] = fn
            return value
        gpu.unsupported.add(key)
        self._static_cache = None
        if ("unsupported", key) not in self._logged:
            self._logged.add(("unsupported", key))
            log.info("GPU %d (%s): %s unavailable (%s); stored as NULL", gpu.index, gpu.uuid, key, reason)
        return None

    def _note_transient(self, key: str, code: int | None, err: BaseException) -> None:
        # NOT_FOUND from GetSamples only means "idle since the last call".
        if code == _ERR_NOT_FOUND and key == "samples":
            return
        if (key, code) not in self._logged:
            self._logged.add((key, code))
            log.warning("NVML %s failed (%s); stored as NULL for that tick", key, err)

    # ---- GpuReader --------------------------------------------------------------------------

    @property
    def status(self) -> str | None:
        """None while GPUs are read, else one line saying why not."""
        return self._status

    @property
    def retrying(self) -> bool:
        """True while a failed nvmlInit is retried with back-off on each `sample()`."""
        return self._status is not None and self._retryable and not self._initialised

    def gpus(self) -> list[GpuStatic]:
        """Static facts of every GPU found, with the readings each does not support."""
        if self._static_cache is None:
            out: list[GpuStatic] = []
            for gpu in self._gpus:
                if gpu.static is None:
                    continue
                unsupported = tuple(f for key in _FIELDS if key in gpu.unsupported for f in _FIELDS[key])
                if unsupported != gpu.static.unsupported:
                    gpu.static = replace(gpu.static, unsupported=unsupported)
                out.append(gpu.static)
            self._static_cache = out
        return list(self._static_cache)

    def sample(self, ts: float) -> list[GpuSample]:
        """One GpuSample per known GPU; lost GPUs come back as `lost=True`."""
        if not self._initialised or self._pending:
            self._retry_start(ts)
        out: list[GpuSample] = []
        for gpu in self._gpus:
            if gpu.lost and not self._reacquire(gpu, ts):
                out.append(GpuSample(ts=ts, uuid=gpu.uuid, lost=True))
                continue
            try:
                out.append(self._sample_one(gpu, ts))
            except _GpuLost as err:
                self._mark_lost(gpu, ts, err)
                out.append(GpuSample(ts=ts, uuid=gpu.uuid, lost=True))
        return out

    def _sample_one(self, gpu: _Gpu, ts: float) -> GpuSample:
        call = self._call
        s = GpuSample(ts=ts, uuid=gpu.uuid)
        util = call(gpu, "utilization")
        if util is not None:
            s.util_gpu = float(util.gpu)
            s.util_mem = float(util.memory)
        fine = call(gpu, "samples", gpu.last_sample_us)
        if fine is not None:
            s.util_gpu_fine = self._fine_util(gpu, fine)
        mem = call(gpu, "memory")
        if mem is not None:
            s.mem_used = int(mem.used)
            s.mem_total = int(mem.total)
        batched = self._read_fields(gpu)
        power = batched["power"] if "power" in batched else call(gpu, "power")
        if power is not None:
            s.power_w = power / 1000
        limit = batched["power_limit"] if "power_limit" in batched else call(gpu, "power_limit")
        if limit is not None:
            s.power_limit_w = limit / 1000
        s.energy_mj = batched["energy"] if "energy" in batched else call(gpu, "energy")
        temperature = call(gpu, "temperature")
        if temperature is not None:
            s.temperature_c = float(temperature)
        s.sm_clock_mhz = call(gpu, "sm_clock")
        s.mem_clock_mhz = call(gpu, "mem_clock")
        s.throttle_reasons = call(gpu, "throttle")
        fan = call(gpu, "fan")
        if fan is not None:
            s.fan_pct = float(fan)
        s.pstate = call(gpu, "pstate")
        return s

    def _read_fields(self, gpu: _Gpu, keys: tuple[str, ...] | None = None) -> dict[str, Any]:
        """The readings `gpu` answers as field values (all still asked, or `keys`), in one call.

        A reading missing from the answer goes through its getter: a field answering
        NotSupported is dropped for this GPU for good, and a GPU (or binding) without
        nvmlDeviceGetFieldValues falls back wholly, both probed once."""
        wanted = [(k, fid) for k, fid in gpu.fields.items() if keys is None or k in keys]
        if not wanted:
            return {}
        try:
            values = self._nvml.nvmlDeviceGetFieldValues(gpu.handle, [fid for _, fid in wanted])
        except self._error as err:
            code = _code(err)
            if code in _LOST_CODES:
                raise _GpuLost(str(err)) from err
            if code in _UNSUPPORTED_CODES:
                self._drop_fields(gpu, [k for k, _ in wanted], f"nvmlDeviceGetFieldValues: {err}")
            else:
                self._note_transient("field values", code, err)
            return {}
        out: dict[str, Any] = {}
        for (key, _), value in zip(wanted, values, strict=False):
            code = int(value.nvmlReturn)
            if code == 0:
                out[key] = _field_value(value)
            elif code in _LOST_CODES:
                raise _GpuLost(f"field {key}: NVML error {code}")
            elif code in _UNSUPPORTED_CODES:
                self._drop_fields(gpu, [key], f"field value NVML error {code}")
            else:
                out[key] = None
                self._note_transient(key, code, RuntimeError(f"field value NVML error {code}"))
        return out

    def _drop_fields(self, gpu: _Gpu, keys: list[str], reason: str) -> None:
        for key in keys:
            gpu.fields.pop(key, None)
            if ("field", key) not in self._logged:
                self._logged.add(("field", key))
                log.info(
                    "GPU %d (%s): %s not a field value (%s); read by its getter",
                    gpu.index,
                    gpu.uuid,
                    key,
                    reason,
                )

    @staticmethod
    def _fine_util(gpu: _Gpu, result: tuple[int, list[Any]]) -> float | None:
        """Mean of the GetSamples values; remembers NVML's newest timestamp for the next call."""
        value_type, samples = result
        if not samples:
            return None
        member = _VALUE_MEMBER[value_type] if 0 <= value_type < len(_VALUE_MEMBER) else "uiVal"
        total = 0.0
        newest = gpu.last_sample_us
        for sample in samples:
            total += getattr(sample.sampleValue, member)
            if sample.timeStamp > newest:
                newest = sample.timeStamp
        gpu.last_sample_us = newest
        return total / len(samples)

    def energy_mj(self, uuid: str) -> int | None:
        """One GPU's energy counter (mJ since the driver loaded), read alone: cheap enough to
        read many times a second around a short measurement. None when unsupported or lost."""
        gpu = self._by_uuid.get(uuid)
        if gpu is None or gpu.lost or not self._initialised:
            return None
        try:
            batched = self._read_fields(gpu, ("energy",))
            value = batched["energy"] if "energy" in batched else self._call(gpu, "energy")
        except _GpuLost:
            return None
        return int(value) if value is not None else None

    def field_readings(self, uuid: str) -> tuple[str, ...]:
        """The readings of one GPU that come from nvmlDeviceGetFieldValues (the rest: getters)."""
        gpu = self._by_uuid.get(uuid)
        return tuple(gpu.fields) if gpu is not None else ()

    def power_limit_w(self, uuid: str) -> float | None:
        """One GPU's enforced power limit (W), read alone; None when unsupported or lost."""
        gpu = self._by_uuid.get(uuid)
        if gpu is None or gpu.lost or not self._initialised:
            return None
        try:
            value = self._call(gpu, "power_limit")
        except _GpuLost:
            return None
        return value / 1000 if value is not None else None

    def set_power_limit_w(self, uuid: str, watts: float) -> str | None:
        """Set one GPU's power limit — the reader's only write, used by the opt-in power-limit
        sweep of `gpuwarden tune`. None when it took effect, else why not (one line): NVML
        allows it to root only."""
        gpu = self._by_uuid.get(uuid)
        setter = getattr(self._nvml, "nvmlDeviceSetPowerManagementLimit", None)
        if gpu is None or gpu.lost or not self._initialised or setter is None:
            return "this GPU or this nvidia-ml-py cannot set a power limit"
        try:
            setter(gpu.handle, round(watts * 1000))
        except self._error as err:
            if _code(err) == _ERR_NO_PERMISSION:
                return "NVML refuses to change the power limit without root (NoPermission)"
            return f"NVML refused the power limit {watts:.0f} W ({err})"
        return None

    def read_pcie(self, samples: list[GpuSample]) -> None:
        """Fill PCIe tx/rx (bytes/s) on `samples`; blocks ~20 ms per GPU on hardware."""
        for s in samples:
            gpu = self._by_uuid.get(s.uuid)
            if gpu is None or gpu.lost or s.lost:
                continue
            try:
                tx = self._call(gpu, "pcie", _PCIE_TX_BYTES)
                rx = self._call(gpu, "pcie", _PCIE_RX_BYTES) if tx is not None else None
            except _GpuLost as err:
                self._mark_lost(gpu, s.ts, err)
                continue
            # NVML reports KB/s (1 KB = 1024 bytes).
            s.pcie_tx_bps = tx * 1024.0 if tx is not None else None
            s.pcie_rx_bps = rx * 1024.0 if rx is not None else None

    def processes(self, ts: float) -> list[GpuProcess]:
        """Processes holding memory on each GPU, with host name/cmdline/user/CPU/RSS."""
        rows: list[GpuProcess] = []
        for gpu in self._gpus:
            if gpu.lost:
                continue
            try:
                for key, kind in (("processes", "compute"), ("graphics_processes", "graphics")):
                    for proc in self._call(gpu, key) or ():
                        used = getattr(proc, "usedGpuMemory", None)
                        rows.append(
                            GpuProcess(
                                ts=ts,
                                uuid=gpu.uuid,
                                pid=int(proc.pid),
                                used_memory=None if used is None or used == _NOT_AVAILABLE else int(used),
                                kind=kind,
                            )
                        )
            except _GpuLost as err:
                self._mark_lost(gpu, ts, err)
        if rows:
            self._enrich(rows)
        return rows

    def topology(self) -> GpuTopology:
        """How the GPUs are linked (read when they are discovered; safe from any thread)."""
        return self._topology

    def _read_topology(self) -> None:
        gpus = [TopologyGpu(g.uuid, g.handle, g.pci_bus_id) for g in self._gpus if not g.lost]
        self._topology = read_topology(self._nvml, gpus, self._error)

    def close(self) -> None:
        """Shut NVML down (once)."""
        if self._initialised:
            self._initialised = False
            try:
                self._nvml.nvmlShutdown()
            except self._error as err:
                log.debug("nvmlShutdown failed: %s", err)

    # ---- losing and finding GPUs ------------------------------------------------------------

    def _mark_lost(self, gpu: _Gpu, ts: float, err: BaseException) -> None:
        gpu.lost = True
        gpu.retry_at = ts + self._retry_interval
        log.warning(
            "GPU %d (%s) stopped answering (%s); the others go on, retrying every %.0f s",
            gpu.index,
            gpu.uuid,
            err,
            self._retry_interval,
        )

    def _reacquire(self, gpu: _Gpu, ts: float) -> bool:
        """Look a lost GPU up again (by UUID, then PCI bus id), at most every retry_interval."""
        if ts < gpu.retry_at:
            return False
        gpu.retry_at = ts + self._retry_interval
        nvml = self._nvml
        lookups: list[tuple[Getter, str]] = [(nvml.nvmlDeviceGetHandleByUUID, gpu.uuid)]
        if gpu.pci_bus_id and hasattr(nvml, "nvmlDeviceGetHandleByPciBusId"):
            lookups.append((nvml.nvmlDeviceGetHandleByPciBusId, gpu.pci_bus_id))
        for lookup, key in lookups:
            try:
                handle = lookup(key)
                if _text(nvml.nvmlDeviceGetUUID(handle)) != gpu.uuid:
                    continue
            except self._error:
                continue
            gpu.handle = handle
            gpu.lost = False
            log.warning("GPU %d (%s) answers again", gpu.index, gpu.uuid)
            return True
        return False

    def _retry_start(self, ts: float) -> None:
        """Retry a failed nvmlInit with back-off, or GPUs whose handle could not be read."""
        if not self._initialised:
            if not self._retryable or ts < self._init_retry_at:
                return
            self._init_retry_at = ts + self._init_backoff
            self._init_backoff = min(self._init_backoff * 2, 300.0)
            if self._start():
                log.warning("NVML started after retrying; sampling %d GPU(s)", len(self._gpus))
            return
        if ts >= self._pending_retry_at:
            self._pending_retry_at = ts + self._retry_interval
            pending = len(self._pending)
            for index in list(self._pending):
                self._discover(index)
            if len(self._pending) != pending:
                self._read_topology()


def open_gpu_reader(
    fake: str | None = None, *, enrich: Callable[[list[GpuProcess]], None] | None = None
) -> GpuReader:
    """The GPU reader for this machine: a fake scenario when `fake` or $GPUWARDEN_FAKE_NVML names
    one, else real NVML; when NVML cannot start, a NoGpuReader whose status says why.

    A retryable failure (driver/library mismatch, driver not loaded) returns an NvmlReader that
    keeps retrying nvmlInit with back-off from `sample()`. Raises UserError for an unknown fake
    scenario name.
    """
    scenario = fake or os.environ.get(FAKE_ENV) or None
    nvml: Any = None
    if scenario:
        from gpuwarden.core.telemetry.fake_nvml import FakeNvml

        try:
            nvml = FakeNvml(scenario, clock=time.time)
        except ValueError as exc:
            raise UserError(f"{FAKE_ENV}: {exc} (e.g. h100x2) — or unset it to read the real GPUs") from None
    reader = NvmlReader(nvml, enrich=enrich)
    if reader.status is None or reader.retrying:
        return reader
    reader.close()
    return NoGpuReader(reader.status)


def _field_value(value: Any) -> int | float:
    """The number in one c_nvmlFieldValue_t, from the union member its valueType names."""
    kind = int(value.valueType)
    member = _VALUE_MEMBER[kind] if 0 <= kind < len(_VALUE_MEMBER) else "ullVal"
    number: int | float = getattr(value.value, member)
    return number


def _memory_v2_getter(mem: Getter | None, mem_v2: Any) -> Getter | None:
    """Memory info version 2, tried before version 1; None where the binding has no version 2."""
    if mem is None or mem_v2 is None:
        return None

    def getter(h: Any) -> Any:
        try:
            return mem(h, version=mem_v2)
        except TypeError as err:  # a binding whose nvmlDeviceGetMemoryInfo takes no version
            raise _Unavailable(str(err)) from err

    return getter


def _property_getters(
    get: Callable[[str], Getter | None], arg: Callable[..., Getter | None]
) -> dict[str, list[tuple[str, Getter | None]]]:
    """Getters of a GPU's static facts, read once when it is discovered."""
    return {
        "pci": [("nvmlDeviceGetPciInfo", get("nvmlDeviceGetPciInfo"))],
        "power_limit_default": [
            ("nvmlDeviceGetPowerManagementDefaultLimit", get("nvmlDeviceGetPowerManagementDefaultLimit"))
        ],
        "power_limit_range": [
            (
                "nvmlDeviceGetPowerManagementLimitConstraints",
                get("nvmlDeviceGetPowerManagementLimitConstraints"),
            )
        ],
        "max_sm_clock": [("nvmlDeviceGetMaxClockInfo", arg("nvmlDeviceGetMaxClockInfo", _CLOCK_SM))],
        "max_mem_clock": [("nvmlDeviceGetMaxClockInfo", arg("nvmlDeviceGetMaxClockInfo", _CLOCK_MEM))],
        "compute_capability": [
            ("nvmlDeviceGetCudaComputeCapability", get("nvmlDeviceGetCudaComputeCapability"))
        ],
        "mig": [("nvmlDeviceGetMigMode", get("nvmlDeviceGetMigMode"))],
    }
