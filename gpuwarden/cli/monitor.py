"""`gpuwarden monitor`: live GPU lines and an end-of-window summary with a verdict, no daemon needed."""

from __future__ import annotations

import json
import math
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from gpuwarden.cli.format import gpu_line, host_line, note, print_json
from gpuwarden.cli.gpu_choice import select_gpus
from gpuwarden.core.config.settings import load_settings
from gpuwarden.core.errors import UserError
from gpuwarden.core.monitor import SummaryAccumulator
from gpuwarden.core.telemetry.types import GpuStatic, Tick
from gpuwarden.core.units import gib, num

if TYPE_CHECKING:
    from gpuwarden.core.store.telemetry import TelemetryStore
    from gpuwarden.core.telemetry.sampler import Sampler


def _filter(tick: Tick, uuids: set[str]) -> Tick:
    tick.gpus = [s for s in tick.gpus if s.uuid in uuids]
    if tick.processes is not None:
        tick.processes = [p for p in tick.processes if p.uuid in uuids]
    return tick


def _summary_lines(summary: dict[str, Any]) -> list[str]:
    lines = [f"summary over {summary['duration_s']:.0f} s"]
    for g in summary["gpus"]:
        lines.append(f"[{g['index']}] {g['name']}: {g['verdict']}: {', '.join(g['reasons'])}")
        lines.append(
            f"    utilisation mean {num(g['util_mean'], '.0f', '%')} peak {num(g['util_peak'], '.0f', '%')}"
            f"  memory mean {gib(g['mem_used_mean'])} peak {gib(g['mem_used_peak'])}"
            f" of {gib(g['mem_total'])} GiB"
        )
        power = f"    power mean {num(g['power_mean_w'], '.0f', ' W')}"
        if g["power_pct_mean"] is not None:
            power += f" ({g['power_pct_mean']:.0f} % of {g['power_limit_w']:.0f} W limit)"
        power += f"  energy {num(g['energy_j'], '.0f', ' J')}"
        lines.append(power)
        if g["throttled_s"]:
            why = ", ".join(f"{k} {v:.0f} s" for k, v in sorted(g["throttle_reasons_s"].items()))
            lines.append(f"    throttled {g['throttled_s']:.0f} s ({why})")
    h = summary["host"]
    if h["samples"]:
        lines.append(
            f"host: cpu mean {num(h['cpu_mean'], '.0f', '%')} peak {num(h['cpu_peak'], '.0f', '%')}"
            f"  memory peak {gib(h['mem_used_peak'])}/{gib(h['mem_total'])} GiB"
        )
    return lines


