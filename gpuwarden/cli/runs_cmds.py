"""`gpuwarden ps | run | show | stop | resume | logs | events | rm`: runs through the daemon's API.

RUN is a run id, a run name (its newest run), or a unique prefix of either (a prefix of one name
only reads as that name).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from gpuwarden.cli.command_spec import (
    command_document,
    command_options,
    completed_document,
    flags_given,
    in_flag_words,
    printable_spec,
)
from gpuwarden.cli.fleet_option import (
    chosen_hosts,
    history_hosts_option,
    host_field,
    hosts_option,
    reading_run,
)
from gpuwarden.cli.format import print_json
from gpuwarden.cli.run_source import daemon_client, reading, runs_option
from gpuwarden.cli.table import Column, output_width, table_lines
from gpuwarden.core.errors import UserError
from gpuwarden.core.run_state import FINAL_STATES, RunState

# What only some commands use loads when they run: `gpuwarden ps` is typed often and should answer
# at once, not after loading the spec reader, the log follower and the event formatter.
if TYPE_CHECKING:
    from gpuwarden.client import ApiClient
    from gpuwarden.client.reader import LogReader, RunReader
    from gpuwarden.core.api import GpuInfo, HistoryAnswer, LogChunk, RunDetail, RunEvent, RunSummary

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON (and nothing else) on stdout.")
SPEC_SUFFIXES = (".yaml", ".yml", ".json")
SHOWN_FINISHED = 20  # finished runs `ps` lists without --all, newest first
WIDE = 120  # columns from which `ps` shows creation times whole


def _when(ts: float | None, compact: bool = False) -> str:
    """A time as the table shows it; `compact` (a narrow terminal) leaves the year and seconds
    to the message's room."""
    form = "%m-%d %H:%M" if compact else "%Y-%m-%d %H:%M:%S"
    return "-" if ts is None else dt.datetime.fromtimestamp(ts).strftime(form)


@click.command()
@click.option("--all", "show_all", is_flag=True, help="Every finished run (default: the newest 20 of them).")
@runs_option
@hosts_option
@json_option
def ps(show_all: bool, runs_dir: Path | None, hosts: tuple[str, ...], all_hosts: bool, as_json: bool) -> None:
    """List runs: id, name, state, attempt, when created, message."""
    if hosts or all_hosts:
        from gpuwarden.cli.fleet_cmds import fleet_ps

        if runs_dir is not None:
            raise UserError("--runs reads run folders here and --host the daemons there: give one of them")
        fleet_ps(chosen_hosts(hosts, all_hosts), show_all, as_json)
        return
    with reading(runs_dir) as client:
        runs = client.runs()
    jobs: dict[str, str] = {}
    if runs_dir is not None:
        from gpuwarden.cli.slurm_view import slurm_jobs

        runs, jobs = slurm_jobs(runs_dir, runs)
    runs, hidden = shown_runs(runs, show_all)
    if as_json:
        print_json({"runs": runs, "hidden_finished": hidden, **({"slurm_jobs": jobs} if jobs else {})})
        return
    if not runs:
        click.echo("no runs — submit one with `gpuwarden run SPEC.yaml`")
        return
    for line in ps_lines(runs, jobs):
        click.echo(line)
    if hidden:
        click.echo(f"… and {hidden} older finished run(s) — gpuwarden ps --all lists every run")


def shown_runs(runs: list[RunSummary], show_all: bool) -> tuple[list[RunSummary], int]:
    """The runs `ps` lists (the active ones, then the newest finished ones) and how many it hides."""
    if show_all:
        return runs, 0
    active = [r for r in runs if r.state not in FINAL_STATES]
    done = [r for r in runs if r.state in FINAL_STATES]
    return active + done[:SHOWN_FINISHED], max(0, len(done) - SHOWN_FINISHED)


