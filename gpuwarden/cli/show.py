"""`gpuwarden show RUN`: a run's state, attempts, retunes (as sentences), edits and report, in the
units a person reads; `--json` prints the API's run detail as it is."""

from __future__ import annotations

import datetime as dt
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from gpuwarden.cli.event_lines import REPORT_KEYS, edit_text, unit_once
from gpuwarden.cli.fleet_option import chosen_hosts, host_field, hosts_option, reading_run
from gpuwarden.cli.format import print_json
from gpuwarden.cli.run_source import runs_option
from gpuwarden.cli.table import output_width, wrapped
from gpuwarden.client.reader import RunReader
from gpuwarden.core.api import Attempt, RankStatus, RunDetail, RunEvent
from gpuwarden.core.command.record import summary_lines
from gpuwarden.core.events import LEFT_RUNNING_CODE
from gpuwarden.core.oom.explain import oom_phases, retune_sentence
from gpuwarden.core.oom.roles import world_size_of
from gpuwarden.core.progress_bar import bar_sentence, recorded_bar
from gpuwarden.core.units import duration, size

EVENT_PAGE = 1000
PROBE_PHASES = ("started", "running", "ended")
# The report's headline figures, in reading order; energy figures follow whatever they are called.
_REPORT_FIRST = (*REPORT_KEYS, "mem_peak", "loss_first", "loss_last", "device", "dtype", "batch_size")


def when(ts: float | None) -> str:
    return "-" if ts is None else dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _events(client: RunReader, run_id: str) -> list[RunEvent]:
    out: list[RunEvent] = []
    since = 0
    while True:
        page = client.events(run_id, since=since, limit=EVENT_PAGE)
        out += [e for e in page.events if e.type != "progress"]
        if len(page.events) < EVENT_PAGE:
            return out
        since = page.next_since


def energy_keys(report: dict[str, Any]) -> list[str]:
    """Report keys about energy (joules per sample, samples per kWh, …), whatever their names."""
    return [k for k in report if any(w in k.lower() for w in ("joule", "energy", "kwh")) or k.endswith("_j")]


def report_lines(report: dict[str, Any]) -> Iterator[str]:
    for key in (*_REPORT_FIRST, *energy_keys(report)):
        value = report.get(key)
        if value is not None and not isinstance(value, dict | list):
            label, text = unit_once(key, value)
            yield f"{label}: {text}"


def rank_line(rank: RankStatus) -> str:
    """One rank of a gang: process, GPU, last step, memory; the straggler and a failure marked."""
    where = rank.gpu[:12] if rank.gpu else "cpu"
    if rank.mem_peak is not None and rank.gpu:
        memory = f"peak {size(rank.mem_peak)}"
    elif rank.vm_peak is not None:
        memory = f"address space {size(rank.vm_peak)}"
    else:
        memory = f"peak {size(rank.mem_peak)}"
    step = "–" if rank.step is None else f"{rank.step:g}"
    line = f"rank {rank.rank}  pid {rank.pid or '–'}  {where:<12}  step {step:>5}  {memory}"
    if rank.failure:
        line += f"  {rank.failure}"
    if rank.straggler:
        line += f"  ← straggler ({rank.straggler_reason})"
    return line


def attempt_lines(a: Attempt) -> Iterator[str]:
    """One attempt: its outcome and times, then (indented) its restart, what it prepared and its ranks."""
    gpus = ",".join(g[:12] for g in a.gpus) or "cpu"
    took = f" ({duration(a.ended_at - a.started_at)})" if a.ended_at and a.started_at else ""
    pid = a.program_pid or a.pid or "–"  # the program's: a signal to the recorder would do nothing
    peak = f"  peak RSS {size(a.peak_rss)}" if a.peak_rss else ""
    yield (
        f"attempt {a.attempt}: {a.classification or a.state}  pid {pid}  gpus {gpus}"
        f"  {when(a.started_at)} → {when(a.ended_at)}{took}{peak}  {a.reason or ''}"
    ).rstrip()
    if a.restart is not None:
        yield (
            f"    restart {a.restart.restart} of {a.restart.max} after {a.restart.backoff_s:g} s:"
            f" {a.restart.cause}"
        )
    if a.prepared is not None and a.prepared.argv:
        # Flag knobs, and the flags a preset adds, reach the program only through its argv.
        yield f"    command {shlex.join(a.prepared.argv)}"
    for line in summary_lines(a.prepared, a.resumed_from) if a.prepared is not None else []:
        yield f"    {line}"
    if a.resume_warning:
        yield f"    {a.resume_warning}"
    for rank in a.ranks:
        yield f"    {rank_line(rank)}"


