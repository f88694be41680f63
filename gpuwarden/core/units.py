"""Numbers as a person reads them: bytes in KiB/MiB/GiB, durations, energy, and a named field's
value in the unit its name carries. The CLI and the dashboard both print through here, so a
size reads the same in `gpuwarden show` and on the run screen; JSON output stays raw.
"""

from __future__ import annotations

import math

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4

MISSING = "–"  # what a value nobody reported reads as

# Fields that hold bytes wherever they appear: events, reports, allocator readings, probes.
BYTE_FIELDS = frozenset(
    {
        "mem_allocated",
        "mem_reserved",
        "mem_peak",
        "mem_used",
        "mem_total",
        "mem_free",
        "vm_peak",
        "swap_used",
        "peak",
        "requested",
        "reserved",
        "allocated",
        "free",
        "allowed",
        "capacity",
        "total",
        "held_by_others",
        "reserved_unallocated",
        "used_memory",
        "memory_total",
    }
)
# Name endings and the unit they carry (checked in order: the longest first).
_SUFFIX_UNITS: tuple[tuple[str, str], ...] = (
    ("_per_sample_j", " J"),
    ("_per_s", "/s"),
    ("_mhz", " MHz"),
    ("_bps", " B/s"),
    ("_w", " W"),
    ("_c", " °C"),
    ("_j", " J"),
    ("_s", " s"),
)


def size(n: float | None) -> str:
    """Bytes in the largest binary unit that keeps the number above 1: 512 B, 12 KiB, 947 MiB,
    1.6 GiB, 80 GiB. Three significant figures at most, so columns stay narrow."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return MISSING
    value = float(n)
    sign = "-" if value < 0 else ""
    value = abs(value)
    if value < KIB:
        return f"{sign}{value:.0f} B"
    for unit, scale in (("KiB", KIB), ("MiB", MIB), ("GiB", GIB), ("TiB", TIB)):
        scaled = value / scale
        if scaled < 1024 or unit == "TiB":
            return f"{sign}{_short(scaled)} {unit}"
    raise AssertionError("unreachable: TiB ends the loop")


def exact_size(n: float | None) -> str:
    """Bytes a user wrote (a limit): up to four significant figures, so 2.92GiB and 2.923GiB
    read as they were given (`size` would show both as 2.9 GiB)."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return MISSING
    value = abs(float(n))
    for unit, scale in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if value >= scale:
            return f"{'-' if n < 0 else ''}{value / scale:.4g} {unit}"
    return size(n)


def _short(value: float) -> str:
    """1.6, 12.3 → 12, 947: one decimal below 10 only."""
    return f"{value:.1f}" if value < 10 else f"{value:.0f}"


def gib(n: float | None, digits: int = 1) -> str:
    """Bytes as a bare number of GiB, for pairs that share a unit: `mem 3.9/23.5 GiB`."""
    return MISSING if n is None else f"{n / GIB:.{digits}f}"


def num(v: float | None, fmt: str = ".0f", unit: str = "") -> str:
    """A number in `fmt` with its unit, or the missing mark."""
    return MISSING if v is None else f"{v:{fmt}}{unit}"


def duration(seconds: float | None) -> str:
    """Compact duration: 45s, 12m05s, 3h07m, 2d04h."""
    if seconds is None or seconds < 0:
        return MISSING
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def energy(joules: float | None) -> str:
    """1234 J, 12.3 Wh, 4.56 kWh."""
    if joules is None:
        return MISSING
    if joules < 3600:
        return f"{joules:.0f} J"
    wh = joules / 3600
    return f"{wh:.1f} Wh" if wh < 1000 else f"{wh / 1000:.2f} kWh"


def compact(value: object) -> str:
    """A number with four significant figures (integers whole), anything else as text."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:.4g}"


def unit_free(name: str) -> str:
    """A field's name without the unit its value is shown in (`named`): `wall_s` → `wall`,
    `samples_per_s` → `samples/s` (its value then bare), so a line never says the unit twice."""
    if name.endswith("_per_s"):
        return f"{name.removesuffix('_per_s')}/s"
    if name.endswith("_bytes") and len(name) > len("_bytes"):
        return name.removesuffix("_bytes")
    for suffix, _ in _SUFFIX_UNITS:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name.removesuffix(suffix)
    return name


def named(name: str, value: object) -> str:
    """`value` of the field called `name` in the unit the name carries: bytes for memory
    fields (mem_peak 947 MiB), W for *_w, °C for *_c, % for *_pct … and plain otherwise."""
    if value is None:
        return MISSING
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if name in BYTE_FIELDS or name.endswith("_bytes"):
        return size(value)
    if name.startswith("util_") or name.endswith(("_pct", "_percent")):
        return f"{_short(value)} %"
    for suffix, unit in _SUFFIX_UNITS:
        if name.endswith(suffix):
            return f"{compact(value)}{unit}"
    return compact(value)
