"""Which of a program's progress bars is the run's, and which drawings of it are worth recording.

A program may draw several bars: the Trainer draws an evaluation bar below its training bar, a
hand-written loop one bar per epoch. The run's bar is the first one drawn; it stays the run's
while it is unfinished and drawn, so an evaluation does not take its place, and it hands over to
the latest bar once it is finished (an epoch's bar at its total, or a bar that wiped its line as
it closed) or has not been drawn for a minute while others were (a loop that broke out of it).

A bar redraws ten times a second; the record keeps a drawing when the bar moved a hundredth, or a
minute after the last one while it moves, or when another bar became the run's — so a week-long
run records thousands of drawings, not millions, and a display that reads the last one is never
more than a minute or a hundredth behind.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gpuwarden.core.progress_bar import BarReading

RECORD_EVERY_S = 60.0
RECORD_STEP = 0.01
ABANDONED_S = 60.0


def _finished(reading: BarReading) -> bool:
    return reading.erased or (reading.total is not None and reading.n >= reading.total)


@dataclass
class BarFollow:
    """What is known of one attempt's bars: whether the program reports its own progress (then
    no bar is read), how much of each log has been read, the run's bar and what was recorded."""

    own_progress: bool = False
    next_look: float = 0.0
    offsets: dict[str, int] = field(default_factory=dict)
    main: BarReading | None = None
    main_seen_at: float = 0.0
    recorded: BarReading | None = None
    recorded_at: float = 0.0

    def see(self, readings: Iterable[BarReading], now: float) -> None:
        """Drawings read from the logs since the last look, oldest first."""
        for reading in readings:
            main = self.main
            if (
                main is None
                or reading.key == main.key
                or _finished(main)
                or now - self.main_seen_at >= ABANDONED_S
            ):
                self.main, self.main_seen_at = reading, now

    def due(self, now: float, ended: bool = False) -> BarReading | None:
        """The run's bar, if it moved enough since it was last recorded, or at all once the
        program `ended` (its last drawing is what it reached); it then counts as recorded."""
        reading, last = self.main, self.recorded
        if reading is None or reading == last:
            return None
        if last is not None and reading.key == last.key:
            if reading.n == last.n:
                return None
            moved = abs((reading.fraction or 0.0) - (last.fraction or 0.0))
            if moved < RECORD_STEP and now - self.recorded_at < RECORD_EVERY_S and not ended:
                return None
        self.recorded, self.recorded_at = reading, now
        return reading
