"""A time-series chart drawn with the Line API: a filled area in braille dots.

Why not plotext: over SSH every repaint is bytes on the wire. This widget keeps a bounded deque of
values, packs two samples into each character cell (a braille cell is 2 dots wide and 4 tall), and
renders each line on demand from a cache that is rebuilt only when the data, the size or the cursor
change — so a 1 Hz tick costs one small redraw of a few lines, not a full-screen plot.

Optionally the chart has axes: a left gutter with the top and bottom values, a bottom line with
labels at given positions (steps, times), and a limit drawn as a dotted red line (a card's
memory). `render_line()` needs no running app (the size comes from the constructor until the
widget is resized), which lets the tests check the drawing directly.
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


def braille_row(levels: list[int], row_from_bottom: int, *, line: bool = False) -> str:
    """One text row: cell i draws levels[2i] (left dots) and levels[2i+1] (right dots), filled
    below the level, or with `line` only the dot at the level."""
    base = row_from_bottom * DOTS_PER_ROW
    chars: list[str] = []
    for i in range(0, len(levels), SAMPLES_PER_CELL):
        code = 0
        for side, level in enumerate(levels[i : i + SAMPLES_PER_CELL]):
            filled = max(0, min(DOTS_PER_ROW, level - base))
            if line:
                if 0 < level - base <= DOTS_PER_ROW:
                    code |= _DOTS[DOTS_PER_ROW - filled][side]
                continue
            # Fill from the bottom dot row of the cell upwards.
            for dot_row in range(DOTS_PER_ROW - filled, DOTS_PER_ROW):
                code |= _DOTS[dot_row][side]
        chars.append(chr(_BRAILLE_BASE + code) if code else " ")
    return "".join(chars)


def pinned_at_top(levels: list[int], height: int) -> bool:
    """Every present level at the top of a chart of several rows (a card busy at 100 %, memory
    full). A one-row chart is a sparkline, where a full cell reads as full."""
    present = [level for level in levels if level >= 0]
    return height > 1 and bool(present) and all(level == height * DOTS_PER_ROW for level in present)


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


def limit_row(levels: list[int], limit: int, row_from_bottom: int) -> list[bool]:
    """Per cell of a row: whether the limit's dot row lies in it above the data (drawn there)."""
    base = row_from_bottom * DOTS_PER_ROW
    if not base < limit <= base + DOTS_PER_ROW:
        return [False] * ((len(levels) + 1) // SAMPLES_PER_CELL)
    return [
        max(levels[i : i + SAMPLES_PER_CELL], default=-1) < limit
        for i in range(0, len(levels), SAMPLES_PER_CELL)
    ]


def _limit_char(limit: int, row_from_bottom: int) -> str:
    """Both dots of the limit's dot row in one cell."""
    dot_row = DOTS_PER_ROW - (limit - row_from_bottom * DOTS_PER_ROW)
    left, right = _DOTS[dot_row]
    return chr(_BRAILLE_BASE + (left | right))


def place_labels(labels: list[tuple[float, str]], width: int) -> str:
    """A line `width` cells wide with each label at its fraction (0 left … 1 right), never
    overlapping: a label that would cover another is left out."""
    line = [" "] * width
    taken = [False] * width
    for fraction, label in labels:
        if not label or len(label) > width:
            continue
        pos = round(max(0.0, min(1.0, fraction)) * (width - 1))
        start = max(0, min(width - len(label), pos - len(label) // 2))
        span = range(max(0, start - 1), min(width, start + len(label) + 1))
        if any(taken[i] for i in span):
            continue
        for i, ch in enumerate(label):
            line[start + i] = ch
        for i in span:
            taken[i] = True
    return "".join(line)


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
        y_gutter: int = 0,
        axis: bool = False,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.values: deque[float | None] = deque(maxlen=capacity)
        self.y_gutter = y_gutter  # cells at the left for the top and bottom values
        self.axis = axis  # a last line with x labels
        self.plot_width = max(0, width - y_gutter)
        self.plot_height = max(0, height - (1 if axis else 0))
        self.y_labels: tuple[str, str] = ("", "")
        self.x_labels: list[tuple[float, str]] = []
        self.limit: float | None = None
        self.limit_style = Style.parse("red")
        self.axis_style = Style.parse("dim")
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

    def set_axes(
        self,
        y_labels: tuple[str, str] = ("", ""),
        x_labels: list[tuple[float, str]] | None = None,
        limit: float | None = None,
    ) -> None:
        """The y_gutter's top and bottom labels, the x labels (fraction, text) and the limit line."""
        x = list(x_labels or [])
        if (y_labels, x, limit) != (self.y_labels, self.x_labels, self.limit):
            self.y_labels, self.x_labels, self.limit = y_labels, x, limit
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
        self.plot_width = max(0, event.size.width - self.y_gutter)
        self.plot_height = max(0, event.size.height - (1 if self.axis else 0))
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
        top = self._top(shown)
        levels = column_levels(shown, height, self.vmin, top)
        limit = self._limit_level(top, height)
        cursor_cell = self._cursor_cell(offset, width)
        # A series pinned at the top filled below would be a solid block with no edge, which
        # reads as a rendering fault rather than "100 % all along": draw it as a line at the top
        # instead. Only then: a fill reads better than a line for any series that moves.
        as_line = pinned_at_top(levels, height)
        strips: list[Strip] = []
        for y in range(height):
            text, styles = self._row(levels, height - 1 - y, width, limit, cursor_cell, as_line)
            strips.append(Strip(self._y_gutter(y) + _runs(text, styles), width + self.y_gutter))
        if self.axis:
            line = " " * self.y_gutter + place_labels(self.x_labels, width)
            strips.append(Strip([Segment(line, self.axis_style)], width + self.y_gutter))
        return strips

    def _top(self, shown: list[float | None]) -> float:
        """The value at the top row: the fixed maximum, else the largest shown (1 when all are 0)."""
        if self.vmax is not None:
            return self.vmax
        present = [v for v in shown if v is not None]
        return max(present, default=0.0) or 1.0

    def _limit_level(self, top: float, height: int) -> int | None:
        """The limit line's height in braille dots, or None when it lies outside the scale."""
        if self.limit is None or not (top > self.vmin and self.vmin <= self.limit <= top):
            return None
        return max(1, round((self.limit - self.vmin) / (top - self.vmin) * height * DOTS_PER_ROW))

    def _cursor_cell(self, offset: int, width: int) -> int | None:
        """The cursor's column when its sample is on screen."""
        if self.cursor is None or self.cursor < offset:
            return None
        cell = (self.cursor - offset) // SAMPLES_PER_CELL
        return cell if cell < width else None

    def _row(
        self,
        levels: list[int],
        row: int,
        width: int,
        limit: int | None,
        cursor_cell: int | None,
        line: bool = False,
    ) -> tuple[str, list[Style]]:
        """One text row (0 = bottom) and a style per cell."""
        text = braille_row(levels, row, line=line)
        styles = [self.area_style] * width
        if limit is not None:
            cells = list(text)
            for i, above in enumerate(limit_row(levels, limit, row)):
                if above and i < width:
                    cells[i] = _limit_char(limit, row)
                    styles[i] = self.limit_style
            text = "".join(cells)
        if cursor_cell is not None:
            # The cursor column is drawn reversed; a blank cell shows as a solid bar.
            if text[cursor_cell] == " ":
                text = text[:cursor_cell] + "\u2800" + text[cursor_cell + 1 :]
            styles[cursor_cell] = self.cursor_style
        return text, styles

    def _y_gutter(self, y: int) -> list[Segment]:
        if not self.y_gutter:
            return []
        label = self.y_labels[0] if y == 0 else self.y_labels[1] if y == self.plot_height - 1 else ""
        text = label[: self.y_gutter - 1].rjust(self.y_gutter - 1) + ("┤" if label else "│")
        return [Segment(text, self.axis_style)]

    def render_line(self, y: int) -> Strip:
        if self._strips is None:
            self._strips = self._build()
        if 0 <= y < len(self._strips):
            return self._strips[y]
        return Strip.blank(self.plot_width + self.y_gutter)


def _runs(text: str, styles: list[Style]) -> list[Segment]:
    """Segments of `text`, one per run of equal style (a row is mostly one style)."""
    segments: list[Segment] = []
    start = 0
    for i in range(1, len(text) + 1):
        if i == len(text) or styles[i] != styles[start]:
            segments.append(Segment(text[start:i], styles[start]))
            start = i
    return segments
