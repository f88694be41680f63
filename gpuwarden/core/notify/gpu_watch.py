"""GPU conditions worth a message: a GPU a run holds that stays idle, and throttling that lasts.

Fed one tick at a time (on the sampler's thread: it only compares numbers). Each condition is
told once per episode: when it has lasted its bound; it is told again only after it ended.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from gpuwarden.core.telemetry.types import THROTTLE_REASONS, GpuSample

# Below this utilisation (percent) a GPU counts as idle: a data loader's stall is short, a run
# waiting on a dead peer or a debugger sits at 0.
IDLE_UTIL_PCT = 5.0
# Throttling that means heat or a power emergency. `sw_power_cap` is left out: a busy GPU runs at
# its power limit by design, and a message for every busy hour would teach users to ignore them.
LASTING_THROTTLE_MASK = 0x8 | 0x20 | 0x40 | 0x80  # hw_slowdown, sw_thermal, hw_thermal, hw_power_brake


@dataclass(frozen=True)
class GpuCondition:
    """A condition that lasted its bound on one GPU, with the runs that hold the GPU."""

    kind: Literal["idle", "throttled"]
    uuid: str
    since: float
    at: float
    runs: tuple[str, ...]
    reasons: tuple[str, ...] = ()  # throttle reasons seen during the episode

    @property
    def minutes(self) -> float:
        return (self.at - self.since) / 60


@dataclass
class _Episode:
    since: float
    told: bool = False
    mask: int = 0


class GpuWatch:
    """`observe` each tick; returns the conditions that just reached their bound. A bound of 0
    turns that condition off."""

    def __init__(self, idle_s: float, throttle_s: float) -> None:
        self.idle_s = idle_s
        self.throttle_s = throttle_s
        self._idle: dict[str, _Episode] = {}
        self._throttle: dict[str, _Episode] = {}

    def observe(
        self, ts: float, samples: Iterable[GpuSample], holders: Mapping[str, tuple[str, ...]]
    ) -> list[GpuCondition]:
        """`holders`: GPU UUID → the runs whose attempts hold it."""
        out: list[GpuCondition] = []
        for sample in samples:
            runs = holders.get(sample.uuid, ())
            busy = sample.util_gpu
            idle = bool(runs) and not sample.lost and busy is not None and busy < IDLE_UTIL_PCT
            mask = (sample.throttle_reasons or 0) & LASTING_THROTTLE_MASK
            out += self._step("idle", self._idle, self.idle_s, sample.uuid, ts, runs, idle)
            out += self._step("throttled", self._throttle, self.throttle_s, sample.uuid, ts, runs, mask, mask)
        return out

    @staticmethod
    def _step(
        kind: Literal["idle", "throttled"],
        episodes: dict[str, _Episode],
        bound_s: float,
        uuid: str,
        ts: float,
        runs: tuple[str, ...],
        on: bool | int,
        mask: int = 0,
    ) -> list[GpuCondition]:
        if not on or bound_s <= 0:
            episodes.pop(uuid, None)
            return []
        episode = episodes.setdefault(uuid, _Episode(since=ts))
        episode.mask |= mask
        if episode.told or ts - episode.since < bound_s:
            return []
        episode.told = True
        reasons = tuple(name for bit, name in THROTTLE_REASONS.items() if episode.mask & bit)
        return [GpuCondition(kind, uuid, episode.since, ts, runs, reasons)]