class Seconds(click.FloatRange):
    """A float range that also refuses nan and infinity (every comparison with nan is false, so
    a plain range lets it through)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return number


@click.command()
@click.option("--interval", type=Seconds(min=0.05, max=3600), default=None, help="Seconds between samples.")
@click.option(
    "--duration",
    type=Seconds(min=0, max=10 * 365 * 86_400),
    default=0,
    help="Seconds to watch; 0 = until Ctrl-C.",
)
@click.option("--gpu", "gpu_ids", multiple=True, help="GPU index or UUID (repeatable); default all.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON document (snapshots + summary) at the end."
)
@click.option(
    "--jsonl", "as_jsonl", is_flag=True, help="Stream one JSON object per sample, then the summary."
)
@click.option("--record", is_flag=True, help="Also store the samples in the database (history).")
@click.option("--db", "db_path", type=click.Path(path_type=Path), default=None, help="Database for --record.")
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None, help="Settings file.")
def monitor(
    interval: float | None,
    duration: float,
    gpu_ids: tuple[str, ...],
    as_json: bool,
    as_jsonl: bool,
    record: bool,
    db_path: Path | None,
    config_file: Path | None,
) -> None:
    """Watch GPUs (and the host) live; end with a summary and a verdict per GPU."""
    from gpuwarden.core.telemetry.host import HostReader
    from gpuwarden.core.telemetry.nvml import open_gpu_reader
    from gpuwarden.core.telemetry.sampler import Sampler

    if as_json and as_jsonl:
        raise UserError("--json and --jsonl: pick one")
    if db_path is not None and not record:
        raise UserError("--db is where --record stores the samples: add --record, or leave --db out")
    settings = load_settings(config_file, flags={"sample_interval": interval})
    reader = open_gpu_reader()
    sampler = Sampler(reader, HostReader(), process_interval=settings.process_interval)
    try:
        gpus = select_gpus(sampler.gpus(), gpu_ids)
        if sampler.status:
            note(sampler.status)
        store = _open_store(gpus, db_path or settings.resolve_paths().db) if record else None
        acc = SummaryAccumulator({g.uuid: (g.index, g.name) for g in gpus})
        snapshots: list[dict[str, Any]] = []
        emit = _SampleEmitter(as_json, as_jsonl, {g.uuid: g for g in gpus}, snapshots)
        for tick in _ticks(sampler, {g.uuid for g in gpus}, settings.sample_interval, duration):
            acc.add(tick)
            if store is not None:
                store.write_tick(tick)
            emit(tick)
        out = {
            "status": sampler.status,
            "gpus": [g.to_dict() for g in gpus],
            "summary": acc.summary(),
        }
        _emit_summary(out, snapshots, as_json, as_jsonl)
    finally:
        reader.close()


def _open_store(gpus: list[GpuStatic], db: Path) -> TelemetryStore:
    # Imported here: a plain watch needs no database, so `monitor` without --record never loads it.
    from gpuwarden.core.store.db import open_db
    from gpuwarden.core.store.telemetry import TelemetryStore

    store = TelemetryStore(open_db(db))
    store.upsert_gpus(gpus, time.time())
    return store


def _ticks(sampler: Sampler, uuids: set[str], interval: float, duration: float) -> Iterator[Tick]:
    """Sample on a fixed grid from the start (no drift from slow ticks) until `duration` or a signal.

    A stop is only looked at between ticks, so the last sample is whole and the summary still prints.
    """
    stop = _install_stop_handler()
    start = time.monotonic()
    n = 0
    while True:
        yield _filter(sampler.tick(), uuids)
        n += 1
        next_at = start + n * interval
        if duration and next_at - start > duration + 1e-9:
            return
        if stop.wait(max(0.0, next_at - time.monotonic())):
            return


class _SampleEmitter:
    """Shows one tick as the chosen output wants it: kept for --json, streamed for --jsonl, else lines."""

    def __init__(
        self,
        as_json: bool,
        as_jsonl: bool,
        statics: dict[str, GpuStatic],
        snapshots: list[dict[str, Any]],
    ) -> None:
        self._as_json = as_json
        self._as_jsonl = as_jsonl
        self._statics = statics
        self._snapshots = snapshots

    def __call__(self, tick: Tick) -> None:
        if self._as_json:
            self._snapshots.append(_snapshot(tick))
        elif self._as_jsonl:
            sys.stdout.write(json.dumps({"type": "sample", **_snapshot(tick)}, default=str) + "\n")
            sys.stdout.flush()
        else:
            for s in tick.gpus:
                click.echo(gpu_line(self._statics.get(s.uuid), s))
            if tick.host is not None:
                click.echo(host_line(tick.host))


def _emit_summary(
    out: dict[str, Any], snapshots: list[dict[str, Any]], as_json: bool, as_jsonl: bool
) -> None:
    if as_json:
        out["samples"] = snapshots
        print_json(out)
    elif as_jsonl:
        sys.stdout.write(json.dumps({"type": "summary", **out}, default=str) + "\n")
    else:
        click.echo("")
        for line in _summary_lines(out["summary"]):
            click.echo(line)


def _snapshot(tick: Tick) -> dict[str, Any]:
    return {
        "ts": tick.ts,
        "gpus": [s.to_dict() for s in tick.gpus],
        "host": tick.host.to_dict() if tick.host else None,
        "processes": [p.to_dict() for p in tick.processes] if tick.processes is not None else None,
    }


class _Stop:
    """Set by SIGINT/SIGTERM so the loop ends at a tick boundary and still prints the summary."""

    def __init__(self) -> None:
        import threading

        self._event = threading.Event()

    def set(self, signum: int, frame: FrameType | None) -> None:
        self._event.set()

    def wait(self, seconds: float) -> bool:
        return self._event.wait(seconds)


def _install_stop_handler() -> _Stop:
    stop = _Stop()
    signal.signal(signal.SIGINT, stop.set)
    signal.signal(signal.SIGTERM, stop.set)
    return stop