def ps_lines(
    runs: Sequence[RunSummary], jobs: dict[str, str] | None = None, hosts: Sequence[str] | None = None
) -> list[str]:
    """`ps`'s table fitted to the terminal: a column for each run's Slurm job when `jobs` has
    any, and for its host when `hosts` (one name per run) is given."""
    columns = [Column("HOST", "name")] if hosts is not None else []
    columns += [Column("ID"), Column("NAME", "name"), Column("STATE"), Column("ATT", align=">")]
    columns += [Column("CREATED"), *([Column("SLURM JOB")] if jobs else []), Column("MESSAGE", "rest")]
    width = output_width()
    compact = width is not None and width < WIDE
    rows = [
        ([hosts[i]] if hosts is not None else [])
        + [r.id, r.name, str(r.state), str(r.attempt), _when(r.created_at, compact)]
        + ([jobs.get(r.id, "-")] if jobs else [])
        + [" ".join((r.message or "").split())]
        for i, r in enumerate(runs)
    ]
    return table_lines(columns, rows, width)


@click.command("run")
@click.argument("words", nargs=-1, metavar="SPEC.yaml | -- CMD [ARGS]...")
@click.option("-f", "--follow", is_flag=True, help="Stream state, events and output until the run ends.")
@click.option(
    "--no-check-inputs",
    "no_check_inputs",
    is_flag=True,
    help="Queue it even if its model, data or cwd is missing (an earlier run creates them).",
)
@command_options
@json_option
def run_cmd(words: tuple[str, ...], follow: bool, no_check_inputs: bool, as_json: bool, **flags: Any) -> None:
    """Submit SPEC.yaml, or supervise your own program: `gpuwarden run [OPTIONS] -- CMD ARGS…`.

    A spec's relative paths start from its directory. A command runs in the current directory;
    the options build the spec a file would (--print-spec shows it, to save and edit). Either
    runs with this shell's environment (PATH, virtualenv, variables), stored with the run.
    """
    if not words:
        raise UserError(
            "give a spec file (gpuwarden run SPEC.yaml) or a command (gpuwarden run -- CMD ARGS…)"
        )
    from gpuwarden.core.config.yamlsource import read_yaml_text
    from gpuwarden.core.safeload import SPEC_FILE_LIMITS

    is_spec = spec_given(words, flags)
    with contextlib.ExitStack() as stack:
        if is_spec:
            spec_file = Path(words[0])
            text = read_yaml_text(spec_file, SPEC_FILE_LIMITS)
            client = stack.enter_context(daemon_client())
            run = client.submit_yaml(
                text,
                spec_file.resolve().parent,
                label=str(spec_file),
                check_inputs=not no_check_inputs,
                environment=os.environ,
            )
        else:
            document = command_document(list(words), Path.cwd(), **flags)
            if flags["print_spec"]:
                if as_json:
                    print_json(completed_document(document))
                else:
                    click.echo(printable_spec(document), nl=False)
                return
            client = stack.enter_context(daemon_client())
            run = _submit_flags(client, document)
        if not follow:
            _say_warnings(client, run.id)
            if as_json:
                print_json(run)
            else:
                click.echo(f"{run.id}  {run.name}  {run.state}  (run dir {run.run_dir})")
            return
        if not as_json:
            click.echo(f"{run.id}  {run.name}  submitted", err=True)
        try:
            with _while_following(run.id):
                final = follow_run(client, run.id, as_json)
        except KeyboardInterrupt:
            # Ctrl-C leaves the run to the daemon, as `docker logs -f` leaves its container.
            click.echo(
                f"\nstopped following {run.id}; the run goes on — `gpuwarden stop {run.id}` stops it",
                err=True,
            )
            sys.exit(130)
    if as_json:
        print_json(final)
    sys.exit(0 if final.state == "succeeded" else 1)


def _submit_flags(client: ApiClient, document: dict[str, Any]) -> RunDetail:
    """Submit the spec the flags built; the daemon's problems with it name the flags typed, not
    the spec's keys."""
    try:
        return client.submit(document, environment=os.environ)
    except UserError as exc:
        raise UserError(in_flag_words(exc.message, "spec"), code=exc.code) from None


