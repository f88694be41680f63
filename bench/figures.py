"""Repeated measurements: every figure is the median of at least three repetitions, with its spread.

One reading on a shared machine says little (the training runner read 0.81 × the hand-tuned loop
once and 1.04 / 0.96 / 1.02 × after), so each benchmark measures `REPEATS` times (interleaving
the things it compares), reports the median with the lowest and highest reading, and checks its
target on the median. Rows that only inform carry no target and no verdict.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


def _repeats() -> int:
    """`BENCH_REPEATS` (at least 3, the default)."""
    try:
        return max(3, int(os.environ.get("BENCH_REPEATS", "3")))
    except ValueError:
        return 3


REPEATS = _repeats()


@dataclass(frozen=True)
class Figure:
    """Readings of one quantity and their summary."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    @property
    def spread_pct(self) -> float | None:
        """(highest − lowest) / median, in %."""
        m = self.median
        return 100.0 * (self.high - self.low) / abs(m) if m else None


def figure_row(
    name: str,
    values: Sequence[float],
    unit: str,
    *,
    target: str = "",
    check: Callable[[float], bool] | None = None,
) -> dict[str, Any]:
    """A table row: the median of `values`, its range, and `check(median)` when there is a target
    (ok is None for rows that only inform)."""
    if len(values) < 3:
        raise ValueError(f"{name}: {len(values)} reading(s) — a figure needs at least three")
    f = Figure(tuple(float(v) for v in values))
    return {
        "benchmark": name,
        "value": f.median,
        "low": f.low,
        "high": f.high,
        "n": len(f.values),
        "spread_pct": f.spread_pct,
        "values": list(f.values),
        "unit": unit,
        "target": target,
        "ok": check(f.median) if check is not None else None,
    }


def paired_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """Ratios of readings taken side by side (repetition by repetition), so that a busy moment
    of the machine weighs on both sides of the same ratio."""
    return [a / b for a, b in zip(numerators, denominators, strict=True) if b]


def verdict(ok: object) -> str:
    """yes / NO for rows with a target; "-" for rows that only inform (ok is None)."""
    return "-" if ok is None else ("yes" if ok else "NO")


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def spread_text(row: dict[str, Any]) -> str:
    """ "low–high (n=3)" for repeated rows, "" otherwise."""
    if "low" not in row:
        return ""
    return f"{fmt(row['low'])}–{fmt(row['high'])} (n={row['n']})"


def table(rows: list[dict[str, Any]], with_module: bool = True) -> str:
    """The rows as an aligned text table: median, range, unit, target, verdict."""
    headers = (["module"] if with_module else []) + ["benchmark", "median", "range", "unit", "target", "ok"]
    lines = []
    for r in rows:
        cells = [r.get("module", "")] if with_module else []
        cells += [
            str(r["benchmark"]),
            fmt(r.get("value", "")),
            spread_text(r),
            str(r.get("unit", "")),
            str(r.get("target") or ""),
            verdict(r.get("ok")),
        ]
        lines.append(cells)
    widths = [max(len(h), *(len(c[i]) for c in lines)) if lines else len(h) for i, h in enumerate(headers)]
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) for cells in lines]
    return "\n".join(out)


def main_for(run: Callable[[], list[dict[str, Any]]]) -> int:
    """`python -m bench.bench_x`: run one module, print its table; 1 when a target is missed."""
    rows = run()
    print(table(rows, with_module=False))
    return 1 if any(r.get("ok") is False for r in rows) else 0