def _retune_says(event: RunEvent, phases: tuple[str, ...], *, waits: bool = False) -> str | None:
    """What a retune said in `event` while it decided: a `probe` event of one of `phases`, or
    (`waits`) a `waiting` one."""
    extra = event.model_extra or {}
    message = extra.get("message")
    if not message:
        return None
    if event.type == "probe" and extra.get("phase") in phases:
        return str(message)
    return str(message) if waits and event.type == "waiting" else None


def probe_lines(events: list[RunEvent], attempt: int) -> list[str]:
    """What each probe of the retune after `attempt` measured, one line each."""
    said = (_retune_says(e, ("ended",)) for e in events if e.attempt == attempt)
    return [line for line in said if line is not None]


def retuning_lines(detail: RunDetail, events: list[RunEvent]) -> Iterator[str]:
    """While the retune decides: what it does now (its probe, or what it waits for)."""
    if detail.state != "retuning":
        return
    said = [_retune_says(e, PROBE_PHASES, waits=True) for e in events if e.attempt == detail.attempt]
    latest = [line for line in said if line is not None][-1:]
    if latest:
        yield f"retuning after attempt {detail.attempt}:"
        yield f"    {latest[0]}"


def bar_lines(detail: RunDetail, events: list[RunEvent]) -> Iterator[str]:
    """How far the running attempt has come, by the progress bar the program draws (a program that
    reports its progress itself has none recorded)."""
    if detail.state != "running":
        return
    drawn = [e for e in events if e.type == "progress_bar" and e.attempt == detail.attempt]
    reading = recorded_bar(drawn[-1].model_extra or {}) if drawn else None
    if reading is not None:
        yield f"progress: {bar_sentence(reading)} (its progress bar at {when(drawn[-1].ts)[11:]})"


def warning_lines(events: list[RunEvent]) -> Iterator[str]:
    """The run's own warnings (how a restart would resume, what its script's help said): said at
    submit, or once the help beside the first attempt was read — kept here for whoever looks later;
    and what an attempt left running, which was killed."""
    for e in events:
        extra = e.model_extra or {}
        message = extra.get("message")
        said = e.attempt is None or extra.get("code") == LEFT_RUNNING_CODE
        if e.type == "warning" and said and isinstance(message, str) and message:
            yield f"warning:  {message}"


def detail_lines(detail: RunDetail, events: list[RunEvent]) -> Iterator[str]:
    yield f"{detail.id}  {detail.name}  ({detail.kind})"
    yield f"state:    {detail.state} — {detail.message or ''}"
    yield f"created:  {when(detail.created_at)}   ended: {when(detail.ended_at)}"
    yield f"run dir:  {detail.run_dir}"
    yield from bar_lines(detail, events)
    if detail.effective_batch is not None:
        yield f"effective batch: {detail.effective_batch}"
    yield from warning_lines(events)
    for a in detail.attempts:
        yield from attempt_lines(a)
    phases = oom_phases(events)
    world = world_size_of(detail.spec)
    for r in detail.retunes:
        outcome = f", then {r.outcome}" if r.outcome else ""
        yield f"retune after attempt {r.attempt} ({r.verdict or '?'}{outcome}):"
        yield f"    {retune_sentence(r, phases.get(r.attempt), world)}"
        yield from (f"    {line}" for line in probe_lines(events, r.attempt))
    yield from retuning_lines(detail, events)
    for e in events:
        if e.type == "edited":
            changes = (e.model_extra or {}).get("changes") or {}
            yield f"edited {when(e.ts)}: {edit_text(changes)}"
    if detail.report is not None:
        # A gang's report.json is rank 0's own: said, so it is not read as the gang's whole.
        whose = f" (rank 0 of {world}; `gpuwarden report` covers every rank)" if world > 1 else ""
        yield f"report:   {Path(detail.run_dir) / 'report.json'}{whose}"
        for line in report_lines(detail.report):
            yield f"    {line}"


@click.command()
@click.argument("run")
@runs_option
@hosts_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON (and nothing else) on stdout.")
def show(run: str, runs_dir: Path | None, hosts: tuple[str, ...], all_hosts: bool, as_json: bool) -> None:
    """A run's state, spec, attempts, retunes and report (with --host: on the host that has it)."""
    with reading_run(runs_dir, chosen_hosts(hosts, all_hosts), run) as client:
        detail = client.run(run)
        if as_json:
            print_json({**host_field(client), **detail.model_dump(mode="json")})
            return
        events = _events(client, detail.id)
    if host_field(client):
        click.echo(f"host:     {host_field(client)['host']}")
    width = output_width()
    for line in detail_lines(detail, events):
        for piece in wrapped(line, width):
            click.echo(piece)