def _say_warnings(client: ApiClient, run_id: str) -> None:
    """What the submit found worth a warning (a run that would restart from the beginning …), on
    stderr: without --follow nothing else prints the run's events."""
    for event in client.events(run_id, since=0, limit=100).events:
        message = (event.model_extra or {}).get("message")
        if event.type == "warning" and event.attempt is None and message:
            click.echo(f"warning: {message}", err=True)


def spec_given(words: tuple[str, ...], flags: dict[str, Any], command: str = "run") -> bool:
    """Whether the words name one spec file (else they are a command). A spec file's name first
    with more words or command options is a mistake, not a program called `spec.yaml`: a shell
    glob that matched several specs, or options that only build a command run's spec."""
    if not words[0].endswith(SPEC_SUFFIXES) or shutil.which(words[0]) is not None:
        return len(words) == 1 and not flags_given(flags) and _names_a_spec(words[0], command)
    if len(words) > 1:
        raise UserError(
            f"one spec file at a time: gpuwarden {command} {words[0]} (got {len(words)} arguments; "
            f"a command goes after `--`: gpuwarden {command} -- CMD ARGS…)"
        )
    if flags_given(flags):
        given = ", ".join("--" + k.replace("_", "-") for k, v in flags.items() if v not in (None, (), False))
        raise UserError(
            f"{given}: only for your own program (gpuwarden {command} [OPTIONS] -- CMD ARGS…); "
            f"{words[0]} carries its own settings — edit the file instead"
        )
    return True


def _names_a_spec(word: str, command: str = "run") -> bool:
    """Whether a lone argument is a spec file rather than a program to run (click drops the `--`
    that would tell them apart). A path that is no program is read as a spec, so the reader says
    in one line what is wrong with it (a folder, a device, too large, …)."""
    if word.endswith(SPEC_SUFFIXES):
        return True
    if shutil.which(word) is not None:
        return False
    if word.endswith(".py"):
        raise UserError(f"{word} is a Python script: run it with `gpuwarden {command} -- python {word}`")
    if Path(word).exists():
        return True
    raise UserError(
        f"{word}: no such spec file or program — give a spec (gpuwarden {command} SPEC.yaml) "
        f"or a command (gpuwarden {command} -- CMD ARGS…)"
    )


@contextlib.contextmanager
def _while_following(run: str) -> Iterator[None]:
    """A daemon that stops under a follower (`gpuwarden down`, a restart) leaves its runs going:
    say that, rather than that no daemon runs, which reads as if the run had died with it."""
    try:
        yield
    except UserError as exc:
        if exc.code not in ("not_running", "transport"):
            raise
        raise UserError(
            f"the daemon stopped while following {run}; the run goes on — "
            f"`gpuwarden up`, then `gpuwarden logs -f {run}`",
            code=exc.code,
        ) from None


def follow_run(
    client: RunReader,
    run_id: str,
    as_json: bool,
    since: int = 0,
    printed: dict[tuple[int, str], int] | None = None,
    first_attempt: int = 1,
) -> RunDetail:
    """Print events after `since` and stdout/stderr as they come (long-polls); the run's final
    detail. From the daemon, or from a run folder (`gpuwarden exec`). `printed`: how much of each
    (attempt, stream) is printed already (an exec taking a run up again); output of attempts before
    `first_attempt` is not printed (a resumed run's earlier attempts)."""
    from gpuwarden.cli.event_lines import event_line

    offsets: dict[tuple[int, str], int] = dict(printed or {})
    while True:
        batch = client.events(run_id, since=since, wait=1.0)
        for event in batch.events:
            if as_json or event.type == "progress_bar":  # the program's own bar is printed as it drew it
                continue
            if _ends_an_attempt(event):
                # What the attempt wrote came before its end: said first, not after the end's line
                # (and not what a next attempt has written already).
                detail = client.run(run_id)
                _print_new_output(client, run_id, detail, offsets, as_json, first_attempt, upto=event.attempt)
            click.echo(event_line(event, with_message=False), err=True)
        since = batch.next_since
        detail = client.run(run_id)
        _print_new_output(client, run_id, detail, offsets, as_json, first_attempt)
        if detail.state in FINAL_STATES:
            more = client.events(run_id, since=since)
            for event in more.events:
                if not as_json and event.type != "progress_bar":
                    click.echo(event_line(event, with_message=False), err=True)
            _print_new_output(client, run_id, detail, offsets, as_json, first_attempt)
            if not as_json:
                click.echo(f"{run_id}: {detail.state} — {detail.message or ''}", err=True)
            return detail


