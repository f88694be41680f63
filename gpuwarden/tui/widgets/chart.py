"""A time-series chart drawn with the Line API: a filled area in braille dots.

Why not plotext: over SSH every repaint is bytes on the wire. This widget keeps a bounded deque of
values, packs two samples into each character cell (a braille cell is 2 dots wide and 4 tall), and
renders each line on demand from a cache that is rebuilt only when the data, the size or the cursor
change — so a 1 Hz tick costs one small redraw of a few lines, not a full-screen plot.

`render_line()` needs no running app (the size comes from the constructor until the widget is
resized), which lets the tests check the drawing directly.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

from rich.segment import Segment
from rich.style import Style
from textual.events import Resize
from textual.strip import Strip
from textual.widget import Widget

# Dot bits of a braille cell, by dot row from the top (0..3): (left column, right column).
_DOTS: tuple[tuple[int, int], ...] = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))
_BRAILLE_BASE = 0x2800
DOTS_PER_ROW = 4
SAMPLES_PER_CELL = 2


def column_levels(values: list[float | None], height: int, vmin: float, vmax: float) -> list[int]:
    """Dot height of each value on a `height`-row chart; -1 for a missing value.

    A present value is at least one dot tall, so "zero" and "no reading" look different.
    """
    top = height * DOTS_PER_ROW
    span = vmax - vmin
    levels: list[int] = []
    for v in values:
        if v is None or math.isnan(v):
            levels.append(-1)
            continue
        fraction = 0.0 if span <= 0 else (v - vmin) / span
        levels.append(max(1, min(top, round(fraction * top))))
    return levels


def braille_row(levels: list[int], row_from_bottom: int) -> str:
    """One text row: cell i draws levels[2i] (left dots) and levels[2i+1] (right dots)."""
    base = row_from_bottom * DOTS_PER_ROW
    chars: list[str] = []
    for i in range(0, len(levels), SAMPLES_PER_CELL):
        code = 0
        for side, level in enumerate(levels[i : i + SAMPLES_PER_CELL]):
            filled = max(0, min(DOTS_PER_ROW, level - base))
            # Fill from the bottom dot row of the cell upwards.
            for dot_row in range(DOTS_PER_ROW - filled, DOTS_PER_ROW):
                code |= _DOTS[dot_row][side]
        chars.append(chr(_BRAILLE_BASE + code) if code else " ")
    return "".join(chars)


def resample(values: list[float | None], slots: int) -> list[float | None]:
    """`values` over exactly `slots` columns: the largest value of each bucket when squeezing
    (a peak must not vanish), the nearest value when stretching."""
    n = len(values)
    if n == slots:
        return values
    out: list[float | None] = []
    for k in range(slots):
        lo = k * n // slots
        hi = max(lo + 1, (k + 1) * n // slots)
        bucket = [v for v in values[lo:hi] if v is not None]
        out.append(max(bucket) if bucket else None)
    return out


class Chart(Widget):
    """A bounded series drawn right-aligned (newest at the right edge), with an optional cursor."""

    DEFAULT_CSS = """
    Chart {
        height: 3;
        width: 1fr;
    }
    """

    def __init__(
        self,
        capacity: int = 600,
        *,
        width: int = 40,
        height: int = 3,
        vmin: float = 0.0,
        vmax: float | None = None,
        style: Style | str = "green",
        fit: bool = False,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.values: deque[float | None] = deque(maxlen=capacity)
        self.plot_width = width
        self.plot_height = height
        self.vmin = vmin
        self.vmax = vmax  # None: scale to the largest visible value
        self.area_style = Style.parse(style) if isinstance(style, str) else style
        self.cursor_style = self.area_style + Style(reverse=True)
        self.cursor: int | None = None  # index into `values`, or None for no cursor
        # fit=True stretches or squeezes the whole series over the width (a finished run's
        # metrics); otherwise the newest values sit at the right edge (a live feed).
        self.fit = fit
        self._strips: list[Strip] | None = None

    # -- data -------------------------------------------------------------------------------

    def push(self, value: float | None) -> None:
        """Append one sample (the oldest falls off when full) and schedule a redraw."""
        self.values.append(value)
        self._changed()

    def extend(self, values: Iterable[float | None]) -> None:
        self.values.extend(values)
        self._changed()

    def replace(self, values: Iterable[float | None]) -> None:
        """Swap the whole series (a new history window, a new metric)."""
        self.values.clear()
        self.values.extend(values)
        if self.cursor is not None:
            self.cursor = min(self.cursor, len(self.values) - 1) if self.values else None
        self._changed()

    def set_range(self, vmin: float, vmax: float | None) -> None:
        if (vmin, vmax) != (self.vmin, self.vmax):
            self.vmin, self.vmax = vmin, vmax
            self._changed()

    def set_cursor(self, index: int | None) -> None:
        if index is not None:
            index = max(0, min(len(self.values) - 1, index)) if self.values else None
        if index != self.cursor:
            self.cursor = index
            self._changed()

    def visible_count(self) -> int:
        return min(len(self.values), self.plot_width * SAMPLES_PER_CELL)

    def _changed(self) -> None:
        self._strips = None
        self.refresh()

    # -- drawing ----------------------------------------------------------------------------

    def on_resize(self, event: Resize) -> None:
        self.plot_width, self.plot_height = event.size.width, event.size.height
        self._changed()

    def _visible(self) -> tuple[list[float | None], int]:
        """The values that fit, left-padded with None, and the index of the first one in `values`."""
        slots = self.plot_width * SAMPLES_PER_CELL
        n = len(self.values)
        if self.fit and n:
            return resample(list(self.values), slots), 0
        first = max(0, n - slots)
        shown: list[float | None] = [self.values[i] for i in range(first, n)]
        return [None] * (slots - len(shown)) + shown, first - (slots - len(shown))

    def _build(self) -> list[Strip]:
        width, height = self.plot_width, self.plot_height
        if width <= 0 or height <= 0:
            return []
        shown, offset = self._visible()
        top = self.vmax
        if top is None:
            present = [v for v in shown if v is not None]
            top = max(present, default=0.0) or 1.0
        levels = column_levels(shown, height, self.vmin, top)
        cursor_cell = None
        if self.cursor is not None and self.cursor >= offset:
            cursor_cell = (self.cursor - offset) // SAMPLES_PER_CELL
        strips: list[Strip] = []
        for y in range(height):
            text = braille_row(levels, height - 1 - y)
            if cursor_cell is None or not 0 <= cursor_cell < width:
                strips.append(Strip([Segment(text, self.area_style)], width))
                continue
            # The cursor column is drawn reversed; a blank cell shows as a solid bar.
            cell = text[cursor_cell] if text[cursor_cell] != " " else "\u2800"
            strips.append(
                Strip(
                    [
                        Segment(text[:cursor_cell], self.area_style),
                        Segment(cell, self.cursor_style),
                        Segment(text[cursor_cell + 1 :], self.area_style),
                    ],
                    width,
                )
            )
        return strips

    def render_line(self, y: int) -> Strip:
        if self._strips is None:
            self._strips = self._build()
        if 0 <= y < len(self._strips):
            return self._strips[y]
        return Strip.blank(self.plot_width)
