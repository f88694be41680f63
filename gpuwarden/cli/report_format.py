"""Text and Markdown renderings of a run report and of a comparison (no colours: often piped)."""

from __future__ import annotations

from typing import Any

from gpuwarden.core.units import size


def _n(value: Any, fmt: str = ".2f", unit: str = "") -> str:
    if value is None:
        return "n/a"
    if isinstance(value, int | float):
        return f"{value:{fmt}}{unit}"
    return str(value)


def _bytes(value: Any) -> str:
    return "n/a" if value is None else size(value)


def report_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows of the report, in reading order."""
    run, tp = report["run"], report["throughput"]
    unit = tp["unit"]
    kind = " ".join(filter(None, (run["kind"], run.get("task"))))
    rows = [
        ("run", f"{run['name']} ({run['id']}) — {kind}, {run['state']}"),
        ("device", _device(run)),
        ("wall time", f"{_n(report['wall_s'], '.1f', ' s')} over {len(report['attempts'])} attempt(s)"),
        (f"{unit}", _samples_text(tp)),
        (f"{unit}/s", _rate_text(tp)),
        ("tokens/s", _n(tp["tokens_per_s"], ".1f")),
        ("peak memory", _memory_text(report["memory"])),
        ("energy", _energy_text(report["energy"], unit)),
        ("power", _power_text(report["power"])),
        (f"utilisation ({report['utilisation']['metric']})", _utilisation_text(report["utilisation"])),
        ("loss", _loss_text(report["loss"])),
    ]
    return rows


def _device(run: dict[str, Any]) -> str:
    """`cuda:0 (bf16)`, or the device alone where the program did not say its dtype."""
    device, dtype = run.get("device"), run.get("dtype")
    if not device:
        return "n/a"
    return f"{device} ({dtype})" if dtype else str(device)


def _loss_text(loss: dict[str, Any]) -> str:
    if loss["first"] is None and loss["last"] is None:
        return "n/a"
    return f"{_n(loss['first'], '.4f')} → {_n(loss['last'], '.4f')}"


def _rate_text(tp: dict[str, Any]) -> str:
    if tp["samples_per_s"] is None:
        return "n/a"
    text = f"{_n(tp['samples_per_s'])} (loop); {_n(tp['samples_per_s_wall'])} over wall time"
    return text + (f" ({tp['loop_note']})" if tp.get("loop_note") else "")


def _samples_text(tp: dict[str, Any]) -> str:
    if not tp["samples"] and tp["samples_per_s"] is None:
        return "n/a (the run reported no progress)"
    return _n(tp["samples"], "d")


# What the runner's own peak measured, in a user's words (the JSON keeps the field's value).
_PEAK_KIND = {"cuda_allocated": "CUDA memory allocated", "host_rss": "resident memory"}


# A run without GPU readings (on the CPU, or on a card that does not report the value) gets one
# "n/a" for the row, not one for each of its parts.
def _memory_text(mem: dict[str, Any]) -> str:
    runner = mem["runner_peak_bytes"]
    if mem["runner_peak_kind"] == "program_rss" and runner is not None:
        return f"{_bytes(runner)} resident (the program's peak, as the kernel counted it)"
    kind = _PEAK_KIND.get(mem["runner_peak_kind"], mem["runner_peak_kind"])
    runner_text = f"the runner's peak {kind} {_bytes(runner)}" if runner is not None else ""
    if mem["gpu_used_peak_bytes"] is None:
        return runner_text or "n/a"
    text = _bytes(mem["gpu_used_peak_bytes"])
    if mem["capacity_bytes"] is not None:
        text += f" of {_bytes(mem['capacity_bytes'])} ({_n(mem['peak_pct'], '.0f', ' %')})"
    return text + (f"; {runner_text}" if runner_text else "")


def _energy_text(en: dict[str, Any], unit: str) -> str:
    if en["joules"] is None:
        return "n/a"
    text = (
        f"{_n(en['joules'], '.1f', ' J')}; per {unit[:-1]} {_n(en['per_sample_j'], '.4f', ' J')}"
        f" ({_n(en['samples_per_kwh'], ',.0f')} {unit}/kWh)"
    )
    return text + (
        f"; per token {_n(en['per_token_j'], '.6f', ' J')}" if en["per_token_j"] is not None else ""
    )


def _power_text(pw: dict[str, Any]) -> str:
    if pw["mean_w"] is None:
        return "n/a"
    limit = (
        f" ({_n(pw['mean_pct'], '.0f', ' %')} of {_n(pw['limit_w'], '.0f', ' W')})" if pw["limit_w"] else ""
    )
    return (
        f"mean {_n(pw['mean_w'], '.0f', ' W')}{limit}, p50 {_n(pw['p50_w'], '.0f')},"
        f" p90 {_n(pw['p90_w'], '.0f')}, max {_n(pw['max_w'], '.0f')}"
    )


def _utilisation_text(ut: dict[str, Any]) -> str:
    if ut["mean"] is None:
        return "n/a"
    return (
        f"mean {_n(ut['mean'], '.0f', ' %')}, p50 {_n(ut['p50'], '.0f')}, p90 {_n(ut['p90'], '.0f')},"
        f" max {_n(ut['max'], '.0f')}"
    )


def _batch_rows(report: dict[str, Any]) -> list[list[str]]:
    return [
        [size, str(s["steps"]), _n(s["mean_step_s"], ".4f", " s"), _n(s["samples_per_s"])]
        for size, s in report["per_batch_size"].items()
    ]


ATTEMPT_HEADER = ["#", "wall", "outcome", "gpus", "J/sample", "samples/kWh"]


def _attempt_rows(report: dict[str, Any]) -> list[list[str]]:
    energy = {e["attempt"]: e for e in report["energy"].get("per_attempt", [])}
    return [
        [
            str(a["attempt"]),
            _n(a["wall_s"], ".1f", " s"),
            str(a.get("classification") or a.get("state") or ""),
            ", ".join(g[:12] for g in a["gpus"]) or "cpu",
            _n(energy.get(a["attempt"], {}).get("per_sample_j"), ".4f"),
            _n(energy.get(a["attempt"], {}).get("samples_per_kwh"), ",.0f"),
        ]
        for a in report["attempts"]
    ]


def _retune_rows(report: dict[str, Any]) -> list[list[str]]:
    return [
        [
            str(r["attempt"]),
            str(r.get("verdict") or ""),
            change_text(r.get("from") or {}, r.get("to") or {}),
            str(r.get("outcome") or ""),
        ]
        for r in report["retunes"]
    ]


def change_text(before: dict[str, Any], after: dict[str, Any]) -> str:
    """`train.batch_size 32 → 8, train.grad_accum_steps 1 → 4` from a retune's two settings."""
    keys = list(dict.fromkeys([*before, *after]))
    return ", ".join(f"{key} {before.get(key, '–')} → {after.get(key, '–')}" for key in keys)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return out


