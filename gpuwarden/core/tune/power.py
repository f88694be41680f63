"""The opt-in power-limit sweep: the tuned configuration probed again under lower power limits.

A GPU below its default limit usually loses less throughput than it saves power (Zeus measured
15–75 % energy saved by choosing batch size and power limit together), so for the energy and
balanced objectives the sweep can find a better point than the batch search alone. Changing the
limit is a privileged, machine-wide act: NVML allows it to root only, or the user installs a
helper command (`power_limit_command`, e.g. a sudoers rule for `nvidia-smi -pl`). The sweep
always puts the original limit back, and it recommends rather than applies: the limit it finds
is reported with the command that sets it.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from gpuwarden.core.errors import UserError
from gpuwarden.core.telemetry.types import GpuStatic
from gpuwarden.core.tune.objective import Objective, score, unit
from gpuwarden.core.tune.search import ProbeFn, ProbeResult

# The sweep goes down to this share of the default limit (or the card's minimum, if higher).
LOWEST_SHARE = 0.5
LEVELS = 4


class PowerLimiter(Protocol):
    """Reads and sets one GPU's power limit."""

    def limit_w(self) -> float | None: ...

    def set_limit_w(self, watts: float) -> str | None:
        """None when the limit took effect, else why not (one line)."""
        ...


class _LimitReader(Protocol):
    def power_limit_w(self, uuid: str) -> float | None: ...

    def set_power_limit_w(self, uuid: str, watts: float) -> str | None: ...


@dataclass
class NvmlPowerLimiter:
    """Through NVML directly (root only)."""

    reader: _LimitReader
    uuid: str

    def limit_w(self) -> float | None:
        return self.reader.power_limit_w(self.uuid)

    def set_limit_w(self, watts: float) -> str | None:
        return self.reader.set_power_limit_w(self.uuid, watts)


@dataclass
class CommandPowerLimiter:
    """Through the user's helper: `command` with {index}, {uuid} and {watts} filled in."""

    command: str
    gpu: GpuStatic
    read: Callable[[], float | None]
    run: Callable[[list[str]], subprocess.CompletedProcess[str]] | None = None

    def limit_w(self) -> float | None:
        return self.read()

    def set_limit_w(self, watts: float) -> str | None:
        argv = [
            part.format(index=self.gpu.index, uuid=self.gpu.uuid, watts=f"{watts:.0f}")
            for part in shlex.split(self.command)
        ]
        runner = self.run or (lambda a: subprocess.run(a, capture_output=True, text=True, timeout=60))
        try:
            done = runner(argv)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"power_limit_command {argv[0]!r} could not run ({exc})"
        if done.returncode != 0:
            tail = (done.stderr or done.stdout or "").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
            return f"power_limit_command exited {done.returncode}: {tail[0][:200]}"
        return None


def sweep_levels(gpu: GpuStatic, current_w: float) -> list[float]:
    """Limits below the current one, evenly down to half the default (never under the card's
    minimum), rounded to whole watts."""
    default = gpu.power_limit_default_w or current_w
    low = max(gpu.power_limit_min_w or 0.0, LOWEST_SHARE * default)
    if low >= current_w:
        return []
    step = (current_w - low) / (LEVELS - 1)
    return [float(round(current_w - k * step)) for k in range(1, LEVELS)]


def what_the_sweep_needs(gpu: GpuStatic | None, why: str | None) -> str:
    """The line a report shows when no sweep ran."""
    if gpu is None:
        return "a power-limit sweep needs an NVIDIA GPU and NVML sees none here — tune without --power-sweep"
    reason = f" ({why})" if why else ""
    return (
        f"a power-limit sweep (--power-sweep) needs permission to change GPU {gpu.index}'s limit{reason}: "
        "run tune as root, or set power_limit_command in the config to a helper you are allowed "
        "to run, e.g. 'sudo -n nvidia-smi -i {index} -pl {watts}' with a sudoers rule for it"
    )


def power_sweep(
    probe: ProbeFn,
    best: ProbeResult,
    limiter: PowerLimiter,
    gpu: GpuStatic,
    objective: Objective,
    min_gain: float,
) -> dict[str, Any]:
    """Probe `best`'s configuration at lower limits; the original limit is restored whatever
    happens. The result names the best limit for `objective` (the current one unless a lower
    one gains `min_gain`) and how to set it."""
    original = limiter.limit_w()
    if original is None:
        raise UserError(f"GPU {gpu.index}: its power limit cannot be read, so it cannot be swept")
    denied = limiter.set_limit_w(original)  # a no-op that proves the permission first
    if denied is not None:
        raise UserError(what_the_sweep_needs(gpu, denied))
    trials: list[ProbeResult] = []
    try:
        for watts in sweep_levels(gpu, original):
            refused = limiter.set_limit_w(watts)
            if refused is not None:
                raise UserError(f"GPU {gpu.index}: setting {watts:.0f} W failed: {refused}")
            trials.append(probe(replace(best.candidate, power_limit_w=watts)))
    finally:
        restored = limiter.set_limit_w(original)
    if restored is not None:
        raise UserError(
            f"GPU {gpu.index}: the power limit could not be put back to {original:.0f} W ({restored}) "
            f"— set it by hand: nvidia-smi -i {gpu.index} -pl {original:.0f}"
        )
    return _choose(trials, best, original, gpu, objective, min_gain)


def _choose(
    trials: list[ProbeResult],
    best: ProbeResult,
    original: float,
    gpu: GpuStatic,
    objective: Objective,
    min_gain: float,
) -> dict[str, Any]:
    base = score(objective, best.samples_per_s, best.joules_per_sample)
    chosen: ProbeResult | None = None
    chosen_score = base
    for t in trials:
        s = score(objective, t.samples_per_s, t.joules_per_sample) if t.ok else None
        if s is not None and base and s >= (chosen_score or 0) and s / base - 1 >= min_gain:
            chosen, chosen_score = t, s
    out: dict[str, Any] = {
        "ran": True,
        "original_w": original,
        "trials": [t.to_dict() for t in trials],
        "best_w": chosen.candidate.power_limit_w if chosen is not None else original,
    }
    if chosen is not None and chosen.candidate.power_limit_w is not None and base:
        watts = chosen.candidate.power_limit_w
        out["recommendation"] = (
            f"power limit {watts:.0f} W instead of {original:.0f} W: {unit(objective)} "
            f"{100 * ((chosen_score or 0) / base - 1):+.0f} %, samples/s "
            f"{100 * ((chosen.samples_per_s or 0) / (best.samples_per_s or 1) - 1):+.0f} %; "
            "gpuwarden does not change limits for runs — set it with: "
            f"nvidia-smi -i {gpu.index} -pl {watts:.0f}"
        )
    else:
        out["recommendation"] = f"keep the power limit at {original:.0f} W: no lower limit gained enough"
    return out
