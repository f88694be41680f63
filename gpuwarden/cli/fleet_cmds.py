"""`ps`, `gpus` and `history` across hosts (`--host HOST…`, `--all-hosts`).

With several hosts a table gets a HOST column; a host that could not answer gets one line in its
place (`host gpu3: ssh: connect timed out`) and the command exits 1 once everything is printed.
`--json` prints one document: `{"hosts": [{"host": NAME, …what the command prints for one
daemon…}, {"host": NAME, "error": LINE, "code": CODE}]}`, in the order the hosts were named.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import click

from gpuwarden.cli.fleet_option import fleet
from gpuwarden.cli.format import print_json
from gpuwarden.client import ApiClient
from gpuwarden.client.fleet_view import FleetGpu, read_gpus
from gpuwarden.client.hosts import HostAnswer
from gpuwarden.core.api import RunSummary
from gpuwarden.core.units import MISSING, size

T = TypeVar("T")


def _ask(names: list[str], fn: Callable[[ApiClient], T]) -> list[HostAnswer[T]]:
    with fleet(names) as hosts:
        return hosts.each(fn)


def _json(answers: list[HostAnswer[Any]], document: Callable[[Any], dict[str, Any]]) -> None:
    print_json(
        {
            "hosts": [
                {"host": a.host, **(document(a.value) if a.ok else {"error": a.error, "code": a.code})}
                for a in answers
            ]
        }
    )


def _failed_line(answer: HostAnswer[Any]) -> str:
    return f"host {answer.host}: {answer.error}"


def _exit_for(answers: list[HostAnswer[Any]]) -> None:
    """Status 1 when a host could not answer: a script sees the table is not whole."""
    if not all(a.ok for a in answers):
        sys.exit(1)


def fleet_ps(names: list[str], show_all: bool, as_json: bool) -> None:
    from gpuwarden.cli.runs_cmds import ps_lines, shown_runs

    answers = _ask(names, lambda c: shown_runs(c.runs(), show_all))
    if as_json:
        _json(answers, lambda shown: {"runs": shown[0], "hidden_finished": shown[1]})
        _exit_for(answers)
        return
    runs: list[RunSummary] = []
    owners: list[str] = []
    for answer in answers:
        if answer.ok and answer.value is not None:
            runs += answer.value[0]
            owners += [answer.host] * len(answer.value[0])
    for line in ps_lines(runs, hosts=owners if len(names) > 1 else None):
        click.echo(line)
    for answer in answers:
        if not answer.ok:
            click.echo(_failed_line(answer))
        elif answer.value is not None and answer.value[1]:
            click.echo(
                f"{answer.host}: … and {answer.value[1]} older finished run(s) — `--all` lists every run"
            )
    _exit_for(answers)


def fleet_gpus(names: list[str], as_json: bool) -> None:
    answers = _ask_gpus(names)
    if as_json:
        _json(answers, lambda rows: {"gpus": [r.model_dump(mode="json") for r in rows]})
        _exit_for(answers)
        return
    for line in gpu_table(answers):
        click.echo(line)
    _exit_for(answers)


def _ask_gpus(names: list[str]) -> list[HostAnswer[list[FleetGpu]]]:
    with fleet(names) as hosts:
        return hosts.each_named(read_gpus)


def gpu_table(answers: list[HostAnswer[list[FleetGpu]]]) -> Iterator[str]:
    """Each host's GPUs under one header (fits 80 columns), or the line saying why it has none."""
    yield f"{'HOST':<12} {'GPU':>3}  {'NAME':<22} {'FREE':>9} {'UTIL':>5} {'POWER':>7}  RUN"
    for answer in answers:
        if not answer.ok:
            yield _failed_line(answer)
            continue
        if not answer.value:
            yield f"{answer.host[:12]:<12} no GPUs"
        for row in answer.value or []:
            yield gpu_row(row)


def gpu_row(row: FleetGpu) -> str:
    if row.lost:
        return f"{row.host[:12]:<12} {row.index:>3}  {row.name[:22]:<22} LOST (not answering NVML)"
    util = MISSING if row.util is None else f"{row.util:.0f}%"
    power = MISSING if row.power_w is None else f"{row.power_w:.0f} W"
    runs = ",".join(row.runs) or "-"
    return (
        f"{row.host[:12]:<12} {row.index:>3}  {row.name[:22]:<22} {size(row.mem_free):>9}"
        f" {util:>5} {power:>7}  {runs}"
    )


def fleet_history(names: list[str], read: Callable[[ApiClient], Any], window: str, as_json: bool) -> None:
    from gpuwarden.cli.runs_cmds import history_lines

    answers = _ask(names, read)
    if as_json:
        _json(answers, lambda reading: reading.result.model_dump(mode="json"))
        _exit_for(answers)
        return
    for answer in answers:
        if not answer.ok:
            click.echo(_failed_line(answer))
            continue
        assert answer.value is not None
        click.echo(f"host {answer.host}:")
        for line in history_lines(window, answer.value):
            click.echo(f"  {line}")
    _exit_for(answers)
