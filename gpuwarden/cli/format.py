"""Human-readable formatting shared by CLI commands (no colours: output is often piped or logged)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click

from gpuwarden.core.units import gib, num

if TYPE_CHECKING:
    from gpuwarden.core.telemetry.types import GpuSample, GpuStatic, HostSample


def gpu_line(static: GpuStatic | None, s: GpuSample, *, labelled: bool = True) -> str:
    """One line per GPU per tick: power first, because it tracks useful work best (unlabelled
    under a line that already names the GPU)."""
    from gpuwarden.core.telemetry.types import THROTTLE_ACTIVE_MASK, throttle_names

    label = (f"[{static.index}] {static.name}" if static else s.uuid[:12]) if labelled else ""
    if s.lost:
        return "  ".join(p for p in (label, "LOST (not answering NVML)") if p)
    if s.power_w is not None and s.power_limit_w:
        power = f"power {s.power_w:.0f}/{s.power_limit_w:.0f} W ({100 * s.power_w / s.power_limit_w:.0f}%)"
    else:
        power = f"power {num(s.power_w, '.0f', ' W')}"
    util = s.util_gpu_fine if s.util_gpu_fine is not None else s.util_gpu
    parts = [
        label,
        power,
        f"util {num(util, '.0f', '%')}",
        f"mem {gib(s.mem_used)}/{gib(s.mem_total)} GiB",
        f"{num(s.temperature_c, '.0f', '°C')}",
        f"SM {num(s.sm_clock_mhz, 'd', ' MHz')} mem {num(s.mem_clock_mhz, 'd', ' MHz')}",
    ]
    active = (s.throttle_reasons or 0) & THROTTLE_ACTIVE_MASK
    if active:
        parts.append("THROTTLED: " + ",".join(throttle_names(active)))
    return "  ".join(p for p in parts if p)


def host_line(h: HostSample) -> str:
    return (
        f"host  cpu {num(h.cpu_percent, '.0f', '%')}  mem {gib(h.mem_used)}/{gib(h.mem_total)} GiB"
        f"  load {num(h.load1, '.2f')}"
    )


def print_json(obj: Any) -> None:
    """Exactly one JSON document on stdout (an API model as the API sends it)."""
    sys.stdout.write(json.dumps(obj, indent=2, default=_jsonable) + "\n")
    sys.stdout.flush()


def _jsonable(obj: Any) -> Any:
    from pydantic import BaseModel  # loaded already by whatever built `obj`

    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    return str(obj)


def note(message: str) -> None:
    """Status lines go to stderr so `--json` stdout stays parseable."""
    click.echo(message, err=True)
