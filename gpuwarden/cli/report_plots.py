"""PNG plots of a run's series for `gpuwarden report --plots DIR` (matplotlib, no display)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwarden.core.errors import UserError
from gpuwarden.core.report.performance import util_metric
from gpuwarden.core.report.snapshot import RunSnapshot
from gpuwarden.core.units import GIB


def _t0(snap: RunSnapshot) -> float:
    return min((a.start for a in snap.attempts), default=0.0)


def write_plots(snap: RunSnapshot, folder: Path) -> list[str]:
    """loss.png, throughput.png, memory.png and power_util.png where the run has the data; the
    folder is made only for a run with something to draw (none: [], and no empty folder)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed (SSH sessions, CI)
    import matplotlib.pyplot as plt

    t0 = _t0(snap)
    progress = snap.runner_events("progress")
    figures = [(name, fig) for name, plot in _PLOTS if (fig := plot(plt, snap, t0, progress)) is not None]
    if not figures:
        return []
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        plt.close("all")
        raise UserError(f"{folder}: cannot create the plot folder ({exc.strerror})") from None
    written: list[str] = []
    for name, fig in figures:
        path = folder / name
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(str(path))
    return written


def why_no_plots(snap: RunSnapshot) -> str:
    """One line for a run `write_plots` drew nothing of."""
    if snap.runner_events("progress"):
        return "no plots: the run's progress events carry no loss, rate or memory"
    on_gpu = any(a.gpus for a in snap.attempts)
    return "no plots: the run reported no progress" + (
        " and no GPU telemetry is stored for its attempts" if on_gpu else ""
    )


def _loss(plt: Any, snap: RunSnapshot, t0: float, progress: list[dict[str, Any]]) -> Any:
    losses = [(e["step"], e["loss"]) for e in progress if e.get("loss") is not None]
    if not losses:
        return None
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot([s for s, _ in losses], [v for _, v in losses])
    ax.set(xlabel="step", ylabel="loss", title=f"{snap.run.get('name')}: loss")
    return fig


def _throughput(plt: Any, snap: RunSnapshot, t0: float, progress: list[dict[str, Any]]) -> Any:
    rates = [(e["ts"] - t0, e["samples_per_s"]) for e in progress if e.get("samples_per_s") is not None]
    if not rates:
        return None
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot([t for t, _ in rates], [r for _, r in rates], marker=".")
    unit = "items" if snap.kind == "infer" else "samples"
    ax.set(xlabel="seconds since start", ylabel=f"{unit}/s", title=f"{snap.run.get('name')}: throughput")
    return fig


def _memory(plt: Any, snap: RunSnapshot, t0: float, progress: list[dict[str, Any]]) -> Any:
    mem = [(e["ts"] - t0, e["mem_peak"] / GIB) for e in progress if e.get("mem_peak") is not None]
    used = [(p[0] - t0, p[3] / GIB) for w in snap.gpus for p in w.series.get("mem_used", [])]
    if not (mem or used):
        return None
    fig, ax = plt.subplots(figsize=(8, 4))
    if used:
        ax.plot([t for t, _ in used], [v for _, v in used], label="GPU memory used (NVML)")
    if mem:
        ax.plot([t for t, _ in mem], [v for _, v in mem], marker=".", label="runner's peak")
    ax.set(xlabel="seconds since start", ylabel="GiB", title=f"{snap.run.get('name')}: memory")
    ax.legend()
    return fig


def _power_util(plt: Any, snap: RunSnapshot, t0: float, progress: list[dict[str, Any]]) -> Any:
    power = [(p[0] - t0, p[1]) for w in snap.gpus for p in w.series.get("power_w", [])]
    metric = util_metric(snap)
    util = [(p[0] - t0, p[1]) for w in snap.gpus for p in w.series.get(metric, [])]
    if not (power or util):
        return None
    fig, ax = plt.subplots(figsize=(8, 4))
    if power:
        ax.plot([t for t, _ in power], [v for _, v in power], color="tab:red", label="power (W)")
        ax.set_ylabel("W")
    ax2 = ax.twinx()
    if util:
        ax2.plot([t for t, _ in util], [v for _, v in util], color="tab:blue", label=f"{metric} (%)")
        ax2.set_ylim(0, 105)
        ax2.set_ylabel("%")
    ax.set(xlabel="seconds since start", title=f"{snap.run.get('name')}: power and utilisation")
    fig.legend(loc="lower right")
    return fig


# Each plot builds its figure or returns None when the run lacks its data; the order is the order written.
_PLOTS: list[tuple[str, Callable[[Any, RunSnapshot, float, list[dict[str, Any]]], Any]]] = [
    ("loss.png", _loss),
    ("throughput.png", _throughput),
    ("memory.png", _memory),
    ("power_util.png", _power_util),
]
