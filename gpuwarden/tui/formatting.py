"""Short, fixed-width renderings of numbers for an 80-column terminal."""

from __future__ import annotations

import time

from gpuwarden.tui.backend import RunRow

GIB = 1024**3
MIB = 1024**2


def gib(n: float | None, digits: int = 1) -> str:
    return "–" if n is None else f"{n / GIB:.{digits}f}"


def size(n: float | None) -> str:
    """Bytes as MiB below 1 GiB, else GiB: process memory spans both."""
    if n is None:
        return "–"
    if n < GIB:
        return f"{n / MIB:.0f} MiB"
    return f"{n / GIB:.1f} GiB"


def num(v: float | None, fmt: str = ".0f", unit: str = "") -> str:
    return "–" if v is None else f"{v:{fmt}}{unit}"


def duration(seconds: float | None) -> str:
    """Compact duration: 45s, 12m05s, 3h07m, 2d04h."""
    if seconds is None or seconds < 0:
        return "–"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def clock(ts: float | None, with_date: bool = False) -> str:
    """Local wall-clock time of `ts`."""
    if ts is None:
        return "–"
    return time.strftime("%m-%d %H:%M:%S" if with_date else "%H:%M:%S", time.localtime(ts))


def energy(joules: float) -> str:
    if joules < 3600:
        return f"{joules:.0f} J"
    wh = joules / 3600
    return f"{wh:.1f} Wh" if wh < 1000 else f"{wh / 1000:.2f} kWh"


def progress_fraction(run: RunRow) -> float | None:
    if run.samples_seen is None or not run.total:
        return None
    return max(0.0, min(1.0, run.samples_seen / run.total))


def eta_seconds(run: RunRow) -> float | None:
    """Time left at the current throughput; None when unknown or not running."""
    if run.state != "running" or run.samples_seen is None or not run.total or not run.samples_per_s:
        return None
    return max(0.0, (run.total - run.samples_seen) / run.samples_per_s)


def bar(fraction: float | None, width: int) -> str:
    """A text bar with eighth-cell resolution; blank when unknown."""
    if fraction is None or width <= 0:
        return " " * max(width, 0)
    fraction = max(0.0, min(1.0, fraction))
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    partial = " ▏▎▍▌▋▊▉"[part] if part and full < width else ""
    return ("█" * full + partial).ljust(width)
