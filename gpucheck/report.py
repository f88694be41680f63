"""`gpu-report.json` and `gpu-report.md`: the machine, then every step's status, line and rows.

Running some steps again (`--steps a,b`) replaces those steps in the existing report and keeps
the others, so a check split over several sessions still ends in one report.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from gpucheck.result import StepResult

REPORT_VERSION = 1
_MARK = {"passed": "✅", "failed": "❌", "error": "💥", "timeout": "⏱", "skipped": "–"}
# Row columns in reading order; a step's rows show those they use.
_COLUMNS = (
    "benchmark",
    "check",
    "ours",
    "value",
    "reference",
    "low",
    "high",
    "n",
    "unit",
    "tolerance",
    "target",
    "ok",
)


def merge(
    old: dict[str, Any] | None, machine: dict[str, Any], results: list[StepResult], order: list[str]
) -> dict[str, Any]:
    """The report after `results`: earlier results of other steps kept, in `order`."""
    kept = {s["name"]: s for s in (old or {}).get("steps", []) if isinstance(s, dict) and "name" in s}
    for r in results:
        kept[r.name] = r.to_dict()
    steps = [kept[n] for n in order if n in kept] + [s for n, s in kept.items() if n not in order]
    return {
        "version": REPORT_VERSION,
        "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine,
        "steps": steps,
    }


def load(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("version") == REPORT_VERSION else None


def write(report: dict[str, Any], json_path: Path, md_path: Path) -> None:
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    md_path.write_text(markdown(report))


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _rows_table(rows: list[dict[str, Any]]) -> list[str]:
    columns = [c for c in _COLUMNS if any(c in r for r in rows)]
    out = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        cells = [
            _cell(r.get(c)) if c != "ok" else ("–" if r.get("ok") is None else _cell(r.get("ok")))
            for c in columns
        ]
        out.append("| " + " | ".join(cells) + " |")
    return out


def markdown(report: dict[str, Any]) -> str:
    m = report.get("machine", {})
    gpus = m.get("gpus") or []
    cards = (
        ", ".join(f"{g.get('name')} ({(g.get('memory_total') or 0) / 2**30:.0f} GiB)" for g in gpus) or "none"
    )
    lines = [
        "# gpuwarden GPU check",
        "",
        f"{report.get('generated')} on `{m.get('host')}`: {m.get('platform')}, Python {m.get('python')}, "
        f"torch {m.get('torch')} (CUDA {m.get('cuda')}), {m.get('cpus')} CPUs, load {m.get('load')}.",
        f"GPUs: {cards}"
        + (f"; driver {gpus[0].get('driver_version')}" if gpus else f" ({m.get('gpu_status')})"),
        "",
        "| step | status | summary | seconds |",
        "|---|---|---|---|",
    ]
    for s in report.get("steps", []):
        mark = _MARK.get(s.get("status", ""), "")
        summary, seconds = _cell(s.get("summary")), _cell(s.get("seconds"))
        lines.append(f"| {s['name']} | {mark} {s.get('status')} | {summary} | {seconds} |")
    for s in report.get("steps", []):
        if not s.get("rows") and not s.get("notes"):
            continue
        lines += ["", f"## {s['name']}", ""]
        if s.get("rows"):
            lines += _rows_table(s["rows"])
        lines += [""] + [f"- {n}" for n in s.get("notes", [])] if s.get("notes") else []
    return "\n".join(lines) + "\n"