def _ends_an_attempt(event: RunEvent) -> bool:
    """An out-of-memory, or a move out of starting/running (to retuning or an end)."""
    if event.type == "oom":
        return True
    state = (event.model_extra or {}).get("state") if event.type == "state" else None
    return state is not None and state not in (RunState.STARTING, RunState.RUNNING, RunState.QUEUED)


def printed_so_far(client: RunReader, run_id: str) -> dict[tuple[int, str], int]:
    """How long each attempt's output is now: what following from here leaves out."""
    sizes: dict[tuple[int, str], int] = {}
    for attempt in client.run(run_id).attempts:
        for stream in ("stdout", "stderr"):
            sizes[(attempt.attempt, stream)] = client.logs(run_id, stream, attempt.attempt, 0, 1).size
    return sizes


STREAMS = ("stdout", "stderr")
FOLLOW_HELD = 1 << 20  # a stream's output held for ordering per poll; the rest comes next poll


def _print_new_output(
    client: RunReader,
    run_id: str,
    detail: RunDetail,
    offsets: dict[tuple[int, str], int],
    as_json: bool,
    first: int = 1,
    upto: int | None = None,
) -> None:
    """Each attempt's new stdout and stderr from attempt `first` on (with `upto`, of the attempts up
    to that one). The two are separate files, so which came first is known only as far as their
    last writes: the stream written to less recently prints first (a script's printed steps before
    the traceback after them)."""
    numbers = [
        a.attempt for a in detail.attempts if a.attempt >= first and (upto is None or a.attempt <= upto)
    ]
    print_attempts_output(client, run_id, numbers, offsets, as_json)


def print_attempts_output(
    client: LogReader, run_id: str, attempts: list[int], offsets: dict[tuple[int, str], int], as_json: bool
) -> None:
    """What `attempts` wrote since `offsets`, each attempt's two streams in the order written."""
    for attempt in attempts:
        new = _read_both(client, run_id, attempt, offsets)
        new.sort(key=lambda got: got[2])
        for stream, data, _ in new:
            if data and not as_json:
                out = sys.stdout if stream == "stdout" else sys.stderr
                out.write(data)
                out.flush()


def _read_both(
    client: LogReader, run_id: str, attempt: int, offsets: dict[tuple[int, str], int]
) -> list[tuple[str, str, float]]:
    """An attempt's new stdout and stderr. The two are read one after the other, so the program
    may write to the first while the second is read (a line on stdout, then its traceback): the
    first read found nothing, the second found the traceback. Read both again until a pass brings
    nothing, so what was written before the last read is held with it."""
    got = {name: _new_output(client, run_id, attempt, name, offsets) for name in STREAMS}
    for _ in range(3):
        more = {name: _new_output(client, run_id, attempt, name, offsets) for name in STREAMS}
        if not any(data for _, data, _ in more.values()):
            break
        for name, (_, data, modified) in more.items():
            if data:
                got[name] = (name, got[name][1] + data, modified)
    return list(got.values())


