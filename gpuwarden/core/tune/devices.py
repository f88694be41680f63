"""The target GPU's energy counter and power limiter, for the CLI's tune and the daemon's autotune."""

from __future__ import annotations

from gpuwarden.core.telemetry.nvml import NvmlReader
from gpuwarden.core.telemetry.types import GpuReader
from gpuwarden.core.tune.energy import EnergyCounter, GpuEnergyCounter
from gpuwarden.core.tune.power import CommandPowerLimiter, NvmlPowerLimiter, PowerLimiter
from gpuwarden.core.tune.target import Target


def tune_devices(
    reader: GpuReader, target: Target, power_limit_command: str | None
) -> tuple[EnergyCounter | None, PowerLimiter | None]:
    """Through `reader` (kept open while tuning): the energy counter and the power limiter of the
    target's GPU — the user's helper command when one is configured, else NVML. None on the CPU."""
    gpu = target.gpu
    if gpu is None or not isinstance(reader, NvmlReader):
        return None, None
    limiter: PowerLimiter
    if power_limit_command:
        limiter = CommandPowerLimiter(power_limit_command, gpu, lambda: reader.power_limit_w(gpu.uuid))
    else:
        limiter = NvmlPowerLimiter(reader, gpu.uuid)
    return GpuEnergyCounter(reader, gpu.uuid), limiter