def render_text(report: dict[str, Any]) -> str:
    rows = report_rows(report)
    width = max(len(label) for label, _ in rows)
    lines = [f"{label:<{width}}  {value}" for label, value in rows]
    if report["per_batch_size"]:
        lines += ["", "per batch size:"]
        lines += [
            "  " + line for line in _table(["batch", "steps", "mean step", "samples/s"], _batch_rows(report))
        ]
    lines += ["", "attempts:"]
    lines += ["  " + line for line in _table(ATTEMPT_HEADER, _attempt_rows(report))]
    if report["retunes"]:
        lines += ["", "retunes:"]
        lines += [
            "  " + line for line in _table(["after", "verdict", "change", "outcome"], _retune_rows(report))
        ]
    return "\n".join(lines)


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return out


def render_markdown(report: dict[str, Any]) -> str:
    run = report["run"]
    lines = [f"# Run report: {run['name']}", ""]
    lines += _md_table(["", ""], [[label, value] for label, value in report_rows(report)])
    if report["per_batch_size"]:
        lines += ["", "## Per batch size", ""]
        lines += _md_table(["batch", "steps", "mean step", "samples/s"], _batch_rows(report))
    lines += ["", "## Attempts", ""]
    lines += _md_table(ATTEMPT_HEADER, _attempt_rows(report))
    if report["retunes"]:
        lines += ["", "## Retunes", ""]
        lines += _md_table(["after attempt", "verdict", "change", "outcome"], _retune_rows(report))
    if report.get("plots"):
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in report["plots"]]
    return "\n".join(lines) + "\n"


# The comparison's rows as a person reads them, the unit in the label (`--json` keeps the keys).
_COMPARED = {
    "samples_per_s": "{counted}/s (loop)",
    "samples_per_s_wall": "{counted}/s over wall time",
    "tokens_per_s": "tokens/s",
    "power_mean_w": "power, mean (W)",
    "power_pct_of_limit": "power, % of its limit",
    "util_mean_pct": "utilisation, mean (%)",
    "memory_peak_bytes": "peak memory",
    "energy_per_sample_j": "energy per {one} (J)",
    "samples_per_kwh": "{counted} per kWh",
    "wall_s": "wall time (s)",
}


def _compared_label(metric: str, counted: str) -> str:
    one = {"samples": "sample", "items": "item", "units": "unit"}.get(counted, counted)
    return _COMPARED.get(metric, metric).format(counted=counted, one=one)


def render_comparison(result: dict[str, Any]) -> str:
    a, b = result["a"] or {}, result["b"] or {}
    header = ["", f"A: {a.get('name')}", f"B: {b.get('name')}", "B/A"]
    rows = []
    counted = str(result.get("counted") or "samples")
    for r in result["rows"]:
        fmt = {"energy_per_sample_j": ".4f", "samples_per_kwh": ",.0f"}.get(r["metric"], ".1f")
        if r["unit"] == "B":
            va, vb = _bytes(r["a"]), _bytes(r["b"])
        else:
            va, vb = _n(r["a"], fmt), _n(r["b"], fmt)
        rows.append([_compared_label(r["metric"], counted), va, vb, _n(r["ratio"], ".2f", "×")])
    return "\n".join(_table(header, rows) + [f"note {n}" for n in result.get("notes", [])])