def _new_output(
    client: LogReader, run_id: str, attempt: int, stream: str, offsets: dict[tuple[int, str], int]
) -> tuple[str, str, float]:
    """(stream, what it got since it was last read, when it was last written)."""
    key = (attempt, stream)
    offset, data, modified = offsets.get(key, 0), "", 0.0
    while True:
        chunk = client.logs(run_id, stream=stream, attempt=attempt, offset=offset)
        data += chunk.data
        modified = chunk.modified or modified
        offset = chunk.next_offset
        if not chunk.data or chunk.next_offset >= chunk.size or len(data) >= FOLLOW_HELD:
            break
    offsets[key] = offset
    return stream, data, modified


@click.command()
@click.argument("run")
@click.option(
    "--grace", type=click.FloatRange(0, 3600), default=None, help="Seconds between SIGTERM and SIGKILL."
)
@click.option("--wait/--no-wait", default=True, help="Wait until the run has stopped.")
@json_option
def stop(run: str, grace: float | None, wait: bool, as_json: bool) -> None:
    """Stop a run: SIGTERM to its process group, SIGKILL after the grace period."""
    with daemon_client() as client:
        detail = client.stop(run, grace)
        while wait and detail.state not in FINAL_STATES:
            time.sleep(0.2)
            detail = client.run(detail.id)
    if as_json:
        print_json(detail)
    else:
        click.echo(f"{detail.id}  {detail.state} — {detail.message or ''}")


@click.command()
@click.argument("run")
@click.option("-f", "--follow", is_flag=True, help="Stream state, events and output until the run ends.")
@json_option
def resume(run: str, follow: bool, as_json: bool) -> None:
    """Queue a new attempt of a failed, stopped or interrupted run."""
    with daemon_client() as client:
        since = _events_end(client, run) if follow else 0
        # Counted before asking: the new attempt may have started by the time the resume answers.
        first = max((a.attempt for a in client.run(run).attempts), default=0) + 1 if follow else 1
        detail = client.resume(run)
        if follow:
            if not as_json:
                click.echo(f"{detail.id}  {detail.name}  resumed", err=True)
            # What the earlier attempts said is in `logs` and `events`: follow what comes now.
            detail = follow_run(client, detail.id, as_json, since=since, first_attempt=first)
    if as_json:
        print_json(detail)
    elif not follow:
        click.echo(f"{detail.id}  {detail.state} — {detail.message or ''}")
    if follow:
        sys.exit(0 if detail.state == "succeeded" else 1)


def _events_end(client: RunReader, run: str) -> int:
    """Where the run's events end now: a follower started here sees only what comes next."""
    since = 0
    while True:
        page = client.events(run, since=since, limit=10_000)  # the API's largest page: fewest asks
        if not page.events:
            return since
        since = page.next_since


@click.command()
@click.argument("run")
@click.option(
    "-f",
    "--follow",
    is_flag=True,
    help="Keep printing new output until the run ends, through every attempt (with --attempt: that one).",
)
@click.option("--stderr", "use_stderr", is_flag=True, help="Show stderr instead of stdout.")
@click.option("--attempt", type=click.IntRange(1), default=None, help="Attempt number (default: the latest).")
@click.option(
    "--tail", "tail_bytes", type=click.IntRange(1, 1 << 20), default=65536, help="Bytes from the end."
)
@runs_option
@hosts_option
@json_option
def logs(
    run: str,
    follow: bool,
    use_stderr: bool,
    attempt: int | None,
    tail_bytes: int,
    runs_dir: Path | None,
    hosts: tuple[str, ...],
    all_hosts: bool,
    as_json: bool,
) -> None:
    """Print a run's output (the end of it; with -f, then new output as it comes, through every
    attempt until the run ends, each new attempt announced on stderr)."""
    from gpuwarden.cli.log_follow import follow_logs

    stream = "stderr" if use_stderr else "stdout"
    with reading_run(runs_dir, chosen_hosts(hosts, all_hosts), run) as client:
        chunk = client.logs(run, stream=stream, attempt=attempt, offset=-tail_bytes, limit=tail_bytes)
        if as_json and not follow:
            print_json({**host_field(client), **chunk.model_dump(mode="json")})
            return
        collected: list[LogChunk] = [chunk]

        def show(piece: LogChunk) -> None:
            if not as_json:
                click.echo(piece.data, nl=False)

        show(chunk)
        if not (follow or as_json or use_stderr) and chunk.attempt:
            _say_stderr_too(client, run, chunk.attempt)
        if not (follow or as_json) and attempt is None and chunk.attempt and chunk.attempt > 1:
            _say_earlier_attempts(run, chunk.attempt)
        if follow:
            with _while_following(run):
                collected += follow_logs(client, run, stream, chunk, every_attempt=attempt is None, show=show)
    if as_json:
        print_json(
            {
                **host_field(client),
                "data": "".join(c.data for c in collected),
                "offset": collected[0].offset,
                "next_offset": collected[-1].next_offset,
                "eof": collected[-1].eof,
                "overflow": collected[0].overflow,
                "attempt": collected[0].attempt,
                "attempts": sorted({c.attempt for c in collected if c.attempt}),
                "stream": stream,
            }
        )


