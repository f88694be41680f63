"""How far a program has come, read from the progress bar it draws.

Most training scripts report nothing to gpuwarden, yet nearly all of them draw a tqdm bar (their
own loop's, the Trainer's, Lightning's, accelerate's): `train:  30%|███  | 12/40 [00:03<00:07,
3.92it/s, loss=0.5]`. Its last drawing in the attempt's log says what the program's own terminal
says: how many of how many, at what rate, and how long tqdm expects the rest to take. The format
read is tqdm's default (`{l_bar}{bar}{r_bar}`, and `{n}{unit} [{elapsed}, {rate}]` without a
total), with its `unit_scale` suffixes and its `s/it` form of slow rates.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from gpuwarden.core.terminal_text import ESCAPES
from gpuwarden.core.units import duration

# Possessive, and a number starts where no digit precedes it: a line of digits costs linear time.
_NUMBER = r"(?<![\d.])\d++(?:\.\d++)?[kMGTPEZY]?"
_CLOCK = r"\d++(?::\d\d)++"
_WITH_TOTAL = re.compile(
    rf"(?P<n>{_NUMBER})/(?P<total>{_NUMBER}) \[(?P<elapsed>{_CLOCK})<(?P<remaining>{_CLOCK}|\?)"
    r"(?:, *(?P<rate>[^,\]]*+))?"
)
# Without a total tqdm always writes the rate: a timestamp in brackets (`step 5 [10:22]`) is no bar.
_RATE = r"(?:\d++(?:\.\d++)?|\?)[^,\]\s]*/s|\d++(?:\.\d++)?s/[^,\]\s]+"
_NO_TOTAL = re.compile(rf"(?P<n>{_NUMBER})(?P<unit>[^\W\d]\w*+)? \[(?P<elapsed>{_CLOCK}), *(?P<rate>{_RATE})")
_PER_SECOND = re.compile(r"^(?P<value>\d+(?:\.\d+)?|\?)(?P<unit>.+)/s$")
_SECONDS_PER = re.compile(r"^(?P<value>\d+(?:\.\d+)?)s/(?P<unit>.+)$")
_PERCENT = re.compile(r"\s*\d+%\|[^|]*\|\s*$")
_SCALE = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18, "Z": 1e21, "Y": 1e24}
_EPOCH = re.compile(r"\bepoch\b", re.IGNORECASE)
_SEGMENTS = re.compile(r"[^\r\n]+")
# A drawing is one terminal line (tqdm fits it to the terminal's width, 80 cells without one);
# a longer line is the program's own output, and scanning it could cost quadratic time.
LONGEST_DRAWING = 2000
DESC_CELLS = 200


@dataclass(frozen=True)
class BarReading:
    """One drawing of a bar: `n` of `total` (None: the bar has no total) `unit`s, at `rate` a
    second (None: not yet known), `remaining_s` left by tqdm's own estimate."""

    desc: str
    n: float
    total: float | None
    unit: str
    rate: float | None
    elapsed_s: float
    remaining_s: float | None
    erased: bool = False  # then wiped from its line (tqdm's `leave=False`): that bar is over

    @property
    def key(self) -> tuple[str, float | None]:
        """Which bar it is: a program that draws several (training, then evaluation) draws each
        with its own description or total."""
        return (self.desc, self.total)

    @property
    def fraction(self) -> float | None:
        """How far the bar has come, 0 to 1 (None: it has no total)."""
        if not self.total:
            return None
        return max(0.0, min(1.0, self.n / self.total))

    @property
    def counts_an_epoch(self) -> bool:
        """A bar named for an epoch ("Epoch 3", as Lightning's and most hand-written loops draw
        it) starts again each epoch: its end is the epoch's, not the run's."""
        return bool(_EPOCH.search(self.desc))


def _scaled(text: str) -> float:
    suffix = "" if text[-1].isdigit() else text[-1]
    return float(text[: len(text) - len(suffix)]) * _SCALE[suffix]


def _seconds(clock: str | None) -> float | None:
    if clock is None or clock == "?":
        return None
    seconds = 0.0
    for part in clock.split(":"):
        seconds = seconds * 60 + int(part)
    return seconds


def _rate(text: str | None) -> tuple[float | None, str]:
    """`3.92it/s` → (3.92, "it"); `1.50s/it` → (0.667, "it"); `?it/s` → (None, "it")."""
    text = (text or "").strip()
    slow = _SECONDS_PER.match(text)
    if slow:
        value = float(slow["value"])
        return (1 / value if value > 0 else None), slow["unit"]
    fast = _PER_SECOND.match(text)
    if not fast:
        return None, "it"
    unit = fast["unit"]
    if fast["value"] == "?":
        return None, unit
    scale = unit[0] if len(unit) > 1 and unit[0] in _SCALE else ""
    return float(fast["value"]) * _SCALE[scale], unit[len(scale) :]


