"""When a gang is hung: no rank has reported progress for longer than its steps take.

The bound is `max(min_seconds, factor × median step time × stride)`, where the step time comes
from the runners' own timestamps of consecutive progress events (seconds per optimizer step) and
`stride` is the steps between two progress events (`log_interval`). The first `warmup_steps`
steps of the attempt are not timed (loading, compiling, the allocator warming up); until a step
after them has been timed the watchdog is not armed.

Silence is measured on the daemon's clock from when the daemon read each rank's latest progress,
for the rank furthest behind among those that report (a user's script may report from rank 0
only): a rank that stopped leaves the others waiting in a collective, so none of them reports any
more, and a rank that kept going alone would still be caught by the one that stopped. Pure: the
caller feeds events and the time.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from gpuwarden.core.config.spec import RunSpec
from gpuwarden.core.errors import UserError
from gpuwarden.core.oom.policy import HangWatch, resolve_policy


@dataclass(frozen=True)
class Silence:
    """A gang past its bound: how long it has been quiet, the bound, and what it was made of."""

    quiet_s: float
    bound_s: float
    median_step_s: float
    stride: int
    last_steps: dict[int, int]  # rank → its last reported step
    factor: float
    floor_s: float


@dataclass
class StepWatch:
    """The progress of one attempt's ranks, fed as the daemon reads their events."""

    policy: HangWatch
    world_size: int
    first_step: dict[int, int] = field(default_factory=dict)  # rank → first step seen this attempt
    last: dict[int, tuple[int, float]] = field(default_factory=dict)  # rank → (step, runner ts)
    seen_at: dict[int, float] = field(default_factory=dict)  # rank → daemon clock of that read
    step_times: list[float] = field(default_factory=list)  # seconds per step, after the warm-up
    stride: int = 1

    def observe(self, rank: int, step: int, ts: float, now: float) -> None:
        """A progress event of `rank` (its step, its own timestamp), read at `now`."""
        first = self.first_step.setdefault(rank, step)
        previous = self.last.get(rank)
        self.last[rank] = (step, ts)
        self.seen_at[rank] = now
        if previous is None or step <= previous[0]:
            return
        steps = step - previous[0]
        self.stride = steps
        # Only steps that started after the warm-up are timed.
        if previous[0] >= first + self.policy.warmup_steps and ts > previous[1]:
            self.step_times.append((ts - previous[1]) / steps)

    @property
    def armed(self) -> bool:
        return bool(self.step_times)

    def bound(self) -> float | None:
        """Seconds of silence after which the gang is hung; None until armed."""
        if not self.step_times:
            return None
        median = statistics.median(self.step_times)
        return max(self.policy.min_seconds, self.policy.factor * median * self.stride)

    def overdue(self, now: float) -> Silence | None:
        """The silence, when it has passed the bound; None otherwise."""
        bound = self.bound()
        if bound is None:
            return None
        quiet = now - min(self.seen_at.values())
        if quiet <= bound:
            return None
        steps = {rank: step for rank, (step, _) in sorted(self.last.items())}
        median = statistics.median(self.step_times)
        return Silence(quiet, bound, median, self.stride, steps, self.policy.factor, self.policy.min_seconds)


def step_watch(spec: RunSpec, world_size: int) -> StepWatch | None:
    """The watchdog of one attempt of `spec` with `world_size` processes, bounded by the run's
    retune policy's `hang` keys; None for one process (or a policy that no longer loads)."""
    if world_size <= 1:
        return None
    try:
        policy = resolve_policy(spec.policy, kind=spec.kind)
    except UserError:
        return None
    return StepWatch(policy.hang, world_size)
