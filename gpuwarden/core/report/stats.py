"""Small statistics over series: mean, percentiles (linear interpolation, as numpy's default)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0–100) of `values`, interpolating between order statistics."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    if lo == hi:
        return float(ordered[lo])
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))


def mean(values: Sequence[float]) -> float | None:
    return float(sum(values) / len(values)) if values else None


def distribution(values: Sequence[float]) -> dict[str, Any]:
    """{n, mean, p50, p90, max} of `values` (Nones for an empty sequence)."""
    return {
        "n": len(values),
        "mean": mean(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "max": float(max(values)) if values else None,
    }


def ratio(a: float | None, b: float | None) -> float | None:
    """b / a, None when either is unknown or a is zero."""
    if a is None or b is None or a == 0:
        return None
    return b / a
