"""`gpuwarden compare A B`: two reports side by side with B/A ratios (a before/after of one change)."""

from __future__ import annotations

from typing import Any

from gpuwarden.core.report.stats import ratio

# (row name, path into a report, unit, True when higher is better)
ROWS: tuple[tuple[str, tuple[str, ...], str, bool], ...] = (
    ("samples_per_s", ("throughput", "samples_per_s"), "/s", True),
    ("samples_per_s_wall", ("throughput", "samples_per_s_wall"), "/s", True),
    ("tokens_per_s", ("throughput", "tokens_per_s"), "/s", True),
    ("power_mean_w", ("power", "mean_w"), "W", False),
    ("power_pct_of_limit", ("power", "mean_pct"), "%", False),
    ("util_mean_pct", ("utilisation", "mean"), "%", True),
    ("memory_peak_bytes", ("memory", "peak"), "B", False),
    ("energy_per_sample_j", ("energy", "per_sample_j"), "J", False),
    ("samples_per_kwh", ("energy", "samples_per_kwh"), "/kWh", True),
    ("wall_s", ("wall_s",), "s", False),
)


def _get(report: dict[str, Any], path: tuple[str, ...]) -> float | None:
    if path == ("memory", "peak"):
        mem = report.get("memory") or {}
        value = mem.get("gpu_used_peak_bytes")
        return float(value) if value is not None else _get(report, ("memory", "runner_peak_bytes"))
    node: Any = report
    for part in path:
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return float(node) if isinstance(node, int | float) and not isinstance(node, bool) else None


def compare_reports(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """{a, b: run identities, rows: [{metric, a, b, ratio, unit, higher_is_better}], notes: what
    a row holds that its name does not say (a loop rate over only some attempts), counted: what
    the per-second rows count (samples, items)}."""
    rows = []
    for name, path, unit, higher in ROWS:
        va, vb = _get(a, path), _get(b, path)
        rows.append(
            {
                "metric": name,
                "a": va,
                "b": vb,
                "ratio": ratio(va, vb),
                "unit": unit,
                "higher_is_better": higher,
            }
        )
    notes = [
        f"{side}: {note}"
        for side, report in (("A", a), ("B", b))
        if (note := (report.get("throughput") or {}).get("loop_note"))
    ]
    units = [(r.get("throughput") or {}).get("unit") for r in (a, b)]
    if units[0] != units[1] and all(units):
        notes.append(f"A counts {units[0]}, B {units[1]}: the per-second rows compare different units")
    known = {u for u in units if u}
    return {
        "a": a.get("run"),
        "b": b.get("run"),
        "rows": rows,
        "notes": notes,
        "counted": known.pop() if len(known) == 1 else "units" if known else "samples",
    }