def _desc(before: str) -> str:
    """The description tqdm writes before the bar (`train: ` and the percentage and bar)."""
    return _PERCENT.sub("", before).strip().removesuffix(":").strip()


def _reading(segment: str) -> BarReading | None:
    """The bar drawn in one line's segment, if it holds one."""
    found = list(_WITH_TOTAL.finditer(segment))
    if found:
        m = found[-1]
        rate, unit = _rate(m["rate"])
        return BarReading(
            desc=_desc(segment[max(0, m.start() - DESC_CELLS) : m.start()]),
            n=_scaled(m["n"]),
            total=_scaled(m["total"]),
            unit=unit,
            rate=rate,
            elapsed_s=_seconds(m["elapsed"]) or 0.0,
            remaining_s=_seconds(m["remaining"]),
        )
    loose = list(_NO_TOTAL.finditer(segment))
    if not loose:
        return None
    m = loose[-1]
    rate, unit = _rate(m["rate"])
    return BarReading(
        desc=_desc(segment[max(0, m.start() - DESC_CELLS) : m.start()]),
        n=_scaled(m["n"]),
        total=None,
        unit=m["unit"] or unit,
        rate=rate,
        elapsed_s=_seconds(m["elapsed"]) or 0.0,
        remaining_s=None,
    )


def bar_readings(text: str) -> list[BarReading]:
    """Every drawing of a bar in `text` (a log's tail, escape sequences and all), oldest first."""
    readings: list[BarReading] = []
    after_drawing = False  # the last segment was a drawing
    for segment in _SEGMENTS.findall(ESCAPES.sub("", text)):
        if after_drawing and not segment.strip():
            readings[-1] = replace(readings[-1], erased=True)  # tqdm's `leave=False` wipes its line
        reading = _reading(segment) if len(segment) <= LONGEST_DRAWING else None
        if reading is not None:
            readings.append(reading)
        after_drawing = reading is not None
    return readings


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def bar_payload(reading: BarReading) -> dict[str, object]:
    """A drawing as a `progress_bar` event's fields (`bar_total`: an allocator's `total` is bytes)."""
    return {
        "desc": reading.desc,
        "n": reading.n,
        "bar_total": reading.total,
        "unit": reading.unit,
        "rate": reading.rate,
        "remaining_s": reading.remaining_s,
        "elapsed_s": reading.elapsed_s,
    }


def recorded_bar(fields: Mapping[str, object]) -> BarReading | None:
    """The drawing a `progress_bar` event recorded (None: fields that are not one)."""
    n = _number(fields.get("n"))
    if n is None:
        return None
    return BarReading(
        desc=str(fields.get("desc") or ""),
        n=n,
        total=_number(fields.get("bar_total")),
        unit=str(fields.get("unit") or "it"),
        rate=_number(fields.get("rate")),
        elapsed_s=_number(fields.get("elapsed_s")) or 0.0,
        remaining_s=_number(fields.get("remaining_s")),
    )


def _count(value: float) -> str:
    return f"{value:.0f}" if value == int(value) else f"{value:.4g}"


def bar_sentence(reading: BarReading) -> str:
    """`train: 12/40 it (30 %), 3.92 it/s, 7s left`; an epoch's bar says so, since its end is
    not the run's."""
    whose = f"{reading.desc}: " if reading.desc else ""
    count = f"{_count(reading.n)}/{_count(reading.total)}" if reading.total else _count(reading.n)
    parts = [f"{whose}{count} {reading.unit}"]
    if reading.fraction is not None:
        parts[0] += f" ({100 * reading.fraction:.0f} %{' of the epoch' if reading.counts_an_epoch else ''})"
    if reading.rate:  # a slow one as tqdm writes it: 3.5 s/it reads better than 0.286 it/s
        rate = reading.rate
        parts.append(f"{rate:.3g} {reading.unit}/s" if rate >= 1 else f"{1 / rate:.3g} s/{reading.unit}")
    if reading.remaining_s is not None and reading.fraction is not None and reading.fraction < 1:
        where = " in the epoch" if reading.counts_an_epoch else ""
        parts.append(f"{duration(reading.remaining_s)} left{where}")
    return ", ".join(parts)
