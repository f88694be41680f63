"""At most N messages per run in any M minutes; what is held back is counted and folded into one
"and K more" line: in the run's next message that passes, or in a summary of its own once the
window has room again. A run's end (succeeded, failed) is never held back: it is the message a
user waits for, and it carries what was held back before it."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

# Events that end a run: sent whatever the rate, so a flood of restarts never hides the failure.
ALWAYS_SENT = frozenset({"succeeded", "failed"})


@dataclass
class _RunWindow:
    sent: deque[float] = field(default_factory=deque)  # when each message in the window went
    held: Counter[str] = field(default_factory=Counter)  # held back since the last one: event → count


@dataclass(frozen=True)
class Held:
    """What was held back for a run since its last message."""

    run_id: str
    counts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def kinds(self) -> str:
        return ", ".join(f"{event} ×{n}" for event, n in sorted(self.counts.items()))

    def line(self) -> str:
        return f"and {self.total} more held back by the rate limit: {self.kinds()}"


class RateLimit:
    """Per-run sliding window on an injected time (`now` is passed in: tests use a fake clock)."""

    def __init__(self, limit: int, window_s: float) -> None:
        self.limit = limit
        self.window_s = window_s
        self._runs: dict[str, _RunWindow] = {}

    def admit(self, run_id: str, event: str, now: float) -> tuple[bool, Held | None]:
        """Whether to send this message now (else it is held back and counted), and what was
        held back before it, to add to it as an "and K more" line."""
        window = self._runs.setdefault(run_id, _RunWindow())
        self._expire(window, now)
        if len(window.sent) >= self.limit and event not in ALWAYS_SENT:
            window.held[event] += 1
            return False, None
        window.sent.append(now)
        return True, self._take_held(run_id, window)

    def due(self, now: float) -> list[Held]:
        """Runs with messages held back whose window has room again: each gets one summary
        (counted as a message of the run)."""
        out: list[Held] = []
        for run_id, window in list(self._runs.items()):
            self._expire(window, now)
            if window.held and len(window.sent) < self.limit:
                window.sent.append(now)
                held = self._take_held(run_id, window)
                if held is not None:
                    out.append(held)
            elif not window.sent and not window.held:
                del self._runs[run_id]  # nothing to remember: bounded by the live runs
        return out

    @property
    def held(self) -> int:
        """Messages held back now, over every run."""
        return sum(sum(window.held.values()) for window in list(self._runs.values()))

    @property
    def tracked(self) -> int:
        """Runs the limiter remembers (tests check it forgets quiet ones)."""
        return len(self._runs)

    def _expire(self, window: _RunWindow, now: float) -> None:
        while window.sent and window.sent[0] <= now - self.window_s:
            window.sent.popleft()

    @staticmethod
    def _take_held(run_id: str, window: _RunWindow) -> Held | None:
        if not window.held:
            return None
        held = Held(run_id, dict(window.held))
        window.held.clear()
        return held