def _say_earlier_attempts(run: str, latest: int) -> None:
    """Only the latest attempt's output is printed: a reader looking for why an earlier one
    ended (an out-of-memory's traceback) is told it is elsewhere, and how to see it."""
    import shlex

    earlier = "the one before" if latest == 2 else f"the ones before (1–{latest - 1})"
    again = shlex.join(["gpuwarden", *sys.argv[1:], "--attempt", str(latest - 1)])
    click.echo(f"gpuwarden: {run}: attempt {latest}'s output; {earlier}: {again}", err=True)


def _say_stderr_too(client: LogReader, run: str, attempt: int) -> None:
    """A program's traceback and warnings go to stderr, which `logs` leaves out unless asked: a
    reader of stdout is told, on stderr, that there is more and the command that shows it."""
    import shlex

    from gpuwarden.core.units import size

    written = client.logs(run, stream="stderr", attempt=attempt, offset=0, limit=1).size
    if written:
        again = shlex.join(["gpuwarden", *sys.argv[1:], "--stderr"])
        click.echo(f"gpuwarden: attempt {attempt} also wrote {size(written)} to stderr: {again}", err=True)


@click.command()
@click.argument("run")
@click.option("--since", type=click.IntRange(0), default=0, help="Only events with a larger id.")
@runs_option
@json_option
def events(run: str, since: int, runs_dir: Path | None, as_json: bool) -> None:
    """A run's events: state changes, runner events, daemon notes."""
    from gpuwarden.cli.event_lines import event_line

    rows: list[RunEvent] = []
    with reading(runs_dir) as client:
        while True:
            batch = client.events(run, since=since, limit=1000)
            rows.extend(batch.events)
            if len(batch.events) < 1000:
                break
            since = batch.next_since
    if as_json:
        print_json({"events": rows})
        return
    for event in rows:
        click.echo(event_line(event))


@click.command()
@click.argument("runs", nargs=-1, required=True)
@json_option
def rm(runs: tuple[str, ...], as_json: bool) -> None:
    """Forget finished runs and delete their directories."""
    deleted = []
    with daemon_client() as client:
        for ref in runs:
            deleted.append(client.delete(ref).deleted)
    if as_json:
        print_json({"deleted": deleted})
    else:
        for run_id in deleted:
            click.echo(f"removed {run_id}")


