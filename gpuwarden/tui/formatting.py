"""The dashboard's own renderings: text bars, clock times, run progress. Sizes, durations and
units come from `gpuwarden.core.units`, shared with the CLI."""

from __future__ import annotations

import time

from rich.text import Text

from gpuwarden.core.units import named
from gpuwarden.tui.backend import RunRow


def clock(ts: float | None, with_date: bool = False) -> str:
    """Local wall-clock time of `ts`."""
    if ts is None:
        return "–"
    return time.strftime("%m-%d %H:%M:%S" if with_date else "%H:%M:%S", time.localtime(ts))


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


def cut(text: str, width: int) -> str:
    """`text` in at most `width` cells, an ellipsis marking what was cut."""
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def first_that_fit(parts: list[Text], width: int, gap: str = "  ") -> Text:
    """The leading parts that fit in `width` (the first always): the least needed come last."""
    line = parts[0].copy()
    for part in parts[1:]:
        if line.cell_len + len(gap) + part.cell_len > width:
            break
        line.append(gap)
        line.append_text(part)
    return line


def evidence_lines(value: object, name: str = "", depth: int = 0) -> list[str]:
    """A retune's evidence as indented `key: value` lines, each number in the unit its key
    carries (`requested: 2.0 GiB`, `wall_s: 1.2 s`): raw JSON showed byte counts nobody reads."""
    pad = "  " * depth
    if isinstance(value, dict):
        lines: list[str] = []
        for key, item in value.items():
            if isinstance(item, dict | list) and item:
                lines += [f"{pad}{key}:", *evidence_lines(item, str(key), depth + 1)]
            else:
                lines += [f"{pad}{key}: {_evidence_value(str(key), item)}"]
        return lines
    if isinstance(value, list):
        lines = []
        for item in value:
            inner = evidence_lines(item, name, depth + 1)
            lines += [f"{pad}- {inner[0].lstrip()}", *inner[1:]] if inner else [f"{pad}-"]
        return lines
    return [f"{pad}{_evidence_value(name, value)}"]


def _evidence_value(name: str, value: object) -> str:
    if value is None:
        return "none"
    if isinstance(value, dict | list):
        return "{}" if isinstance(value, dict) else "[]"
    return named(name, value)