@click.command()
@click.option("--window", default="1h", show_default=True, help="How far back: 15m, 1h, 24h, 7d…")
@click.option(
    "--metric",
    "metrics",
    multiple=True,
    help="Metric name (repeatable); default util_gpu, mem_used (with --host: cpu_percent, mem_used).",
)
@click.option("--gpu", "gpus", multiple=True, help="GPU index or UUID (repeatable); default all.")
@click.option("--host", is_flag=True, help="The host's CPU, memory and load instead of the GPUs.")
@click.option("--points", type=click.IntRange(1, 5000), default=60, show_default=True, help="Buckets.")
@history_hosts_option
@json_option
def history(
    window: str,
    metrics: tuple[str, ...],
    gpus: tuple[str, ...],
    host: bool,
    points: int,
    hosts: tuple[str, ...],
    all_hosts: bool,
    as_json: bool,
) -> None:
    """Metric history from the daemon's store: per series its last, mean, min and max."""
    if host and gpus:
        raise UserError("--gpu selects GPUs and --host the host: use one of them")

    def read(client: ApiClient) -> HistoryReading:
        return read_history(client, window=window, metrics=metrics, gpus=gpus, host=host, points=points)

    names = chosen_hosts(hosts, all_hosts)
    if names:
        from gpuwarden.cli.fleet_cmds import fleet_history

        fleet_history(names, read, window, as_json)
        return
    with daemon_client() as client:
        reading = read(client)
    if as_json:
        print_json(reading.result)
        return
    for line in history_lines(window, reading):
        click.echo(line)


@dataclass(frozen=True)
class HistoryReading:
    """What `history` read from one daemon: the series, its GPUs, why it samples none (if so)."""

    result: HistoryAnswer
    statics: dict[str, GpuInfo]
    gpu_status: str | None
    host: bool


def read_history(
    client: ApiClient, *, window: str, metrics: Sequence[str], gpus: Sequence[str], host: bool, points: int
) -> HistoryReading:
    if not host:
        wrong = [m for m in metrics if m in host_only_metrics()]
        if wrong:
            raise UserError(f"{wrong[0]} is a host metric: add --host")
    present = [] if host else client.gpus().gpus
    uuids = _history_gpus(present, gpus)
    result = client.history(window=window, metrics=metrics, gpus=uuids, points=points, host=host)
    gpu_status = None if host else client.health().gpu_status
    return HistoryReading(result, {g.uuid: g for g in present}, gpu_status, host)


def history_lines(window: str, reading: HistoryReading) -> Iterator[str]:
    """Per series: its last, mean, min and max over the window."""
    from gpuwarden.core.units import named

    series = reading.result.series
    if not series:
        if not reading.host and reading.gpu_status:
            yield f"no GPU history: {reading.gpu_status} (add --host for the host's CPU and memory)"
        else:
            yield "no samples in that window"
        return
    yield f"{window.strip()} window, {reading.result.tier} tier, {reading.result.step} s per point"
    for key, by_metric in series.items():
        static = reading.statics.get(key)
        name = "host" if key == "host" else f"GPU {static.index}" if static else key[:16]
        for metric, values in by_metric.items():
            if not values:
                yield f"{name:<8} {metric:<14} no data"
                continue
            # each point is [bucket start, avg, min, max]; the mean weighs every bucket alike
            mean = sum(p[1] for p in values) / len(values)
            low, high = min(p[2] for p in values), max(p[3] for p in values)
            yield (
                f"{name:<8} {metric:<14} last {named(metric, values[-1][1])}  mean {named(metric, mean)}"
                f"  min {named(metric, low)}  max {named(metric, high)}"
                f"  ({len(values)} point{'' if len(values) == 1 else 's'})"
            )


def _history_gpus(present: Sequence[GpuInfo], wanted: Sequence[str]) -> list[str]:
    """UUIDs of the GPUs `wanted` names, by index, UUID or prefix as `--gpu` does everywhere.
    A name no GPU here answers to goes as given: the store knows GPUs gone since, and names the
    ones it knows when it does not know that one either."""
    from gpuwarden.cli.gpu_choice import select_gpus

    here = [w for w in wanted if any(str(g.index) == w or g.uuid.startswith(w) for g in present)]
    return [select_gpus(present, [w])[0].uuid if w in here else w for w in wanted]


def host_only_metrics() -> frozenset[str]:
    """Host metrics that are not also GPU metric names (mem_used and mem_total are both)."""
    from gpuwarden.core.telemetry.types import GPU_METRICS, HOST_METRICS

    return frozenset(HOST_METRICS) - frozenset(GPU_METRICS)
